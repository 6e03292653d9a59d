"""``headlab circuit``: the edges between heads that carry a behaviour, and how faithful they are."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from headlab.cli.errors import INPUT_ERRORS, fail
from headlab.cli.loading import load_for_pair
from headlab.cli.options import Answer, Clean, Corrupt, MetricName, ModelArgument, Wrong
from headlab.cli.output import output_folder, staged_files

if TYPE_CHECKING:
    pass

METHODS = ("eap", "eap-ig", "path", "exact")  # headlab.circuits.circuit.SCORING, here so that --help stays instant
METRICS = ("logit-diff", "similarity")
FILES = ("circuit.json", "circuit.csv", "circuit.png", "circuit.svg", "scores.json", "scores.csv")


def circuit(
    model: ModelArgument = None,
    clean: Clean = "",
    corrupt: Corrupt = "",
    metric: MetricName = None,
    answer: Answer = None,
    wrong: Wrong = None,
    method: Annotated[str, typer.Option("--method", help="How edges are scored: eap, eap-ig (a few passes), path "
                                                         "or exact (a forward per edge).")] = "eap-ig",
    steps: Annotated[int, typer.Option("--steps", min=1, help="eap-ig: points between the corrupted and clean "
                                                              "inputs.")] = 5,
    top: Annotated[int, typer.Option("--top", min=1, help="Edges in the circuit (largest |score| first).")] = 20,
    out: Annotated[Path, typer.Option("--out", help="Folder for circuit.json/csv/png/svg and scores.json/csv (other "
                                                    "files in it are left alone).")] = Path("circuit"),
    as_json: Annotated[bool, typer.Option("--json", help="Print circuit.json instead of the tables.")] = False,
) -> None:
    """Score every edge between heads (sender head → a later head's q, k or v, or → the output), keep the
    --top edges with the largest |score| as the circuit, and measure its faithfulness.

    eap: 2 forwards, 1 backward; eap-ig: 2 + steps forwards, steps backwards; path: path patching of
    every head → receiver pair (the input's edges by edge patching), a forward per pair; exact: edge
    patching, a forward per edge. Faithfulness: one forward of the clean text in which every edge
    outside the circuit carries its corrupted value (MLPs stay clean), as a share of the clean −
    corrupted gap. Exits with status 2 on bad input (texts of different lengths, an unknown metric
    or method, a logit metric on a model without logits, answers that are not one token, a model of
    several towers (CLIPModel; an encoder-decoder's two streams are served), --out; what needs no model
    is checked before it loads, and a model before any forward) and 1 when interrupted (--out left as
    it was).
    """
    import json

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from headlab.analysis.patching import text_metric
    from headlab.circuits.circuit import faithfulness, score_edges, top_edges
    from headlab.circuits.graph import check_one_stream

    console = Console(stderr=as_json)
    if method not in METHODS:
        raise typer.BadParameter(f"{method!r} is not one of {', '.join(METHODS)}", param_hint="--method")
    if metric is not None and metric not in METRICS:
        raise typer.BadParameter(f"{metric!r} is not one of {', '.join(METRICS)}", param_hint="--metric")
    if not clean.strip() or not corrupt.strip():
        raise typer.BadParameter("--clean and --corrupt are both needed, as non-empty texts (or image files)")
    if metric == "logit-diff" and (answer is None or wrong is None):
        raise typer.BadParameter("the logit-diff metric needs --answer (the clean text's next token) and --wrong "
                                 "(the corrupted text's)", param_hint="--metric")
    output_folder(out)
    with staged_files(out) as work:
        loaded = load_for_pair(model, clean, corrupt, metric=metric)
        try:
            check_one_stream(loaded)  # before the metric's forward
            chosen, described = text_metric(loaded, clean, name=metric, answer=answer, wrong=wrong)
            with _forwards_bar(method in ("path", "exact") and sys.stderr.isatty(), method) as bar:
                scores = score_edges(loaded, clean, corrupt, chosen, method=method, steps=steps, progress=bar)
            found = top_edges(scores, k=top)
            found.details = {"model": loaded.source, "clean": clean, "corrupted": corrupt, "metric": described,
                             "clean_metric": scores.clean_metric, "corrupted_metric": scores.corrupted_metric,
                             "scoring": {"forwards": scores.forwards, "backwards": scores.backwards,
                                         "seconds": scores.seconds, **(scores.details or {})}}
            kept = faithfulness(loaded, clean, corrupt, chosen, found)
        except (*INPUT_ERRORS, KeyError) as err:
            fail(str(err).strip(chr(34)))  # a KeyError's message comes quoted
        found.write(work)
        scores.write(work, name="scores")
    if as_json:
        typer.echo(json.dumps(found.to_dict(), indent=1))
        return
    gap = scores.clean_metric - scores.corrupted_metric
    table = Table(title=f"Circuit: the top {len(found)} of {len(scores):,} edges by {scores.method} ({described})")
    table.add_column("#", justify="right")
    table.add_column("edge")
    table.add_column("score", justify="right")
    table.add_column("effect", justify="right")
    for rank, (edge, score) in enumerate(zip(found.edges, found.scores), 1):
        table.add_row(str(rank), escape(edge.label), f"{score:+.4g}", f"{score / gap:+.3f}")
    console.print(table)
    console.print(f"faithfulness {kept:.3f}: the share of the clean − corrupted gap the circuit keeps with every "
                  f"other edge corrupted (clean {scores.clean_metric:.4g}, corrupted {scores.corrupted_metric:.4g})")
    console.print(f"{scores.method}: {scores.forwards} forwards, {scores.backwards} backwards, {scores.seconds:.2f} s")
    console.print(f"wrote {escape(', '.join(str(out / f) for f in FILES))}")


@contextmanager
def _forwards_bar(enabled: bool, method: str) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr over a method's forwards, updated by ``progress(done, total)``; or None."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("forwards"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"scoring edges ({method})", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)
