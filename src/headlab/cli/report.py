"""``headlab report``: build the HTML report and print a summary of its sections."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer


def report(
    out: Annotated[Path, typer.Option("--out", help="Folder to write index.html into.")] = Path("report"),
    seed: Annotated[int, typer.Option("--seed", help="Seed for every random draw.")] = 0,
    quick: Annotated[bool, typer.Option("--quick", help="Smaller, faster computations.")] = False,
) -> None:
    """Build the report (index.html + assets) and summarise its sections.

    Exits with status 1 if any section failed to render.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from headlab.report import build_report

    command = f"headlab report --out {shlex.quote(str(out))} --seed {seed}" + (" --quick" if quick else "")
    result = build_report(out, seed=seed, quick=quick, progress=True, command=command)

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
    if not result.ok:
        raise typer.Exit(code=1)
