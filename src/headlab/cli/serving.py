"""``--serve`` for the commands that write pages (report, view): serve on 127.0.0.1 until Ctrl-C."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

__all__ = ["serve_until_interrupted"]


def serve_until_interrupted(path: Path, *, port: int, console: Console) -> None:
    """Serve ``path`` (a report folder or one page) on 127.0.0.1, announcing its URL.

    Raises:
        typer.Exit: code 2 when the port cannot be bound, with the reason printed.
    """
    from headlab.report.viewer.serve import serve

    try:
        serve(path, port=port,
              announce=lambda url: console.print(f"serving {escape(url)} (this machine only; Ctrl-C stops)"))
    except OSError as err:
        console.print(f"[red]error:[/red] cannot serve on 127.0.0.1:{port}: {escape(str(err))}")
        raise typer.Exit(code=2) from None
