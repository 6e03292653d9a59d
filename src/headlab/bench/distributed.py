"""The Ray engine: 2 workers of one thread each against 1 such worker, on the default model.

One engine of 2 workers on a local Ray of 2 CPUs; the 1-worker runs use one of its workers (the
other stays idle). A call is one sharded pass over the corpus with the accumulators of ``headlab
analyze`` (surface statistics, taxonomy, similarity and, with spaCy, syntax; parses made once
before timing): planning, shipping, capture on the workers, merging on the driver. The merged
results of both engines are compared (they must be identical), and one process with one torch
thread runs the same pass as the floor of the engine's own overhead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import time_interleaved

__all__ = ["BATCH_TOKENS", "RAY_GOAL", "bench_distributed", "max_difference"]

RAY_GOAL = 1 / 1.7  # 2 workers' time / 1 worker's time (≥ 1.7× the throughput on a 2-core machine)
# Whole batches are the unit of a shard: at capture's default 4096 tokens the bundled corpus (short
# items) makes only 7 batches, too few to split evenly over 2 workers; at 1024 it makes 13. A
# corpus worth sharding has hundreds of batches at the default.
BATCH_TOKENS = 1024


def max_difference(ours: list[Any], theirs: list[Any]) -> float:
    """The largest absolute difference between two lists of analyze's accumulators' results (0.0: identical)."""
    worst = 0.0
    for a, b in zip(ours, theirs):
        x, y = a.result(), b.result()
        if hasattr(x, "n_sink"):  # a SinkResult: its table and the shares by position
            arrays = [(x.raw, y.raw), (x.counts, y.counts)] + ([] if x.weighted is None else [(x.weighted, y.weighted)])
            worst = max(worst, _table_difference(x.table, y.table), *(_array_difference(p, q) for p, q in arrays))
        elif hasattr(x, "columns"):  # a HeadTable
            worst = max(worst, _table_difference(x, y))
        elif hasattr(x, "distances"):
            worst = max(worst, float(np.abs(x.distances - y.distances).max()))
        elif x.rows() != y.rows():  # syntax: counts
            return float("inf")
    return worst


def _table_difference(x: Any, y: Any) -> float:
    if x.heads != y.heads:
        return float("inf")
    return max((_array_difference(x[column], y[column]) for column in x.columns), default=0.0)


def _array_difference(x: np.ndarray, y: np.ndarray) -> float:
    """Largest absolute difference; inf where NaN sits in different places or the shapes differ."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or not np.array_equal(np.isnan(x), np.isnan(y)):
        return float("inf")
    return float(np.nanmax(np.abs(x - y), initial=0.0))


def _busy_rates(reports: list[Any]) -> list[float]:
    """Tokens per second of each worker over the seconds it spent on its shards, in order of first appearance."""
    busy: dict[str, list[float]] = {}
    for report in reports:
        tokens_seconds = busy.setdefault(report.worker, [0.0, 0.0])
        tokens_seconds[0] += report.shard.tokens
        tokens_seconds[1] += report.seconds
    return [tokens / seconds for tokens, seconds in busy.values()]


def _difference(value: float) -> str:
    """A difference as RESULTS.md shows it: ``"0 (identical)"`` or ``"3.3e-16"``."""
    return "0 (identical)" if value == 0.0 else f"{value:.1e}"


