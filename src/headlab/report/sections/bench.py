"""Performance: the latest ``headlab bench`` tables, read from benchmarks/RESULTS.json.

The section measures nothing itself (a full run takes minutes and wants a quiet machine):
it shows the latest stored run of each device, says first that its numbers were not measured
by the report's run, then when, where and by which command they were, and says plainly when no
run exists. What it read is recorded for the provenance paragraph (``record_source``). A row whose
timing noise is larger than its effect is marked as unable to conclude (``noise_note``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from headlab.report.html import Html, badge, code, escape, link, table
from headlab.report.section import ReportContext, Section

if TYPE_CHECKING:
    from headlab.bench.records import SuiteResult

__all__ = ["JSON_NAME", "SECTION", "candidate_paths", "find_results", "measured", "render_results"]

JSON_NAME = "bench.json"
REGENERATE = "headlab bench --out benchmarks/RESULTS.md"


def candidate_paths() -> list[Path]:
    """Where the results may be: ``benchmarks/RESULTS.json`` under the working directory, then
    under the source checkout headlab runs from (an editable install)."""
    import headlab

    checkout = Path(headlab.__file__).resolve().parents[2]
    return list(dict.fromkeys([Path.cwd() / "benchmarks" / "RESULTS.json", checkout / "benchmarks" / "RESULTS.json"]))


def find_results(paths: list[Path] | None = None) -> Path | None:
    """The first of ``paths`` (default: ``candidate_paths()``) that exists, or None."""
    for path in candidate_paths() if paths is None else paths:
        if path.is_file():
            return path
    return None


def _run(result: SuiteResult) -> str:
    from headlab.bench.results import DEVICES, TABLE_HEADERS, format_seconds, noise_note, table_rows

    plan, ceilings, machine = result.plan, result.ceilings, result.machine
    ceiling = ceilings.matmul_flops_per_s
    where = ", ".join(f"{k} {v}" for k, v in machine.items() if k in ("cpu", "gpu", "torch threads", "torch"))
    goals = result.goals()
    parts = [f"<h3>{escape(DEVICES.get(plan.device, plan.device))}, {escape(plan.dtype)}</h3>",
             f"<p>Measured {escape(result.started)} ({escape(format_seconds(result.seconds))}) by "
             f"{code(result.command)}{' with the --quick budget' if result.quick else ''} on {escape(where)}. "
             f"Ceilings in the same run: {escape(ceilings.dtype)} matmul {ceiling / 1e9:,.1f} GFLOP/s, copy "
             f"{ceilings.copy_bytes_per_s / 1e9:,.1f} GB/s. Goals met: {sum(m for _, _, m in goals)} of "
             f"{len(goals)}.</p>"]
    met_column = TABLE_HEADERS.index("met")
    for area in result.areas:
        rows: list[list[object]] = []
        for cells, row in zip(table_rows(area, ceiling), area.rows):
            met = row.met(ceiling)
            rows.append([*cells[:met_column], Html("") if met is None else badge(met), *cells[met_column + 1:]])
        parts.append(f"<h4>{escape(area.title)}</h4><p>{escape(area.description)}</p>")
        if area.error is not None:
            parts.append(f"<p><strong>Failed</strong>: {escape(area.error)}</p>")
        if rows:
            parts.append(table(list(TABLE_HEADERS), rows, numeric_cols=(2, 4, 5, 9)))
        parts += [f"<p>{escape(note)}</p>" for note in (noise_note(area), *area.notes) if note]
    return "".join(parts)


def render_results(runs: dict[str, SuiteResult], source: Path | None, *, json_href: str | None = None) -> Html:
    """The section's HTML for stored runs.

    Args:
        runs: device → its latest run (empty when none exists).
        source: the JSON file they were read from, or None.
        json_href: link to a copy of the runs as JSON in the report, or None.

    Returns:
        The fragment: one block per device run, and a plain statement for a device without one.
    """
    from headlab.bench.results import DEVICES

    if not runs:
        return Html(f"<p>No benchmark has been run: {code(REGENERATE)} measures headlab against "
                    "nn.MultiheadAttention, Hugging Face and the raw floor and writes the results this section "
                    "shows.</p>")
    parts = [f"<p><strong>Not measured by this report:</strong> every number in this section is read from "
             f"{code(str(source))}, written by {escape('; '.join(measured(run) for run in runs.values()))} — "
             "not by the run described at the end of the page, and possibly on another machine. "
             f"{code(REGENERATE)} measures them again. Ratio = contender time / peer time, both timed in the same "
             "interleaved group; below 1 the contender is faster."
             + (f" Every round's timing: {link(json_href, JSON_NAME)}." if json_href else "") + "</p>"]
    for device in DEVICES:
        if device in runs:
            parts.append(_run(runs[device]))
        elif device == "cuda":
            parts.append("<p>No GPU table: no run with a CUDA device is stored.</p>")
    return Html("".join(parts))


def measured(run: SuiteResult) -> str:
    """By what, where and when a stored run was measured: "headlab bench on <cpu> (…), <time>"."""
    where = ", ".join(f"{k} {v}" for k, v in run.machine.items() if k in ("gpu", "logical cpus", "torch threads"))
    return f"{run.command} on {run.machine.get('cpu', 'an unnamed CPU')}{f' ({where})' if where else ''}, {run.started}"


def render(ctx: ReportContext) -> str:
    from headlab.bench.results import read_results
    from headlab.report.provenance import ReadSource, record_source

    source = find_results()
    runs = {} if source is None else read_results(source)
    href = None
    if runs:
        href = ctx.write_file(JSON_NAME, json.dumps({d: r.to_dict() for d, r in runs.items()}, indent=1))
        record_source(ctx, ReadSource(section=SECTION.title, path=str(source),
                                      measured="; ".join(measured(run) for run in runs.values())))
    return render_results(runs, source, json_href=href)


SECTION = Section(id="bench", title="Performance: headlab against its peers", render=render)
