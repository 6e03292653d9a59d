"""Spreads over seeds, and when seeds reached a target."""

from __future__ import annotations

import pytest

from headlab.experiments.seeds import Spread, describe_reached, mean_reached, rank_key, seeds_from


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
