"""The ``headlab`` command line: one module per command, each a thin call into the library.

Heavy imports (torch, the report builder) happen inside command bodies so that
``headlab --help`` and ``headlab --version`` return at once. Every command checks its arguments,
paths and output location before any work, stops on bad input with exit status 2 and one line
(``headlab.cli.errors``), and writes its outputs through a temporary folder moved into place at
the end (``headlab.cli.output``): Ctrl-C gives exit status 1 and leaves the old output as it was.
"""

from __future__ import annotations

import sys
import warnings
from importlib import metadata
from typing import Annotated, Any

import typer

from headlab.cli import analyze as _analyze
from headlab.cli import audit as _audit
from headlab.cli import bench as _bench
from headlab.cli import circuit as _circuit
from headlab.cli import experiment as _experiment
from headlab.cli import params as _params
from headlab.cli import patch as _patch
from headlab.cli import report as _report
from headlab.cli import view as _view
from headlab.cli.errors import Commands

__all__ = ["app", "main"]

app = typer.Typer(
    cls=Commands,  # usage errors as one line, like every other error of the commands
    name="headlab",
    help="Multi-head attention, head by head.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _version_callback(value: bool) -> None:
    if value:
        try:
            version = metadata.version("headlab")
        except metadata.PackageNotFoundError:
            version = "unknown (not installed)"
        typer.echo(f"headlab {version}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Multi-head attention, head by head."""
    warnings.showwarning = _show_warning


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """headlab's own warnings as one line on stderr, ``warning: …`` (others as Python shows them)."""
    if category.__module__.startswith("headlab."):
        typer.echo(f"warning: {message}", err=True)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


app.command("report")(_report.report)
app.command("params")(_params.params)
app.command("analyze")(_analyze.analyze)
app.command("bench")(_bench.bench)
app.command("audit")(_audit.audit)
app.command("view")(_view.view)
app.command("experiment")(_experiment.experiment)
app.command("patch")(_patch.patch)
app.command("circuit")(_circuit.circuit)


def main() -> None:
    """Entry point of the ``headlab`` script."""
    app()
