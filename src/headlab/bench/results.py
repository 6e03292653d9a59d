"""benchmarks/RESULTS.md and the JSON beside it: written by the suite, read by the report.

The JSON (``RESULTS.json`` beside ``RESULTS.md``) keeps the latest run per device, so a CPU
run and a GPU run live side by side; writing a run replaces only its device's entry and
regenerates the whole Markdown file from the JSON. Nothing in either file is typed by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from headlab.bench.records import Area, Comparison, SuiteResult
from headlab.display import format_bytes

__all__ = ["DEVICES", "FORMAT", "WITHIN_NOISE", "format_bytes", "format_measure", "format_seconds", "inconclusive",
           "json_path", "noise", "noise_note", "read_results", "table_rows", "to_markdown", "write_results"]

FORMAT = "headlab-bench/1"
DEVICES = {"cpu": "CPU", "cuda": "GPU (CUDA)"}
TABLE_HEADERS = ("case", "contender", "time", "peer", "peer time", "ratio", "goal", "met", "rate", "noise", "details")
WITHIN_NOISE = "within noise"  # follows the ratio of a row that cannot conclude


def json_path(markdown_path: str | os.PathLike[str]) -> Path:
    """The JSON file beside a Markdown results file (``RESULTS.md`` → ``RESULTS.json``)."""
    return Path(markdown_path).with_suffix(".json")


def format_seconds(seconds: float) -> str:
    """``"812 µs"``, ``"12.3 ms"`` or ``"1.23 s"``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def format_measure(value: float, unit: str) -> str:
    """A row's time (``format_seconds``) or, for a memory row (``unit="bytes"``), its bytes (``format_bytes``)."""
    return format_bytes(value) if unit == "bytes" else format_seconds(value)


def noise(row: Comparison) -> float:
    """The row's timing noise: the larger interquartile range of its two timings, relative to its median."""
    return max(row.contender_time.spread, row.peer_time.spread)


def inconclusive(row: Comparison) -> bool:
    """True when the row's noise is larger than its effect (``|ratio − 1|``): the rounds disagree by
    more than the two sides differ, so the row cannot tell which side is faster."""
    return noise(row) > abs(row.ratio - 1.0)


def noise_note(area: Area) -> str | None:
    """A sentence on the area's rows that cannot conclude (``inconclusive``), or None when every row can."""
    rows = [r for r in area.rows if inconclusive(r)]
    if not rows:
        return None
    worst = max(rows, key=noise)
    return (f"{len(rows)} of {len(area.rows)} rows cannot conclude (ratio marked \"{WITHIN_NOISE}\"): their timing "
            f"noise is larger than the ratio's distance from 1, so they do not say which side is faster; the "
            f"noisiest, {worst.contender} vs {worst.peer}, has ratio {worst.ratio:.3f} with noise {noise(worst):.0%}.")


def _rate(row: Comparison, ceiling: float) -> str:
    rate = row.flops_per_s()  # None without a FLOP count
    if rate is not None:
        fraction = row.fraction_of_ceiling(ceiling)
        return f"{rate / 1e9:,.1f} GFLOP/s ({fraction:.0%} of ceiling)"
    if row.tokens is not None:
        return f"{row.tokens_per_s():,.0f} vs {row.tokens_per_s('peer'):,.0f} tokens/s"
    return ""


def _goal(row: Comparison) -> str:
    parts = []
    if row.goal is not None:
        parts.append(f"≤ {row.goal:.2f}")
    if row.ceiling_goal is not None:
        parts.append(f"≥ {row.ceiling_goal:.0%} of ceiling")
    return ", ".join(parts)


def _detail(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def table_rows(area: Area, ceiling_flops_per_s: float) -> list[list[str]]:
    """An area's rows as text cells under ``TABLE_HEADERS`` (for Markdown and the report).

    Args:
        area: the area.
        ceiling_flops_per_s: the run's matmul ceiling.

    Returns:
        One list of cells per comparison; a memory row's "time" cells hold its peak bytes. Ratio = contender
        time / peer time (bytes / bytes on a memory row), followed by
        ``WITHIN_NOISE`` when the row is ``inconclusive``; noise = the larger interquartile range of
        the two timings, relative to its median.
    """
    rows = []
    for r in area.rows:
        met = r.met(ceiling_flops_per_s)
        rows.append([
            r.case, r.contender, format_measure(r.contender_time.median, r.unit), r.peer,
            format_measure(r.peer_time.median, r.unit),
            f"{r.ratio:.3f}" + (f", {WITHIN_NOISE}" if inconclusive(r) else ""), _goal(r),
            "" if met is None else ("yes" if met else "no"), _rate(r, ceiling_flops_per_s), f"{noise(r):.0%}",
            "; ".join(f"{k} {_detail(v)}" for k, v in r.details.items()),
        ])
    return rows


def _markdown_table(headers: tuple[str, ...] | list[str], rows: list[list[str]]) -> list[str]:
    def clean(cell: str) -> str:
        return cell.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(clean(c) for c in row) + " |" for row in rows]
    return lines


