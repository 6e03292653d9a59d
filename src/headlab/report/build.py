"""Run report sections and write one self-contained report folder.

A section that raises does not stop the report: its place in the page shows the
exception type, message and traceback, and the remaining sections still render.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headlab.report.html import Html, code, details
from headlab.report.page import PROVENANCE_ID, RenderedSection, render_page
from headlab.report.provenance import collect_provenance
from headlab.report.section import ReportContext, Section

__all__ = ["SectionOutcome", "ReportResult", "build_report"]


@dataclass(frozen=True)
class SectionOutcome:
    """How one section went.

    Attributes:
        id: the section's id.
        title: the section's title.
        ok: True when ``render`` returned without raising.
        error: ``"ExceptionType: message"`` when it raised, else None.
        seconds: wall-clock time spent in ``render``.
    """

    id: str
    title: str
    ok: bool
    error: str | None
    seconds: float

    def to_dict(self) -> dict[str, object]:
        """Returns: the fields as a JSON-ready dict."""
        return {"id": self.id, "title": self.title, "ok": self.ok, "error": self.error, "seconds": self.seconds}


@dataclass(frozen=True)
class ReportResult:
    """What :func:`build_report` produced.

    Attributes:
        index: path of the written ``index.html``.
        sections: one outcome per section, in page order.
        provenance: versions, machine, seed, time and command of the run.
    """

    index: Path
    sections: list[SectionOutcome]
    provenance: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when every section rendered."""
        return all(s.ok for s in self.sections)

    def to_dict(self) -> dict[str, object]:
        """Returns: a JSON-ready dict (paths as strings)."""
        return {
            "index": str(self.index),
            "ok": self.ok,
            "sections": [s.to_dict() for s in self.sections],
            "provenance": dict(self.provenance),
        }


def _error_fragment(exc: BaseException) -> Html:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Html(
        '<div class="section-error"><p>This section failed to render: '
        f"{code(f'{type(exc).__name__}: {exc}')}</p>{details('Traceback', tb)}</div>"
    )


def _check_ids(sections: Sequence[Section]) -> None:
    seen: set[str] = {PROVENANCE_ID}
    for s in sections:
        if s.id in seen:
            raise ValueError(f"duplicate or reserved section id {s.id!r} (reserved: {PROVENANCE_ID!r})")
        seen.add(s.id)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def build_report(
    out_dir: Path,
    *,
    sections: Sequence[Section] | None = None,
    seed: int = 0,
    quick: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> ReportResult:
    """Render every section and write ``out_dir/index.html`` and ``out_dir/report.json``.

    Args:
        out_dir: report folder; created if missing. Existing files with the same names
            are overwritten, nothing else in it is touched.
        sections: sections in page order; defaults to
            :data:`headlab.report.sections.DEFAULT_SECTIONS`.
        seed: passed to every section through the context.
        quick: ask sections for a smaller, faster computation.
        progress: show a rich progress bar (on stderr) while sections run.
        command: the command line shown in the provenance footer; defaults to ``sys.argv``.

    Returns:
        A :class:`ReportResult` with the index path and one outcome per section.

    Raises:
        ValueError: two sections share an id, or a section uses the reserved id
            ``"provenance"``.
    """
    if sections is None:
        from headlab.report.sections import DEFAULT_SECTIONS  # read at call time: the registry may grow

        sections = DEFAULT_SECTIONS
    sections = list(sections)
    _check_ids(sections)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ctx = ReportContext(out_dir=out_dir, assets_dir=out_dir / "assets", seed=seed, quick=quick)

    start = time.perf_counter()
    rendered: list[RenderedSection] = []
    outcomes: list[SectionOutcome] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), disable=not progress, transient=True) as bar:
        task = bar.add_task("report", total=len(sections))
        for section in sections:
            bar.update(task, description=f"section: {section.title}")
            t0 = time.perf_counter()
            try:
                body, error = str(section.render(ctx)), None
            except Exception as exc:  # a broken section must not take the report down
                body, error = _error_fragment(exc), f"{type(exc).__name__}: {exc}"
            seconds = time.perf_counter() - t0
            rendered.append(RenderedSection(id=section.id, title=section.title, ok=error is None, body=body))
            outcomes.append(SectionOutcome(section.id, section.title, error is None, error, seconds))
            bar.advance(task)

    prov = collect_provenance(seed=seed, quick=quick, command=command)
    index = out_dir / "index.html"
    _write_atomic(index, render_page(rendered, provenance=prov, seconds=time.perf_counter() - start))
    result = ReportResult(index=index, sections=outcomes, provenance=prov.to_dict())
    _write_atomic(out_dir / "report.json", json.dumps(result.to_dict(), indent=2) + "\n")
    return result

