"""``headlab audit PATH.py:ClassName``: what an attention module is, from the running module alone.

Exit status: 0 audited; 1 the module itself failed (its file, constructor or forward raised or
called sys.exit, it computed no attention, stacked attentions or an output of the wrong shape),
an internal error, or Ctrl-C; 2 bad arguments (PATH.py:ClassName, --init, --factory, --call,
--d-model, --seed). Every failure is one line on stderr that names the fix; with ``--json`` stdout
also gets a JSON error object. The JSON documents are described in docs/audit.md.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from headlab.cli.errors import fail
from headlab.cli.options import check_seed

if TYPE_CHECKING:
    from headlab.audit import AuditResult

_CALLS = ("self", "qkv", "vkq")
MAX_D_MODEL = 65_536  # wider than any published model: a larger --d-model is a typo, and the probes would not fit


def _int(text: str, option: str) -> int:
    """``text`` as an int, or a BadParameter naming the option (parsed here so that --json reports it too)."""
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise typer.BadParameter(f"{text!r} is not an int", param_hint=option)
    return int(text)


def _stop(kind: str, message: str, code: int, as_json: bool) -> NoReturn:
    """One line on stderr (``headlab.cli.errors.fail``); with --json, the error object on stdout first."""
    if as_json:
        import json

        flat = " ".join(message.split())
        typer.echo(json.dumps({"error": {"kind": kind, "message": flat, "exit_status": code}}, indent=2))
    fail(message, code=code)


def audit(
    target: Annotated[str, typer.Argument(
        metavar="PATH.py:ClassName",
        help="A Python file and the nn.Module class in it. The file is EXECUTED (imported, running its top-level "
             "code) and the class constructed, so audit only files you trust.")],
    init: Annotated[str | None, typer.Option(
        "--init", metavar="JSON",
        help="Constructor keyword arguments as a JSON object, e.g. '{\"embed_dim\": 64, \"num_heads\": 8}'; a nested "
             "object builds a config object, e.g. '{\"config\": {\"n_embd\": 64, \"n_head\": 4}}'.")] = None,
    factory: Annotated[str | None, typer.Option(
        "--factory", metavar="module:function",
        help="Build the module by calling this function (with the --init arguments) instead of the class; module is "
             "a file next to PATH.py, a .py path or an installed module.")] = None,
    call: Annotated[str | None, typer.Option(
        "--call", metavar="self|qkv|vkq",
        help="How to call it: self = forward(x), qkv = forward(query, key, value), vkq = forward(values, keys, "
             "query, mask). Detected when left out.")] = None,
    d_model: Annotated[str | None, typer.Option(
        "--d-model", metavar="N",
        help="Input width; needed only when the sizes in its parameters do not give it.")] = None,
    seed: Annotated[str, typer.Option(
        "--seed", metavar="INT",
        help="Seeds torch before the module is built, and the random probe inputs (an int ≥ 0).")] = "0",
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print one JSON document (docs/audit.md) instead of the verdict and tables; on failure, a "
                       "JSON error object.")] = False,
) -> None:
    """Audit any attention module: heads, head size, what each head reads, shared weights, causality.

    Runs the module on probe inputs while intercepting its softmax / scaled_dot_product_attention /
    nn.MultiheadAttention call, recovers each head's W_QK and W_OV, and offers the equivalent
    headlab layer, verified by equal outputs. PATH.py is executed to build the module; nothing
    else runs it.
    """
    import contextlib
    import sys

    import torch

    from headlab.audit import AuditError, LoadError, load_module
    from headlab.audit import audit as run_audit
    from headlab.audit.loading import parse_factory, parse_init, parse_spec

    try:
        seed_value = check_seed(_int(seed, "--seed"))
        if call is not None and call not in _CALLS:
            raise typer.BadParameter(f"{call!r} is not one of {', '.join(_CALLS)}", param_hint="--call")
        width = None if d_model is None else _int(d_model, "--d-model")
        if width is not None and not 1 <= width <= MAX_D_MODEL:
            raise typer.BadParameter(f"{width} is not in [1, {MAX_D_MODEL:,}]", param_hint="--d-model")
        for check, value, hint in ((parse_spec, target, "PATH.py:ClassName"), (parse_init, init, "--init"),
                                   (parse_factory, factory, "--factory")):
            if value is not None:
                try:
                    check(value)
                except LoadError as exc:
                    raise typer.BadParameter(str(exc), param_hint=hint) from None
    except typer.BadParameter as exc:
        if not as_json:
            raise
        _stop("bad-argument", f"{exc.format_message()} (see 'headlab audit --help')", 2, as_json)

    # With --json, whatever the user's file prints goes to stderr: stdout holds the one document.
    quiet = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    try:
        with quiet:
            builds = []
            for _ in range(2):  # two constructions with the same seed: the audit says if they differ
                torch.manual_seed(seed_value)  # the module's initial weights: the same command gives the same audit
                builds.append(load_module(target, init=parse_init(init), factory=factory))
            result = run_audit(builds[0], call=call, d_model=width, seed=seed_value, rebuilt=builds[1],
                               progress=not as_json and sys.stderr.isatty())
    except LoadError as exc:
        hint = "--factory" if factory is not None and "--factory" in str(exc) else \
            "--init" if "--init" in str(exc) else "PATH.py:ClassName"
        if not as_json:
            raise typer.BadParameter(str(exc), param_hint=hint) from None
        _stop("bad-argument", f"Invalid value for {hint}: {exc}", 2, as_json)
    except AuditError as exc:
        _stop(exc.kind, str(exc), 1, as_json)
    except SystemExit as exc:  # the module's forward called sys.exit: the module failed, not headlab
        _stop("raised", f"{target}: the module called sys.exit({exc.code!r}) while being audited; expected a forward "
              "that returns", 1, as_json)
    except ValueError as exc:  # d_model could not be inferred
        _stop("bad-argument", f"Invalid value for --d-model: {exc}", 2, as_json)
    except Exception as exc:  # noqa: BLE001 - a bug in headlab: still one line, never a traceback
        _stop("internal", f"the audit stopped on {type(exc).__name__}: {exc}; this is a bug in headlab, please "
              f"report it with the module audited ({target})", 1, as_json)

    if as_json:
        import json

        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    _print(result, target)


_NUMBER = re.compile(r"[-+\[(]*\d[\d.,:e+\-\])]*")  # 1.2e-03, 16,640, [24:32): never broken across lines


def _print(result: AuditResult, target: str) -> None:
    """The verdict lines, then the evidence tables; a column is never narrower than its longest number."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from headlab.audit.tables import head_table, measurement_table

    console = Console()
    console.print(f"[bold]{escape(result.module)}[/bold] ({escape(target)})")
    for line in result.verdict:
        console.print(f"• {escape(line)}")
    for title, (headers, rows) in (
            ("Per head (Δ: difference from head 0, relative to the largest entry; docs/audit.md)", head_table(result)),
            ("Measurements", measurement_table(result))):
        table = Table(title=title)
        for i, header in enumerate(headers):
            numbers = [w for cell in [header, *(row[i] for row in rows)] for w in cell.split() if _NUMBER.fullmatch(w)]
            table.add_column(header, overflow="fold", min_width=max(map(len, numbers), default=None))
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)
