"""Spreads over seeds, when seeds reached a target, error bars, and which event came first beyond noise."""

from __future__ import annotations

import pytest

from headlab.experiments.seeds import Gap, Spread, describe_reached, mean_reached, range_bars, rank_key, seeds_from


def test_spread():
    s = Spread.of([1.0, 2.0, 3.0])
    assert (s.mean, s.std, str(s)) == (2.0, 1.0, "2.000 ± 1.000")
    assert Spread.of([0.5]).std == 0.0
    assert s.to_dict() == {"mean": 2.0, "std": 1.0, "values": [1.0, 2.0, 3.0]}
    assert seeds_from(5, 3) == [5, 6, 7]
    with pytest.raises(ValueError, match="at least one value"):
        Spread.of([])


def test_reached():
    assert mean_reached([100, None, 120]) == 110 and mean_reached([None, None]) is None
    assert describe_reached([100, None, 120]) == "110 (2/3)"
    assert describe_reached([None, None, None]) == "never (0/3)"


def test_rank_key_orders_by_accuracy_then_seeds_reaching_then_speed():
    perfect = Spread.of([1.0, 1.0])
    rows = {
        "slow": rank_key(perfect, [200, 180]),
        "fast": rank_key(perfect, [100, 120]),
        "partial": rank_key(perfect, [100, None]),
        "worse": rank_key(Spread.of([0.9, 0.8]), [50, 60]),
        "never": rank_key(perfect, [None, None]),
    }
    assert sorted(rows, key=rows.get) == ["fast", "slow", "partial", "never", "worse"]


def test_range_bars_stay_within_the_values_the_seeds_took():
    spreads = [Spread.of([1.0, 1.0, 0.7]), Spread.of([0.5])]
    assert spreads[0].mean + spreads[0].std > 1.0  # mean ± std would draw a bar above accuracy 1
    below, above = range_bars(spreads)
    assert spreads[0].mean + above[0] == 1.0 and spreads[0].mean - below[0] == pytest.approx(0.7)
    assert (below[1], above[1]) == (0.0, 0.0)


@pytest.mark.parametrize("a, b, first", [
    ([100, 110, 105], [60, 70, 65], "b"),  # b 40 steps earlier in every seed: beyond spread and resolution
    ([60, 70, 65], [100, 110, 105], "a"),
    ([90], [70], None),  # one seed: no spread to compare with
    ([80, 90, 110], [80, 90, 100], None),  # −3 ± 6: within the spread
    ([80, 90, 100], [90, 100, 110], None),  # +10 ± 0: not more than one evaluation interval
    ([80, 90, 100], [80, None, 100], None),  # a seed never saw b
])
def test_gap_names_a_first_event_only_beyond_noise(a, b, first):
    gap = Gap.of(a, b, resolution=10)
    assert gap.first == first
    assert gap.to_dict()["first"] == first


def test_gap_values_and_errors():
    gap = Gap.of([80, 90, 110], [80, 90, 100], resolution=10)
    assert gap.gaps == (0, 0, -10) and str(gap) == "-3 ± 6 steps"
    assert str(Gap.of([1, None], [2, 3], resolution=1)) == "unknown"
    with pytest.raises(ValueError, match="same seeds on both sides; got 2 and 1"):
        Gap.of([1, 2], [3], resolution=1)
