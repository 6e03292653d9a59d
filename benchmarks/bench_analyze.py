"""Analysis benchmark: the cost of the accumulators on top of capture, and importance by gradient
vs exhaustive ablation, on MiniLM and the bundled corpus, measured in one run.

    python benchmarks/bench_analyze.py [--quick]

Every contender is the same capture pass (all 72 heads' patterns, default bucketing) with
different consumers; rounds are interleaved and the median counts. Dependency parses are made
once, before timing (parsing is spaCy's cost, not the accumulator's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import headlab
from headlab.analysis import (
    HeadSimilarity, SurfaceStats, SyntaxAccuracy, TaxonomyStats, ablation_importance, gradient_importance,
    pair_batches, paraphrase_loss, parse_texts, spearman,
)
from headlab.analysis.analyze import SIMILARITY_ROWS_PER_BATCH
from headlab.capture import capture
from headlab.data import corpus_lines
from headlab.data.pairs import load_pairs

sys.path.insert(0, str(Path(__file__).parent))
from bench_layer import machine  # noqa: E402  (scripts beside this one)
from results import write_section  # noqa: E402


class NoOp:
    def update(self, batch) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 corpus items, 1 round")
    args = parser.parse_args(argv)
    loaded = headlab.load()
    texts = corpus_lines()[:100] if args.quick else corpus_lines()
    parses = parse_texts(texts)
    contenders = {
        "capture only (no-op consumer)": lambda: [NoOp()],
        "surface statistics": lambda: [SurfaceStats()],
        "taxonomy": lambda: [TaxonomyStats()],
        "syntax": lambda: [SyntaxAccuracy(parses)],
        "similarity, every row": lambda: [HeadSimilarity()],
        f"similarity, {SIMILARITY_ROWS_PER_BATCH} rows per batch": lambda: [
            HeadSimilarity(rows_per_batch=SIMILARITY_ROWS_PER_BATCH)],
        "all accumulators as analyze runs them": lambda: [
            SurfaceStats(), TaxonomyStats(), SyntaxAccuracy(parses), HeadSimilarity(rows_per_batch=SIMILARITY_ROWS_PER_BATCH)],
    }
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    tokens = 0
    for _ in range(1 if args.quick else 2):
        for name, consumers in contenders.items():
            start = time.perf_counter()
            run = capture(loaded, corpus=texts, consumers=consumers(), progress=False)
            seconds[name].append(time.perf_counter() - start)
            tokens = run.tokens
    t = {name: statistics.median(s) for name, s in seconds.items()}
    base = t["capture only (no-op consumer)"]

    pairs = load_pairs(labels=("paraphrase",))
    batches = pair_batches(loaded.tokenizer, pairs)
    gradient = gradient_importance(loaded, batches, paraphrase_loss)
    ablation = ablation_importance(loaded, batches, paraphrase_loss)
    rho_abs = spearman(gradient.raw, np.abs(ablation.raw))

    info = machine()
    lines = [
        "## Analysis",
        "",
        f"By `benchmarks/bench_analyze.py`{' --quick' if args.quick else ''}: all-MiniLM-L6-v2, all 72 heads' "
        f"patterns, {len(texts)} corpus items ({tokens} tokens), default bucketing; median of interleaved rounds. "
        "Goal: all accumulators together ≤ 1.30× the capture-only pass.",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in info.items()),
        "",
        "| consumers | seconds | tokens/s | × capture only |",
        "|---|---:|---:|---:|",
    ]
    for name, value in t.items():
        lines.append(f"| {name} | {value:.2f} | {tokens / value:,.0f} | {value / base:.2f} |")
    lines += [
        "",
        f"Importance on {len(pairs)} paraphrase pairs ({len(batches)} batches), goal: gradient ≥ 20× faster than "
        "exhaustive single-head ablation:",
        "",
        "| method | seconds | × gradient |",
        "|---|---:|---:|",
        f"| gradient (Michel et al.) | {gradient.seconds:.2f} | 1.00 |",
        f"| exact ablation, 72 heads | {ablation.seconds:.2f} | {ablation.seconds / gradient.seconds:.1f} |",
        "",
        f"Spearman(|gradient score|, |ablation loss change|) = {rho_abs:.3f}; "
        f"Spearman(gradient, signed ablation) = {spearman(gradient.raw, ablation.raw):.3f}.",
    ]
    markdown = "\n".join(lines)
    write_section("analysis", markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