def bench_distributed(plan: Plan, loaded: Any, *, tick: Callable[[str], None] = lambda _: None) -> Area:
    """Throughput of the Ray engine with 2 workers against 1, on the bundled corpus.

    Args:
        plan: corpus slice (``analysis_items``) and rounds (``capture_rounds``).
        loaded: ``headlab.load()``'s result (the single-process floor runs on it; the workers load
            the same source in the same dtype, and are checked against it).
        tick: progress.

    Returns:
        The "distributed" area; without Ray, or on CUDA, a note says why it did not run.
    """
    from headlab.analysis.analyze import AnalysisAccumulators
    from headlab.analysis.norms import out_projections
    from headlab.analysis.surface import is_causal
    from headlab.bench.capture import _parses, model_name
    from headlab.capture import capture, load_corpus
    from headlab.capture.distributed import INSTALL, RayEngine

    area = Area("distributed", "Ray: the corpus in shards on 2 workers vs 1", "Not run.")
    if plan.device != "cpu":
        area.notes.append("skipped: the Ray engine's workers run on CPU")
        return area
    try:
        import ray  # noqa: F401 - only whether it imports
    except ImportError:
        area.notes.append(f"skipped: Ray is not installed ({INSTALL})")
        return area
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    texts = list(load_corpus().texts)[: plan.analysis_items]
    factory = AnalysisAccumulators(causal=is_causal(loaded), parses=_parses(texts, area), W_O=out_projections(loaded))
    tick("distributed: starting Ray workers")
    with RayEngine(loaded, workers=2) as engine:  # its model and dtype; a local Ray of 2 CPUs unless one runs
        runs: dict[str, Any] = {}

        def sharded(workers: int) -> Callable[[], None]:
            def once() -> None:
                runs[str(workers)] = engine.run(texts, consumers=factory, take=factory.take, workers=workers,
                                                batch_tokens=BATCH_TOKENS, progress=False)
            return once

        def single() -> None:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                consumers = factory()  # the whole corpus, as analyze's local engine
                capture(loaded, corpus=texts, consumers=consumers, take=factory.take, batch_tokens=BATCH_TOKENS,
                        progress=False)
                runs["single"] = consumers
            finally:
                torch.set_num_threads(threads)

        tick(f"distributed: {len(texts)} items")
        t = time_interleaved({"2 workers": sharded(2), "1 worker": sharded(1), "single": single},
                             rounds=plan.capture_rounds, min_block_s=1e-6, warmup=1, device="cpu")
    two_run, one_run = runs["2"], runs["1"]
    tokens = two_run.capture.tokens
    workers_differ = max_difference(two_run.consumers, one_run.consumers)  # same shards, same merge order: 0.0
    process_differs = max_difference(two_run.consumers, runs["single"])  # float64 sums added in another order
    rss = max(r.peak_rss_bytes for r in two_run.shards) / 2**20
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    # Tokens per second of each worker while it ran shards (last pass). Alone, a worker has a core to
    # itself; when each of 2 workers runs at about half that rate, they shared cores (other processes).
    busy = _busy_rates(two_run.shards)
    alone = _busy_rates(one_run.shards)
    area.description = (
        f"{model_name(loaded)} over {len(texts)} items of the bundled corpus ({len(two_run.shards)} shards of "
        f"capture's {two_run.capture.batches} batches of at most {BATCH_TOKENS} padded tokens), float32 on CPU, every "
        f"accumulator of headlab analyze ({', '.join(type(c).__name__ for c in two_run.consumers)}); one call = one "
        f"sharded pass (planning, shipping, capture, merge); workers warm (model loaded); {plan.capture_rounds} "
        "interleaved rounds, median. "
        f"Load average (1 min) {load_before:.2f} before the area and {load_after:.2f} after, on {os.cpu_count()} "
        "CPUs: above the CPUs, other processes took cores from the workers.")
    case = f"{len(texts)} items · {tokens} tokens"
    speedup = t["1 worker"].median / t["2 workers"].median
    area.rows = [
        Comparison(case, "Ray, 2 workers × 1 thread", "Ray, 1 worker × 1 thread", t["2 workers"], t["1 worker"],
                   goal=RAY_GOAL, tokens=tokens, details={
                       "speed-up": speedup, "tokens/s per worker": tokens / t["2 workers"].median / 2,
                       "1 worker tokens/s": tokens / t["1 worker"].median,
                       "busy tokens/s of each worker": " / ".join(f"{rate:,.0f}" for rate in busy),
                       "busy tokens/s of 1 worker alone": " / ".join(f"{rate:,.0f}" for rate in alone),
                       "largest difference, 2 workers vs 1": _difference(workers_differ),
                       "largest difference vs one process": _difference(process_differs),
                       "peak RSS per worker MiB": round(rss)}),
        Comparison(case, "Ray, 1 worker × 1 thread", "one process, 1 torch thread", t["1 worker"], t["single"],
                   tokens=tokens),
    ]
    if workers_differ != 0.0:
        area.notes.append(f"the merged results of 2 workers and 1 differ by up to {workers_differ:.1e}; they should "
                          "be identical (the same shards merged in the same order)")
    if process_differs > 1e-12:
        area.notes.append(f"the merged results differ from one process's by up to {process_differs:.1e} (over 1e-12)")
    return area
