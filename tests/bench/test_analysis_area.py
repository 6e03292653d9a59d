"""The analysis area's fixed-cost row and its note, with the timings replaced (no timing is asserted)."""

from __future__ import annotations

import pytest

from headlab.bench import capture as area_module
from headlab.bench.capture import ANALYSIS_GOAL, FIXED_COST
from headlab.bench.timing import Timing
from tests.support.minilm import minilm


@pytest.mark.parametrize(("fixed", "everything", "noted"), [
    (1.50, 1.80, True),  # the fixed cost alone is over 1.30: the note says only fewer ops per batch can help
    (1.10, 1.80, False),  # the miss is in the arithmetic
    (1.50, 1.20, False),  # met
])
def test_the_fixed_cost_row_is_timed_beside_the_goal_and_noted_only_when_it_alone_misses(
        monkeypatch, tiny_plan, fixed, everything, noted):
    called = []

    def timed(fns, **_):
        for name, fn in fns.items():  # each contender really runs once: the fixed-cost one included
            fn()
            called.append(name)
        seconds = {"capture only": 1.0, "all, as analyze runs them": everything, FIXED_COST: fixed}
        return {name: Timing((seconds.get(name, 1.1),)) for name in fns}

    monkeypatch.setattr(area_module, "time_interleaved", timed)
    area = area_module.bench_analysis(tiny_plan, minilm())
    assert FIXED_COST in called
    goal_row, fixed_row = area.rows[-2:]
    assert goal_row.contender == "all, as analyze runs them" and goal_row.goal == ANALYSIS_GOAL
    assert fixed_row.contender == FIXED_COST and fixed_row.peer == "capture only" and fixed_row.goal is None
    assert fixed_row.ratio == pytest.approx(fixed)
    notes = [n for n in area.notes if "fixed cost alone" in n]
    assert len(notes) == noted
    if noted:
        assert f"takes {fixed:.2f}× capture only" in notes[0] and "one-item batches" in notes[0]
