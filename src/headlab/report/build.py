"""Run report sections and write one self-contained report folder.

A section that raises does not stop the report: its place in the page shows the
exception type, message and traceback, and the remaining sections still render.
Sections may be grouped into parts (:class:`headlab.report.section.Part`); every section
runs once, in page order, under one progress bar.
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
from headlab.report.page import PROVENANCE_ID, RenderedPart, RenderedSection, render_page
from headlab.report.provenance import collect_provenance, model_name, sources_read
from headlab.report.section import Part, ReportContext, Section

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
        """Returns: a JSON-ready dict; the index by its name, relative to the report folder (which may move)."""
        return {
            "index": self.index.name,
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


def _check_ids(entries: Sequence[Section | Part]) -> None:
    seen: set[str] = {PROVENANCE_ID}
    ids = [e.id for e in entries] + [s.id for e in entries if isinstance(e, Part) for s in e.sections]
    for anchor in ids:
        if anchor in seen:
            raise ValueError(f"duplicate or reserved section id {anchor!r} (reserved: {PROVENANCE_ID!r})")
        seen.add(anchor)
    for e in entries:
        if isinstance(e, Part):
            missing = [a for a in e.see_also if a not in seen]
            if missing:
                raise ValueError(f"part {e.id!r} refers to {missing}, which no section or part of the page has")


def _describe_model(ctx: ReportContext) -> tuple[str, str]:
    """``(name, source)`` of the report's model."""
    loaded = ctx.memoized("model")
    if loaded is None:
        return model_name(ctx.model), "not loaded: no section needed it"
    return f"{model_name(loaded.source)} ({loaded.architecture})", loaded.source


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def build_report(
    out_dir: Path,
    *,
    sections: Sequence[Section | Part] | None = None,
    seed: int = 0,
    quick: bool = False,
    model: str | None = None,
    text: Path | None = None,
    progress: bool = True,
    command: str | None = None,
) -> ReportResult:
    """Render every section and write ``out_dir/index.html`` and ``out_dir/report.json``.

    Args:
        out_dir: report folder; created if missing. Existing files with the same names
            are overwritten, nothing else in it is touched (``headlab report`` builds into a
            new folder and replaces the old one with it only once the build is complete).
        sections: sections and parts in page order; defaults to
            :data:`headlab.report.sections.DEFAULT_SECTIONS`.
        seed: passed to every section through the context.
        quick: ask sections for a smaller, faster computation.
        model: the checkpoint the model sections study; None for the packaged MiniLM.
        text: the corpus file they run over; None for the bundled corpus.
        progress: show a rich progress bar (on stderr) while sections run; where stderr is not a
            terminal (a pipe, a log), a line per section instead.
        command: the command line shown in the provenance footer; defaults to ``sys.argv``.

    Returns:
        A :class:`ReportResult` with the index path and one outcome per section.

    Raises:
        ValueError: two sections or parts share an id, one uses the reserved id
            ``"provenance"``, or a part's ``see_also`` names an id the page lacks; or, as
            ``headlab.load`` and ``load_corpus`` raise them, ``model`` or ``text`` cannot be used; or ``model``
            does not read text (an image or audio model).
        FileNotFoundError, NotADirectoryError: ``model`` or ``text`` cannot be found. The model
            (when given) and the corpus are checked before any section runs or any file is written.
    """
    from headlab.capture.corpus import load_corpus  # heavy (torch): imported on use

    if sections is None:
        from headlab.report.sections import DEFAULT_SECTIONS  # read at call time: the registry may grow

        sections = DEFAULT_SECTIONS
    entries = list(sections)
    _check_ids(entries)
    flat = [s for e in entries for s in (e.sections if isinstance(e, Part) else (e,))]

    out_dir = Path(out_dir)
    ctx = ReportContext(out_dir=out_dir, assets_dir=out_dir / "assets", seed=seed, quick=quick, model=model,
                        text=text)
    # A model or corpus that cannot be used stops the report now, not after minutes of other sections.
    corpus = load_corpus(text)
    if model is not None:  # the packaged default is loaded when a section first asks for it
        loaded = ctx.load_model()
        takes = getattr(loaded.model, "main_input_name", "input_ids")
        if takes != "input_ids":  # every model section reads the corpus's text
            raise ValueError(f"{loaded.source}: {loaded.architecture} takes {takes}, not text; the report's model "
                             "sections read text (images and audio are read by headlab view and headlab analyze "
                             "--images / --audio)")
    out_dir.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    done: dict[str, RenderedSection] = {}
    outcomes: list[SectionOutcome] = []
    console = Console(stderr=True)
    live = progress and console.is_terminal  # a bar redraws in place; a pipe or a log gets a line per section
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not live, transient=True) as bar:
        task = bar.add_task("report", total=len(flat))
        for number, section in enumerate(flat, start=1):
            bar.update(task, description=f"section: {section.title}")
            if progress and not live:
                console.print(f"report: section {number}/{len(flat)}: {section.title}", markup=False,
                              highlight=False, soft_wrap=True)
            t0 = time.perf_counter()
            try:
                body, error = str(section.render(ctx)), None
            except Exception as exc:  # noqa: BLE001 - a broken section must not take the report down
                body, error = _error_fragment(exc), f"{type(exc).__name__}: {exc}"
            seconds = time.perf_counter() - t0
            done[section.id] = RenderedSection(id=section.id, title=section.title, ok=error is None, body=body,
                                               seconds=seconds)
            outcomes.append(SectionOutcome(section.id, section.title, error is None, error, seconds))
            bar.advance(task)

    page = [RenderedPart(id=e.id, title=e.title, intro=e.intro, sections=[done[s.id] for s in e.sections],
                         see_also=list(e.see_also)) if isinstance(e, Part) else done[e.id] for e in entries]
    name, source = _describe_model(ctx)
    prov = collect_provenance(seed=seed, quick=quick, model=name, model_source=source,
                              corpus=f"{corpus.source} ({len(corpus)} items)", command=command,
                              read=sources_read(ctx))
    index = out_dir / "index.html"
    _write_atomic(index, render_page(page, provenance=prov, seconds=time.perf_counter() - start))
    result = ReportResult(index=index, sections=outcomes, provenance=prov.to_dict())
    _write_atomic(out_dir / "report.json", json.dumps(result.to_dict(), indent=2) + "\n")
    return result

