"""``headlab params``: parameters, FLOPs and W_QK rank bound by variant and number of heads.

The counts are read off the layer each preset builds (``headlab.layer.accounting``), the
sentences of ``--explain`` are the report's parameter section's, and the checks of the options
are the library's. A (variant, heads) pair that the variant cannot build (e.g. ``narrow`` needs
n_heads to divide d_model) is an error (exit 2) when the variant was named with ``--variants``;
in the default run over every variant it is skipped and reported under the table (and in the
JSON's ``skipped`` list), never dropped silently. The JSON document is described in docs/params.md.
"""

from __future__ import annotations

from typing import Annotated

import typer

from headlab.cli.options import int_list

DEFAULT_HEADS = "1,2,4,8,16"


def _parse_variants(text: str | None) -> list[str] | None:
    """The --variants names, checked by the library (``headlab.layer.presets.check_presets``)."""
    from headlab.layer.presets import check_presets

    if text is None:
        return None
    try:
        return check_presets([part.strip() for part in text.split(",")])
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--variants") from exc


def _per_head(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def params(
    d_model: Annotated[int, typer.Option("--d-model", min=1, help="Model width.")] = 512,
    n_heads: Annotated[str, typer.Option("--n-heads", help="Comma-separated numbers of heads.")] = DEFAULT_HEADS,
    variants: Annotated[
        str | None,
        typer.Option("--variants", help="Comma-separated variants (default: all): wide, narrow, shared, bilinear, "
                     "collaborative, grouped-query, multi-query, talking-heads."),
    ] = None,
    seq: Annotated[
        int, typer.Option("--seq", min=1, help="Sequence length L for the FLOPs (self-attention, batch 1).")
    ] = 128,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON document (docs/params.md) instead of the table.")
    ] = False,
    explain: Annotated[
        bool, typer.Option("--explain", help="Add one sentence per variant saying why its count moves.")
    ] = False,
) -> None:
    """Parameters, forward FLOPs and the rank bound of each head's W_QK, by variant and number of heads.

    Exits with status 2 on bad input: an unknown variant, heads that are not positive ints, or a
    number of heads that a variant named with --variants cannot use.
    """
    import json

    from rich.console import Console
    from rich.markup import escape
    from rich.measure import Measurement
    from rich.table import Table

    from headlab.layer.accounting import sweep
    from headlab.report.sections.params import explain_sweep

    head_list = int_list(n_heads, option="--n-heads", minimum=1, example=DEFAULT_HEADS)
    names = _parse_variants(variants)
    try:
        result = sweep(d_model=d_model, n_heads=head_list, variants=names, seq_len=seq)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if result.skipped and names is not None:
        raise typer.BadParameter(
            "; ".join(f"variant {s.variant!r} cannot use n_heads={s.n_heads}: {s.reason}" for s in result.skipped)
            + " (without --variants, such pairs are skipped and listed instead)",
            param_hint="--d-model/--n-heads/--variants",
        )
    if not result.rows:
        raise typer.BadParameter(
            f"no variant can use n_heads {n_heads} at d_model={d_model}: "
            + "; ".join(f"{s.variant} n_heads={s.n_heads}: {s.reason}" for s in result.skipped),
            param_hint="--d-model/--n-heads",
        )
    notes = [f"skipped {s.variant} at n_heads={s.n_heads}: {s.reason}" for s in result.skipped]

    if as_json:
        document = result.to_dict() | ({"explanations": explain_sweep(result)} if explain else {})
        typer.echo(json.dumps(document, indent=2))
        err = Console(stderr=True)
        for note in notes:
            err.print(escape(note))
        return

    table = Table(title=f"headlab params: d_model={d_model}, FLOPs for L={seq} (self-attention, batch 1)")
    for column in ("variant", "heads", "kv heads", "q·k width", "parameters", "per head", "FLOPs", "rank W_QK ≤"):
        table.add_column(column, justify="left" if column == "variant" else "right", no_wrap=True)
    previous = None
    for row in result.rows:
        a, c = row.accounting, row.accounting.config
        if previous is not None and row.variant != previous:
            table.add_section()
        previous = row.variant
        table.add_row(row.variant, str(c.n_heads), str(c.n_kv_heads), str(row.qk_dim), f"{a.total_parameters:,}",
                      _per_head(a.parameters_per_head), f"{a.total_flops:,}", str(a.qk_rank_bound))
    console = Console()
    needed = Measurement.get(console, console.options.update_width(10_000), table).maximum
    if needed > console.width:  # never truncate a number: let a narrow terminal wrap the lines instead
        console = Console(width=needed)
    console.print(table)
    console.print("FLOPs: 2 per multiply-add of the projections, scores, weighted sum (and talking-heads "
                  "mixing); softmax and other element-wise work not counted.", style="dim")
    for note in notes:
        console.print(escape(note))
    if explain:
        for name, sentence in explain_sweep(result).items():
            console.print(f"[bold]{escape(name)}[/bold]: {escape(sentence)}")
