"""Comparisons: ratios, rates, fractions of the ceiling, goals, and the JSON round trip of a run."""

from __future__ import annotations

import pytest

from headlab.bench import Comparison, SuiteResult, Timing
from tests.support.bench import comparison, suite_result


def test_ratio_and_speedup_are_of_medians() -> None:
    row = Comparison("c", "a", "b", Timing((1.0, 3.0, 2.0)), Timing((4.0, 8.0, 5.0)))
    assert row.ratio == pytest.approx(2.0 / 5.0)
    assert row.speedup == pytest.approx(5.0 / 2.0)


def test_rates_and_fraction_of_ceiling() -> None:
    row = comparison(0.5, 1.0, flops=10**9, tokens=100)
    assert row.flops_per_s() == pytest.approx(2e9)
    assert row.flops_per_s("peer") == pytest.approx(1e9)
    assert row.tokens_per_s() == pytest.approx(200.0)
    assert row.tokens_per_s("peer") == pytest.approx(100.0)
    assert row.fraction_of_ceiling(8e9) == pytest.approx(0.25)
    assert comparison(1.0, 1.0).fraction_of_ceiling(1e9) is None
    assert comparison(1.0, 1.0).tokens_per_s() is None


@pytest.mark.parametrize(("contender", "goal", "met"), [(1.0, 1.05, True), (1.06, 1.05, False), (0.85, 0.85, True)])
def test_goal_bounds_the_time_ratio(contender: float, goal: float, met: bool) -> None:
    assert comparison(contender, 1.0, goal=goal).met() is met


def test_a_row_without_goal_has_no_verdict() -> None:
    assert comparison(3.0, 1.0).met() is None


def test_ceiling_goal_needs_the_ceiling_and_combines_with_the_ratio_goal() -> None:
    row = comparison(1.0, 1.0, flops=10**12, goal=1.05, ceiling_goal=0.5)  # 1 TFLOP/s
    assert row.met(1.5e12) is True  # 67% of the ceiling
    assert row.met(3e12) is False  # 33%
    assert row.met(None) is True  # no ceiling known: only the ratio goal counts
    assert comparison(2.0, 1.0, flops=10**12, goal=1.05, ceiling_goal=0.5).met(1e12) is False


def test_a_ceiling_goal_without_flops_is_not_met() -> None:
    assert comparison(1.0, 1.0, ceiling_goal=0.5).met(1e12) is False  # no FLOP count: no fraction of the ceiling


def test_ceilings_rates() -> None:
    c = suite_result().ceilings
    assert c.matmul_flops_per_s == pytest.approx(2 * 100**3 / 1.5e-3)
    assert c.copy_bytes_per_s == pytest.approx(2 * 4096 / 1e-6)


def test_goals_lists_rows_with_a_goal_and_the_verdict() -> None:
    verdicts = [(area, row.contender, met) for area, row, met in suite_result().goals()]
    assert verdicts == [("layer", "headlab", True), ("layer", "headlab", False)]
    assert suite_result().to_dict()["goals"] == {"met": 1, "missed": 1}


def test_suite_result_round_trips_through_its_dict() -> None:
    import json

    run = suite_result()
    document = json.loads(json.dumps(run.to_dict()))
    again = SuiteResult.from_dict(document)
    assert again == run
    assert again.to_dict() == run.to_dict()
    row = document["areas"][0]["rows"][0]
    assert row["ratio"] == pytest.approx(row["contender_time"]["median"] / row["peer_time"]["median"])


def test_from_dict_names_a_document_that_is_not_a_run() -> None:
    with pytest.raises(ValueError, match="not a headlab bench result"):
        SuiteResult.from_dict({"plan": {}})


def test_a_memory_row_compares_bytes_and_has_no_rates() -> None:
    row = Comparison("c", "peak memory of EAP", "peak memory of the peer", Timing((3 * 2**20,)), Timing((2**20,)),
                     goal=2.0, flops=10**9, tokens=100, unit="bytes")
    assert row.ratio == pytest.approx(3.0) and row.met() is False
    assert row.flops_per_s() is None and row.tokens_per_s() is None and row.fraction_of_ceiling(1e9) is None
    assert Comparison.from_dict(row.to_dict()) == row


def test_an_unknown_unit_is_named() -> None:
    with pytest.raises(ValueError, match="unit='MiB'"):
        comparison(1.0, 1.0, unit="MiB")


def test_a_row_stored_before_units_reads_as_seconds() -> None:
    stored = comparison(1.0, 2.0).to_dict()
    del stored["unit"]
    assert Comparison.from_dict(stored).unit == "s"
