"""``headlab patch``: which heads carry a behaviour, by activation and attribution patching."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from headlab.cli.errors import INPUT_ERRORS, fail
from headlab.cli.loading import load_for_pair
from headlab.cli.options import (
    LAYERS_HELP,
    Answer,
    Clean,
    Corrupt,
    MetricName,
    ModelArgument,
    Wrong,
    head_selection,
)
from headlab.cli.output import output_folder, staged_files


def patch(
    model: ModelArgument = None,
    clean: Clean = "",
    corrupt: Corrupt = "",
    metric: MetricName = None,
    answer: Answer = None,
    wrong: Wrong = None,
    method: Annotated[str, typer.Option("--method", help="exact, attribution, or both.")] = "both",
    layers: Annotated[str | None, typer.Option("--layers", help=f"Layers to patch: {LAYERS_HELP}.")] = None,
    heads: Annotated[str | None, typer.Option("--heads", help="Heads to patch in each layer, e.g. 0,3.")] = None,
    positions: Annotated[str | None, typer.Option("--positions", help="each (every position separately: a head × "
                                                                       "position grid) or positions patched "
                                                                       "together, e.g. 2,5 or -1; default: every "
                                                                       "position at once.")] = None,
    take: Annotated[str, typer.Option("--take", help="What of a head to patch: z, q, k, v (per key/value head) or "
                                                     "pattern (exact only).")] = "z",
    direction: Annotated[str, typer.Option("--direction", help="denoise (the corrupted run receives clean values) "
                                                               "or noise (the clean run receives corrupted "
                                                               "ones).")] = "denoise",
    top: Annotated[int, typer.Option("--top", min=1, help="Rows of the table (largest |effect| first).")] = 10,
    out: Annotated[Path, typer.Option("--out", help="Folder for patching.json and patching.png (other files in it "
                                                    "are left alone).")] = Path("patching"),
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON document instead of the table.")] = False,
) -> None:
    """Patch each head's z from the clean run into the corrupted one and measure the metric's recovery.

    exact: one forward per head (activation patching); attribution: two forwards and one
    backward for every head (AtP, Kramár et al. 2024); both: both, with their rank correlation.
    --positions each patches every position separately (one forward per head and position for
    exact) and draws a head × position heatmap; --take patches a head's q, k, v or pattern instead
    of its z; --direction noise gives the clean run the corrupted values (effect: the share of the
    clean − corrupted gap lost). Exits with status 2 on bad input (texts of different lengths, an
    unknown metric, method, take or direction, positions out of range, answers that are not one
    token, a bad selection, the model, --out; what needs no model is checked before it loads) and
    1 when interrupted (--out left as it was).
    """
    import json

    import numpy as np
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from headlab.analysis.importance import spearman
    from headlab.analysis.patching import activation_patching, attribution_patching, plot_patching, text_metric
    from headlab.analysis.positions import DIRECTIONS, TAKES, row_label

    console = Console(stderr=as_json)
    methods = {"exact": ("exact",), "attribution": ("attribution",), "both": ("exact", "attribution")}
    selection = head_selection(layers, heads)
    if method not in methods:
        raise typer.BadParameter(f"{method!r} is not one of {', '.join(methods)}", param_hint="--method")
    if take not in TAKES:
        raise typer.BadParameter(f"{take!r} is not one of {', '.join(TAKES)}", param_hint="--take")
    if direction not in DIRECTIONS:
        raise typer.BadParameter(f"{direction!r} is not one of {', '.join(DIRECTIONS)}", param_hint="--direction")
    if take == "pattern" and method != "exact":
        raise typer.BadParameter("pattern has no attribution estimate; use --method exact", param_hint="--take")
    where = None if positions is None else _positions(positions)
    if not clean.strip() or not corrupt.strip():
        raise typer.BadParameter("--clean and --corrupt are both needed, as non-empty texts (or image files)")
    output_folder(out)
    with staged_files(out) as work:
        loaded = load_for_pair(model, clean, corrupt, metric=metric)
        try:
            chosen, described = text_metric(loaded, clean, name=metric, answer=answer, wrong=wrong)
            run = {"exact": activation_patching, "attribution": attribution_patching}
            results = [run[m](loaded, clean, corrupt, chosen, heads=selection, positions=where, take=take,
                              direction=direction) for m in methods[method]]
        except (*INPUT_ERRORS, KeyError) as err:
            fail(str(err).strip(chr(34)))  # a KeyError's message comes quoted
        document = {"model": loaded.source, "clean": clean, "corrupted": corrupt, "metric": described,
                    "take": take, "direction": direction, "positions": results[0].positions,
                    "results": [r.to_dict() for r in results]}
        effects = [np.ravel(r.table["effect"] if r.grid is None else r.grid.effect) for r in results]
        if len(results) == 2 and len(effects[0]) >= 2:  # over the heads, or every (head, position) cell; one: none
            document["spearman"] = spearman(*effects)
        (work / "patching.json").write_text(json.dumps(document, indent=2) + "\n")
        plot_patching(results, work / "patching.png", title=f"{clean!r} → {corrupt!r}")
    if as_json:
        typer.echo(json.dumps(document, indent=2))
        return
    first = results[0]
    rows = "Heads and positions" if first.grid is not None else "Heads"
    table = Table(title=f"{rows} by |effect| of {take} ({direction}; {described}; clean {first.clean_metric:.4g}, "
                        f"corrupted {first.corrupted_metric:.4g})")
    table.add_column("key/value head" if take in ("k", "v") else "head")
    if first.grid is None:
        for r in results:
            table.add_column(f"{r.method} effect", justify="right")
        for layer, head in first.table.top("effect", top, absolute=True):
            table.add_row(row_label(layer, head, take), *[f"{r.table.value('effect', layer, head):+.3f}"
                                                          for r in results])
    else:
        table.add_column("position")
        for r in results:
            table.add_column(f"{r.method} effect", justify="right")
        labels = first.grid.labels()
        for layer, head, p in first.grid.top(top):
            table.add_row(row_label(layer, head, take), escape(labels[p]),
                          *[f"{r.grid.value('effect', layer, head, p):+.3f}" for r in results if r.grid is not None])
    console.print(table)
    for r in results:
        console.print(f"{r.method}: {r.forwards} forwards, {r.backwards} backwards, {r.seconds:.2f} s this run "
                      "(one run; headlab bench compares the methods' speed, interleaved)")
    if "spearman" in document:
        console.print(f"Spearman(exact, attribution) = {document['spearman']:.3f}")
    console.print(f"wrote {escape(str(out / 'patching.json'))}, {escape(str(out / 'patching.png'))}")


def _positions(text: str) -> str | list[int]:
    """``--positions``: "each", or comma-separated positions (negative ones count from the end).

    Raises:
        typer.BadParameter: an item that is not an int; the message names it and what was expected.
    """
    if text.strip() == "each":
        return "each"
    out = []
    for part in text.split(","):
        part = part.strip()
        digits = part[1:] if part.startswith("-") else part
        if not (digits.isascii() and digits.isdigit()):
            raise typer.BadParameter(f"{part!r} is not a position (got --positions={text!r}; expected each, or "
                                     "positions such as 2,5 or -1)", param_hint="--positions")
        out.append(int(part))
    return out
