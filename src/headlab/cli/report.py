"""``headlab report``: build the HTML report and print a summary of its sections."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer

from headlab.cli.errors import INPUT_ERRORS, fail
from headlab.cli.loading import quiet_loading
from headlab.cli.options import check_seed
from headlab.cli.output import output_folder, staged_folder


def report(
    model: Annotated[str | None, typer.Argument(
        help="Checkpoint directory or hub id for the model sections; default: the packaged MiniLM.")] = None,
    text: Annotated[Path | None, typer.Option(
        "--text", help="Corpus file for the model sections, UTF-8, one item per line; default: the bundled "
                       "corpus.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder to write index.html and its assets into; replaced as a "
                                                    "whole, so new, empty, or an earlier report.")] = Path("report"),
    seed: Annotated[int, typer.Option("--seed", help="Seed for every random draw (an int ≥ 0).")] = 0,
    quick: Annotated[bool, typer.Option("--quick", help="Reduced budgets: a few minutes on a 2-core CPU.")] = False,
    serve: Annotated[bool, typer.Option("--serve", help="Then serve the folder on 127.0.0.1 until Ctrl-C.")] = False,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port for --serve; 0 picks a free one.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary (report.json: each section's result and "
                                                         "seconds) as JSON on stdout instead of the table.")] = False,
) -> None:
    """Build the report (index.html + assets, works offline) and summarise its sections.

    Exits with status 1 if any section failed to render (the page still shows the others) or when
    interrupted (--out left as it was); 2 on bad input (--out, the model, the corpus: all checked
    before the first section runs).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from headlab.report import build_report

    check_seed(seed)
    output_folder(out, owner="report.json")
    words = ["headlab", "report", *([model] if model is not None else []), "--out", str(out), "--seed", str(seed)]
    words += (["--text", str(text)] if text is not None else []) + (["--quick"] if quick else [])
    quiet_loading()
    if as_json and serve:
        raise typer.BadParameter("--json prints the summary and exits; --serve keeps serving: give one",
                                 param_hint="--serve")
    with staged_folder(out) as work:
        try:
            result = build_report(work, seed=seed, quick=quick, model=model, text=text, progress=not as_json,
                                  command=shlex.join(words))
        except (*INPUT_ERRORS, ModuleNotFoundError) as err:  # the model or the corpus, before any section ran
            fail(str(err))

    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
        if not result.ok:
            raise typer.Exit(code=1)
        return
    summary = Table(title="headlab report")
    summary.add_column("section")
    summary.add_column("result")
    summary.add_column("seconds", justify="right")
    for s in result.sections:
        status = "[green]ok[/green]" if s.ok else f"[red]failed[/red] {escape(s.error or '')}"
        summary.add_row(escape(s.title), status, f"{s.seconds:.2f}")
    console = Console()
    console.print(summary)
    console.print(f"Report written to {escape(str(out / result.index.name))}")
    if serve:
        from headlab.cli.serving import serve_until_interrupted

        serve_until_interrupted(out, port=port, console=console)
    if not result.ok:
        raise typer.Exit(code=1)
