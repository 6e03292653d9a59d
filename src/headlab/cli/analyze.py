"""``headlab analyze``: roles, patterns, similarity, sinks, retrieval and streaming heads, importance and syntax
of a model's heads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from headlab.cli.errors import INPUT_ERRORS, fail
from headlab.cli.loading import load_model
from headlab.cli.options import LAYERS_HELP, head_selection, int_list
from headlab.cli.output import output_folder, staged_folder

if TYPE_CHECKING:
    from headlab.analysis.result import AnalysisResult
    from headlab.report.tables import DisplayTable


def analyze(
    model: Annotated[str | None, typer.Argument(
        help="Checkpoint directory or hub id; default: the packaged MiniLM.")] = None,
    text: Annotated[Path | None, typer.Option(
        "--text", help="Corpus file, one item per line; default: bundled.")] = None,
    images: Annotated[Path | None, typer.Option(
        "--images", help="For an image model (a vision transformer whose checkpoint holds preprocessor_config.json): "
                         "the corpus, a folder of images (.png, .jpg, ...) or one image file; no default (none is "
                         "bundled). What only means something for text is skipped, with the reason.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for heads.json/.csv, relations.csv, plots; replaced as "
                                                    "a whole, so new, empty, or an earlier analysis.")] = Path(
        "analysis"),
    layers: Annotated[str | None, typer.Option("--layers", help=f"Layers to analyse: {LAYERS_HELP}.")] = None,
    heads: Annotated[str | None, typer.Option("--heads", help="Heads to analyse in each layer, e.g. 0,3.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Small budgets: 60 items (texts or images), no exact "
                                                        "ablation.")] = False,
    importance: Annotated[bool, typer.Option("--importance/--no-importance", help="Importance and pruning.")] = True,
    syntax: Annotated[bool, typer.Option("--syntax/--no-syntax", help="Dependency syntax (needs spaCy).")] = True,
    streaming: Annotated[bool, typer.Option("--streaming/--no-streaming", help="Also retrieval heads (causal "
                                                                               "language models) and the streaming-"
                                                                               "head simulation, every head: one "
                                                                               "forward per head and window.")] = False,
    engine: Annotated[str, typer.Option("--engine", help="Where the capture pass runs: local (this process) or "
                                                         "ray (the corpus in shards on Ray workers; docs/scaling.md; "
                                                         "needs the extra ray: pip install headlab\\[ray]).")
                      ] = "local",
    address: Annotated[str | None, typer.Option("--address", help="With --engine ray: join the Ray cluster at "
                                                                  "ADDR (auto, host:port); default: start a local "
                                                                  "Ray on this machine.")] = None,
    workers: Annotated[str | None, typer.Option("--workers", help="With --engine ray: Ray workers of one thread "
                                                                  "each; default: one per CPU.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the per-head rows as JSON on stdout.")] = False,
) -> None:
    """Measure what every head does (Clark et al. 2019; Kovaleva et al. 2019; Michel et al. 2019; Kobayashi et al.
    2020; Xiao et al. 2023; Wu et al. 2024; DuoAttention 2024).

    Exits with status 2 on bad input (the model, the corpus, --out, the selection, the engine and
    its options; all checked before the analysis runs) and 1 when interrupted (--out left as it was).
    """
    from rich.console import Console
    from rich.markup import escape

    from headlab.analysis.analyze import ENGINES, check_engine
    from headlab.analysis.analyze import analyze as run_analysis
    from headlab.capture.corpus import load_corpus
    from headlab.capture.distributed import ShardError
    from headlab.models.images import takes_pixels
    from headlab.report.tables import to_rich

    selection = head_selection(layers, heads)
    if engine not in ENGINES:
        raise typer.BadParameter(f"{engine!r} is not one of {', '.join(ENGINES)}", param_hint="--engine")
    n_workers = None if workers is None else int_list(workers, option="--workers", minimum=1, example="2")
    if n_workers is not None and len(n_workers) != 1:
        raise typer.BadParameter(f"{workers!r} is a list; expected one positive int, e.g. 2", param_hint="--workers")
    for option, value in (("--address", address), ("--workers", workers)):
        if value is not None and engine != "ray":
            raise typer.BadParameter(f"{value!r} is for the Ray engine; expected --engine ray with it (got "
                                     f"--engine {engine})", param_hint=option)
    try:  # Ray installed, and the cluster's address answering, before any work
        check_engine(engine, address=address, workers=None if n_workers is None else n_workers[0])
    except ImportError as err:
        fail(f"--engine ray: {err}")
    except INPUT_ERRORS as err:
        fail(f"--address: {err}")
    if images is not None:
        if text is not None:
            raise typer.BadParameter("give one corpus: --text for a text model, --images for an image model",
                                     param_hint="--images")
        if not images.exists():
            raise typer.BadParameter(f"{str(images)!r}: no such file or folder; expected a folder of images or an "
                                     "image file", param_hint="--images")
        if engine != "local":
            raise typer.BadParameter("the Ray engine shards text corpora; analyse images with --engine local",
                                     param_hint="--engine")
    output_folder(out, owner="heads.json")
    try:
        corpus = load_corpus(text) if images is None else images
    except INPUT_ERRORS as err:
        fail(str(err))
    console = Console(stderr=as_json)
    with staged_folder(out) as work:
        loaded = load_model(model, images=True)  # an architecture headlab cannot serve is refused here, with the reason
        if takes_pixels(loaded.model) and images is None:
            fail(f"{loaded.source}: {loaded.architecture} takes images, and headlab bundles none: give a folder of "
                 "images with --images FOLDER")
        if images is not None and not takes_pixels(loaded.model):
            fail(f"--images is for an image model; {loaded.source} ({loaded.architecture}) reads text: give its corpus "
                 "with --text FILE")
        try:
            result = run_analysis(loaded, corpus, heads=selection, quick=quick, importance=importance,
                                  syntax=syntax, streaming=streaming, engine=engine, address=address,
                                  workers=None if n_workers is None else n_workers[0], progress=not as_json)
        except INPUT_ERRORS as err:
            fail(str(err))
        except ShardError as err:  # a shard's bad input (2), or a worker that kept dying (1): named, never dropped
            fail(str(err), code=1 if err.worker_died else 2)
        paths = [out / path.relative_to(work) for path in result.write(work)]
    if as_json:
        typer.echo(result.to_json())
        return

    summary = result.summary()
    items, tokens = ("images", "positions") if result.grid is not None else ("items", "tokens")
    console.print(f"{summary['items']} {items}, {summary['tokens']} {tokens}, {summary['heads']} heads"
                  + (f"; {summary['truncated']} items truncated" if summary["truncated"] else ""))
    for shown in _tables(result, summary["class_shares"]):
        console.print(to_rich(shown))
    if result.importance_spearman is not None:
        console.print(f"Spearman(|gradient importance|, |ablation|) = {result.importance_spearman:.3f}")
    for part, reason in result.skipped.items():
        console.print(f"[yellow]skipped[/yellow] {escape(part)}: {escape(reason)}")
    console.print("wrote " + ", ".join(escape(str(p)) for p in paths))


def _tables(result: AnalysisResult, class_shares: dict[str, float]) -> list[DisplayTable]:
    """The tables of the parts that ran (``headlab.report.tables``, as the report shows them): roles, pattern
    classes, dependency relations, the sink heads (raw vs value-weighted attention), the retrieval heads, and the
    streaming conversions per window; for an image model roles and the heads by distance attended."""
    from headlab.report.tables import (
        classes_table,
        patches_table,
        relations_table,
        retrieval_table,
        roles_table,
        sinks_table,
        streaming_table,
    )

    if result.grid is not None:
        return [roles_table(result.roles), patches_table(result.surface)]
    tables = [roles_table(result.roles), classes_table(class_shares)]
    if result.syntax is not None:
        tables.append(relations_table(result.syntax))
    if result.value_weighted is not None and result.sinks is not None:
        tables.append(sinks_table(result.value_weighted, result.sinks))
    context = result.context
    if context is not None and context.retrieval is not None:
        tables.append(retrieval_table(context.retrieval))
    if context is not None:
        tables.append(streaming_table(context.streaming))
    return tables
