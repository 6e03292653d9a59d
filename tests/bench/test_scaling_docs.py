"""docs/scaling.md's measured numbers are read from benchmarks/RESULTS.json, never typed by hand.

The block between ``<!-- generated from benchmarks/RESULTS.json … -->`` and ``<!-- end generated -->``
is the latest CPU run's "distributed" area (``headlab bench``, written by ``make bench``), rendered
here. Running this file as a script rewrites the block; run it after ``make bench``:

    .venv/bin/python tests/bench/test_scaling_docs.py
"""

from __future__ import annotations

import re
from pathlib import Path

from headlab.bench.records import Comparison
from headlab.bench.results import format_seconds, inconclusive, json_path, noise, read_results

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "scaling.md"
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
REGENERATE = ".venv/bin/python tests/bench/test_scaling_docs.py"
_GENERATED = re.compile(r"(<!-- generated from benchmarks/RESULTS\.json[^\n]*-->\n)(.*?)(<!-- end generated -->)",
                        re.DOTALL)


def _rate(row: Comparison, side: str = "contender") -> str:
    return f"{row.tokens_per_s(side):,.0f} tokens/s" if row.tokens else ""


def _shared(details: dict) -> str:
    """A clause when each of 2 busy workers ran well below the lone worker's rate: they did not have a core each."""
    def rates(key: str) -> list[float]:
        return [float(r.replace(",", "")) for r in str(details[key]).split(" / ")]

    share = sum(rates("busy tokens/s of each worker")) / 2 / max(rates("busy tokens/s of 1 worker alone"))
    if share > 0.85:
        return ""
    return (f"; each of the 2 ran at {share:.0%} of the lone rate, so they did not have a core each: other "
            "processes were using the machine")


def measured_numbers(results: Path = RESULTS) -> str:
    """The generated block: the "distributed" area of the latest CPU run in ``results``' JSON, as Markdown."""
    run = read_results(results).get("cpu")
    area = None if run is None else next((a for a in run.areas if a.name == "distributed"), None)
    if area is None or not area.rows:
        why = "" if area is None else " (" + "; ".join(area.notes) + ")"
        source = json_path(results)
        return (f"Not measured yet: {source.relative_to(ROOT) if source.is_relative_to(ROOT) else source} "
                f"holds no CPU run of the `distributed` area{why}. `make bench` measures it; then `{REGENERATE}` "
                "writes the numbers here.\n")
    faster, overhead = area.rows[0], area.rows[1]
    details = faster.details
    machine = run.machine
    met = faster.goal is not None and faster.ratio <= faster.goal
    lines = [
        f"Measured {run.started} by `{run.command}` on {machine.get('cpu', 'an unnamed CPU')} "
        f"({machine.get('physical cores', '?')} physical cores, {machine.get('cpus available', '?')} CPUs available). "
        f"{area.description}",
        "",
        "| engine | time per pass | throughput | noise |",
        "|---|---|---|---|",
        f"| {faster.contender} | {format_seconds(faster.contender_time.median)} | {_rate(faster)} | "
        f"{faster.contender_time.spread:.0%} |",
        f"| {faster.peer} | {format_seconds(faster.peer_time.median)} | {_rate(faster, 'peer')} | "
        f"{faster.peer_time.spread:.0%} |",
        f"| {overhead.peer} | {format_seconds(overhead.peer_time.median)} | {_rate(overhead, 'peer')} | "
        f"{overhead.peer_time.spread:.0%} |",
        "",
        f"- Speed-up of 2 workers over 1: {details['speed-up']:.2f}× (goal ≥ {1 / faster.goal:.1f}×: "
        f"{'met' if met else 'not met'}"
        + ("; the rounds disagree by more than the difference, so this run cannot conclude" if inconclusive(faster)
           else "") + ").",
        f"- Throughput per worker with 2 workers: {details['tokens/s per worker']:,.0f} tokens/s over the whole "
        f"pass; while busy with a shard, each worker: {details['busy tokens/s of each worker']} tokens/s, against "
        f"{details['busy tokens/s of 1 worker alone']} tokens/s for 1 worker alone{_shared(details)}.",
        f"- The engine's own cost: 1 Ray worker takes {overhead.ratio:.2f}× the time of one process with one torch "
        f"thread on the same batches (noise {noise(overhead):.0%}).",
        f"- Peak resident memory of a worker process: {details['peak RSS per worker MiB']} MiB.",
        f"- Merged results: 2 workers vs 1, largest difference {details['largest difference, 2 workers vs 1']}; "
        f"vs one process, {details['largest difference vs one process']}.",
    ]
    lines += [f"- {note}" for note in area.notes]
    return "\n".join(lines) + "\n"


def test_the_measured_numbers_are_those_of_results_json():
    match = _GENERATED.search(DOCS.read_text(encoding="utf-8"))
    assert match, f"{DOCS} lost its generated block"
    assert match.group(2) == measured_numbers(), f"docs/scaling.md is stale: run `{REGENERATE}`"


def test_a_results_file_without_the_area_says_not_measured(tmp_path):
    (tmp_path / "RESULTS.json").write_text('{"format": "headlab-bench/1", "runs": {}}\n')
    assert measured_numbers(tmp_path / "RESULTS.md").startswith("Not measured yet:")


if __name__ == "__main__":  # after `make bench`
    text = DOCS.read_text(encoding="utf-8")
    found = _GENERATED.search(text)
    if not found:
        raise SystemExit(f"{DOCS} has no generated block")
    DOCS.write_text(text[: found.start(2)] + measured_numbers() + text[found.end(2):], encoding="utf-8")
