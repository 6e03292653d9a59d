"""The Ray area on a tiny plan: its rows, goal and the identical merged results; skipped with a note
without Ray or on CUDA. No timing is asserted."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from headlab.analysis.analyze import AnalysisAccumulators
from headlab.bench import Area
from headlab.bench.distributed import RAY_GOAL, bench_distributed, max_difference
from tests.support.minilm import minilm


def test_max_difference_is_zero_for_equal_runs_and_sees_one_more_item():
    from headlab.capture import capture

    factory = AnalysisAccumulators(causal=False, row_fraction=0.05)
    texts = ["The cat sat on the mat.", "A dog ran."]
    loaded = minilm()
    runs = []
    for corpus in (texts, texts, texts[:1]):
        runs.append(factory())
        capture(loaded, corpus=corpus, consumers=runs[-1], progress=False)
    assert max_difference(runs[0], runs[1]) == 0.0
    assert 0.0 < max_difference(runs[0], runs[2]) < float("inf")


@pytest.fixture(scope="module")
def area() -> Area:
    pytest.importorskip("ray")
    from tests.support.bench import tiny_plan

    return bench_distributed(tiny_plan(), minilm())


def test_two_workers_against_one_with_identical_merged_results(area: Area) -> None:
    assert area.name == "distributed" and not area.notes
    faster, overhead = area.rows
    assert (faster.contender, faster.peer, faster.goal) == ("Ray, 2 workers × 1 thread", "Ray, 1 worker × 1 thread",
                                                            RAY_GOAL)
    assert faster.details["largest difference, 2 workers vs 1"] == "0 (identical)"
    difference = faster.details["largest difference vs one process"]
    assert difference == "0 (identical)" or float(difference) <= 1e-12
    assert faster.details["speed-up"] == pytest.approx(1 / faster.ratio)
    assert faster.details["tokens/s per worker"] == pytest.approx(faster.tokens_per_s() / 2)
    assert faster.details["peak RSS per worker MiB"] > 100
    assert len(faster.details["busy tokens/s of 1 worker alone"].split(" / ")) == 1
    assert overhead.peer == "one process, 1 torch thread" and overhead.tokens == faster.tokens
    assert "3 items" in area.description and "SurfaceStats" in area.description


def test_without_ray_the_area_says_which_extra(tiny_plan, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    area = bench_distributed(tiny_plan, loaded=None)
    assert not area.rows and area.notes == ["skipped: Ray is not installed (pip install 'headlab[ray]')"]


def test_on_cuda_the_area_is_skipped(tiny_plan):
    area = bench_distributed(dataclasses.replace(tiny_plan, device="cuda"), loaded=None)
    assert not area.rows and "run on CPU" in area.notes[0]
