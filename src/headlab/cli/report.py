"""``headlab report``: build the HTML report and print a summary of its sections."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer


def report(
    model: Annotated[str | None, typer.Argument(
        help="Checkpoint directory or hub id for the model sections; default: the packaged MiniLM.")] = None,
    text: Annotated[Path | None, typer.Option(
        "--text", exists=True, dir_okay=False, readable=True,
        help="Corpus file for the model sections, one item per line; default: the bundled corpus.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder to write index.html into.")] = Path("report"),
    seed: Annotated[int, typer.Option("--seed", help="Seed for every random draw.")] = 0,
    quick: Annotated[bool, typer.Option("--quick", help="Reduced budgets: a few minutes on a 2-core CPU.")] = False,
    serve: Annotated[bool, typer.Option("--serve", help="Then serve the folder on 127.0.0.1 until Ctrl-C.")] = False,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port for --serve; 0 picks a free one.")] = 0,
) -> None:
    """Build the report (index.html + assets, works offline) and summarise its sections.

    Exits with status 1 if any section failed to render (the page still shows the others).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from headlab.report import build_report

    words = ["headlab", "report", *([model] if model is not None else []), "--out", str(out), "--seed", str(seed)]
    words += (["--text", str(text)] if text is not None else []) + (["--quick"] if quick else [])
    result = build_report(out, seed=seed, quick=quick, model=model, text=text, progress=True,
                          command=shlex.join(words))

    summary = Table(title="headlab report")
    summary.add_column("section")
    summary.add_column("result")
    summary.add_column("seconds", justify="right")
    for s in result.sections:
        status = "[green]ok[/green]" if s.ok else f"[red]failed[/red] {escape(s.error or '')}"
        summary.add_row(escape(s.title), status, f"{s.seconds:.2f}")
    console = Console()
    console.print(summary)
    console.print(f"Report written to {escape(str(result.index))}")
    if serve:
        from headlab.cli.serving import serve_until_interrupted

        serve_until_interrupted(out, port=port, console=console)
    if not result.ok:
        raise typer.Exit(code=1)
