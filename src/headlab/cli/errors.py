"""How the commands stop: one line on stderr, exit status 2 for bad input and 1 for Ctrl-C.

Every error a user can cause prints ``error: <what was wrong and what was expected>`` on one
line (never a traceback), so that it reads the same in a terminal, a log and a test. Usage
errors that click (inside typer) raises itself (an unknown option, ``min=`` checks, ``typer.BadParameter``)
go through :class:`Commands`, the app's group, which prints them the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

__all__ = ["INPUT_ERRORS", "Commands", "fail", "interrupted"]

# click's UsageError, the base of typer.BadParameter: recent typers vendor click and do not export it.
_UsageError: Any = typer.BadParameter.__mro__[1]

# What the library raises for input it cannot use (a corpus, a checkpoint, a selection): caught by
# the commands around their library calls and printed by `fail`. FileNotFoundError and
# NotADirectoryError are OSErrors.
INPUT_ERRORS = (ValueError, OSError)


def _say(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    # soft_wrap: one line however long; the terminal wraps it, rich does not insert newlines.
    Console(stderr=True).print(escape(message), soft_wrap=True, highlight=False)


def fail(message: str, *, code: int = 2) -> NoReturn:
    """Print ``error: message`` as one line on stderr and exit.

    Args:
        message: names the bad value and what was expected; newlines are joined into spaces.
        code: the exit status (2: bad input).

    Raises:
        typer.Exit: always, with ``code``.
    """
    _say("error: " + " ".join(message.split()))
    raise typer.Exit(code=code)


def interrupted(out: Path | None) -> NoReturn:
    """Report a Ctrl-C: ``interrupted; OUT left as it was`` (or ``interrupted``) and exit with status 1.

    Args:
        out: the output the command was writing, or None when it writes none.

    Raises:
        typer.Exit: always, with code 1.
    """
    _say("interrupted" if out is None else f"interrupted; {out} left as it was")
    raise typer.Exit(code=1)


class Commands(TyperGroup):
    """The ``headlab`` group: its commands' usage errors and a stray Ctrl-C as one line each.

    typer's own format spreads a usage error over a usage line, a hint and a boxed message;
    here it is ``error: <click's message> (see 'headlab CMD --help')``, with click's exit status.
    """

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        """The group's own options parsed (``headlab --bogus``: one line, as a command's usage error is)."""
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except _UsageError as err:
            fail(f"{err.format_message().rstrip('.')} (see '{info_name or 'headlab'} --help')", code=err.exit_code)

    # click's Command.invoke takes click's Context (the override's ignore); typer hands its group a typer.Context
    def invoke(self, ctx: typer.Context) -> object:  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except _UsageError as err:
            where = err.ctx.command_path if err.ctx is not None else ctx.command_path
            fail(f"{err.format_message().rstrip('.')} (see '{where} --help')", code=err.exit_code)
        except KeyboardInterrupt:  # a command that writes outputs reports which it left as they were
            interrupted(None)
