"""Timing statistics and the interleaved timer: quartiles, validation, call counts and order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from headlab.bench.timing import Timing, quantile, time_interleaved

seconds = st.floats(min_value=1e-6, max_value=10.0, allow_nan=False)


@given(st.lists(seconds, min_size=1, max_size=30), st.floats(min_value=0.0, max_value=1.0))
def test_quantile_is_numpys_linear_quantile(values: list[float], q: float) -> None:
    assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)), rel=1e-12, abs=1e-15)


@given(st.lists(seconds, min_size=1, max_size=30))
def test_timing_statistics_are_ordered_and_spread_is_relative_iqr(samples: list[float]) -> None:
    t = Timing(tuple(samples))
    assert min(samples) <= t.q1 <= t.median <= t.q3 <= max(samples)
    assert t.spread == pytest.approx((t.q3 - t.q1) / t.median)
    assert Timing.from_dict(t.to_dict()) == t


def test_timing_of_odd_samples_has_the_middle_as_median() -> None:
    t = Timing((3.0, 1.0, 2.0, 10.0, 4.0), calls_per_round=7)
    assert (t.median, t.q1, t.q3) == (3.0, 2.0, 4.0)
    assert t.spread == pytest.approx(2 / 3)
    assert t.to_dict()["calls_per_round"] == 7


@pytest.mark.parametrize("bad", [(), (0.0,), (-1.0,), (float("nan"),), (float("inf"),)])
def test_timing_refuses_samples_that_are_not_positive_seconds(bad: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="sample"):
        Timing(bad)


def test_timing_refuses_a_bad_call_count() -> None:
    with pytest.raises(ValueError, match="calls_per_round=0"):
        Timing((1.0,), calls_per_round=0)


def test_quantile_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="no values"):
        quantile([], 0.5)
    with pytest.raises(ValueError, match=r"q=1\.5"):
        quantile([1.0], 1.5)


def test_interleaved_rounds_call_each_function_warmup_sizing_and_rounds_times_in_rotating_order() -> None:
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    result = time_interleaved(fns, rounds=3, min_block_s=1e-12, warmup=2)
    assert list(result) == ["a", "b", "c"]
    assert all(t.calls_per_round == 1 and len(t.samples) == 3 for t in result.values())
    setup, timed = calls[:9], calls[9:]
    assert setup == ["a"] * 3 + ["b"] * 3 + ["c"] * 3  # 2 warm-up calls and 1 sizing call each
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # each round starts one later


def test_blocks_are_sized_to_the_minimum_block_time(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks: list[int] = []

    def clock(fn, calls, device) -> float:  # a function that takes exactly 4 ms per call
        blocks.append(calls)
        return 0.004 * calls

    monkeypatch.setattr("headlab.bench.timing._time_block", clock)
    result = time_interleaved({"f": lambda: None}, rounds=2, min_block_s=0.02, warmup=0)
    assert blocks == [1, 5, 5]  # the sizing call, then 0.02 s / 4 ms = 5 calls per round
    assert result["f"] == Timing((0.004, 0.004), calls_per_round=5)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rounds": 0, "min_block_s": 0.1}, "rounds=0"),
    ({"rounds": 1, "min_block_s": 0.0}, "min_block_s=0.0"),
    ({"rounds": 1, "min_block_s": 0.1, "warmup": -1}, "warmup=-1"),
])
def test_interleaved_refuses_bad_budgets(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        time_interleaved({"f": lambda: None}, **kwargs)


def test_interleaved_needs_a_function() -> None:
    with pytest.raises(ValueError, match="at least one function"):
        time_interleaved({}, rounds=1, min_block_s=0.1)