def _run_markdown(result: SuiteResult) -> list[str]:
    plan, ceilings = result.plan, result.ceilings
    ceiling = ceilings.matmul_flops_per_s
    lines = [f"## {DEVICES[plan.device]}, {plan.dtype}", "",
             f"Measured {result.started} in {result.seconds:.0f} s by `{result.command}`"
             f"{' (the --quick budget)' if result.quick else ''}.", "", "Machine:", ""]
    lines += _markdown_table(["", ""], [[k, v] for k, v in result.machine.items()])
    lines += ["", "Ceilings measured in this run (interleaved rounds, median):", ""]
    lines += _markdown_table(["ceiling", "value", "noise"], [
        [f"{ceilings.dtype} matmul {ceilings.matmul_size}×{ceilings.matmul_size}",
         f"{ceiling / 1e9:,.1f} GFLOP/s", f"{ceilings.matmul.spread:.0%}"],
        [f"copy of {ceilings.copy_bytes / 2**20:,.0f} MiB (read + write)",
         f"{ceilings.copy_bytes_per_s / 1e9:,.1f} GB/s", f"{ceilings.copy.spread:.0%}"],
    ])
    goals = result.goals()
    missed = [(area, row) for area, row, met in goals if not met]
    lines += ["", f"Goals: {len(goals) - len(missed)} of {len(goals)} met."]
    for area_name, row in missed:
        lines.append(f"- missed ({area_name}): {row.contender} vs {row.peer}, {row.case}: ratio {row.ratio:.3f} "
                     f"(goal {_goal(row)})")
    failed = result.failed()
    if failed:
        lines += ["", f"Areas that failed, their goals not counted: {', '.join(a.name for a in failed)}."]
    for area in result.areas:
        lines += ["", f"### {area.title}", "", f"{area.description} Run time {area.seconds:.0f} s.", ""]
        if area.error is not None:
            lines += [f"**Failed**: {' '.join(area.error.split())}", ""]  # one line: a message may span several
        if area.rows:
            lines += _markdown_table(TABLE_HEADERS, table_rows(area, ceiling))
        notes = [note for note in (noise_note(area), *area.notes) if note]
        lines += [f"\n{note}" for note in notes]
    return lines


def to_markdown(runs: dict[str, SuiteResult]) -> str:
    """The whole RESULTS.md for the latest run of each device.

    Args:
        runs: device → its latest run.

    Returns:
        Markdown text, with a plain statement for a device that has no run.
    """
    lines = ["# Benchmark results", "",
             "Written by `headlab bench --out benchmarks/RESULTS.md` (add `--device cuda` on a machine with a GPU: "
             "docs/benchmarks.md); "
             "do not edit by hand. The same numbers, with every round's timing, are in `RESULTS.json` beside this "
             "file. Ratio = contender time / peer time, both timed in the same interleaved group; below 1 the "
             "contender is faster.", ""]
    for device in DEVICES:
        if device in runs:
            lines += [*_run_markdown(runs[device]), ""]
            continue
        lines += [f"## {DEVICES[device]}", ""]
        other = [r for r in runs.values() if r.plan.device != device]
        available = [r.machine.get("cuda available") for r in other]
        if device == "cuda" and "no" in available:
            lines.append("No GPU table: no CUDA device was available to the run that wrote this file "
                         "(torch.cuda.is_available() was False), so nothing was measured on a GPU.")
        else:
            lines.append(f"No {DEVICES[device]} table: the suite has not been run with `--device {device}`.")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def read_results(path: str | os.PathLike[str]) -> dict[str, SuiteResult]:
    """The runs stored beside ``path`` (RESULTS.md or RESULTS.json).

    Returns:
        device → its latest run; empty when the JSON file does not exist.

    Raises:
        ValueError: the file exists but is not a headlab bench results file.
    """
    source = json_path(path)
    if not source.exists():
        return {}
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{source}: not JSON ({err})") from err
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{source}: not a headlab bench results file (expected \"format\": {FORMAT!r})")
    return {device: SuiteResult.from_dict(run) for device, run in data["runs"].items()}


def write_results(result: SuiteResult, path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Store ``result`` as its device's latest run and regenerate the Markdown.

    Args:
        result: the run.
        path: the Markdown file (e.g. ``benchmarks/RESULTS.md``); the JSON goes beside it.

    Returns:
        ``(markdown path, JSON path)``.

    Raises:
        ValueError: an existing JSON file beside it is not a headlab bench results file.
    """
    markdown, source = Path(path), json_path(path)
    runs = read_results(markdown)
    runs[result.plan.device] = result
    markdown.parent.mkdir(parents=True, exist_ok=True)
    document = {"format": FORMAT, "runs": {device: run.to_dict() for device, run in runs.items()}}
    source.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    markdown.write_text(to_markdown(runs), encoding="utf-8")
    return markdown, source
