"""``headlab analyze``: roles, patterns, similarity, sinks, retrieval and streaming heads, importance and syntax
of a model's heads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from headlab.cli.errors import INPUT_ERRORS, fail
from headlab.cli.loading import load_model
from headlab.cli.options import LAYERS_HELP, head_selection, int_list, memory_size
from headlab.cli.output import output_folder, staged_folder

if TYPE_CHECKING:
    from headlab.analysis.result import AnalysisResult
    from headlab.report.tables import DisplayTable


def analyze(
    model: Annotated[str | None, typer.Argument(
        help="Checkpoint directory or hub id; default: the packaged MiniLM.")] = None,
    text: Annotated[Path | None, typer.Option(
        "--text", help="Corpus file, one item per line; default: bundled.")] = None,
    pairs: Annotated[Path | None, typer.Option(
        "--pairs", help="For a text encoder-decoder (BART, Marian, T5): the corpus as a pairs file, one pair a line, "
                        "source and target separated by a tab; the encoder reads the source, the decoder the target. "
                        "Cross-attention layers skip the statistics of one text's positions, with the reason.")
                     ] = None,
    images: Annotated[Path | None, typer.Option(
        "--images", help="For an image model (a vision transformer whose checkpoint holds preprocessor_config.json): "
                         "the corpus, a folder of images (.png, .jpg, ...) or one image file; no default (none is "
                         "bundled). What only means something for text is skipped, with the reason.")] = None,
    audio: Annotated[Path | None, typer.Option(
        "--audio", help="For an audio model (Whisper, its checkpoint holding preprocessor_config.json): the corpus, a "
                        "folder of 16-bit PCM WAV files at its sampling rate or one WAV file; no default (none is "
                        "bundled). The decoder reads the model's own transcript (its start token alone without a "
                        "language-model head); what only means something for text is "
                        "skipped, with the reason.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for heads.json/.csv, relations.csv, plots; replaced as "
                                                    "a whole, so new, empty, or an earlier analysis.")] = Path(
        "analysis"),
    layers: Annotated[str | None, typer.Option("--layers", help=f"Layers to analyse: {LAYERS_HELP}.")] = None,
    heads: Annotated[str | None, typer.Option("--heads", help="Heads to analyse in each layer, e.g. 0,3.")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Small budgets: 60 items (texts, images or recordings), no "
                                                        "exact ablation.")] = False,
    importance: Annotated[bool, typer.Option("--importance/--no-importance", help="Importance and pruning.")] = True,
    syntax: Annotated[bool, typer.Option("--syntax/--no-syntax", help="Dependency syntax (needs spaCy).")] = True,
    streaming: Annotated[bool, typer.Option("--streaming/--no-streaming", help="Also retrieval heads (causal "
                                                                               "language models) and the streaming-"
                                                                               "head simulation of the selected heads "
                                                                               "(--layers/--heads): one forward per "
                                                                               "selected head and window.")] = False,
    max_length: Annotated[int | None, typer.Option("--max-length", min=1, help="Most pieces per corpus item (longer "
                                                                               "ones are cut, with a warning); with "
                                                                               "--streaming also the length of its "
                                                                               "chunks and copy cases. Default: the "
                                                                               "model's limit.")] = None,
    max_pattern_memory: Annotated[str | None, typer.Option("--max-pattern-memory", help="Most memory of patterns "
                                                                                        "a batch holds at once (e.g. "
                                                                                        "512MiB): past it the "
                                                                                        "statistics read them in row "
                                                                                        "blocks, memory linear in the "
                                                                                        "length. Default: a quarter "
                                                                                        "of free memory.")] = None,
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
    its options, pairs for a model that is not a text encoder-decoder; all checked before the analysis runs)
    and 1 when interrupted (--out left as it was).
    """
    from rich.console import Console
    from rich.markup import escape

    from headlab.analysis.analyze import ENGINES, check_engine
    from headlab.analysis.analyze import analyze as run_analysis
    from headlab.capture.corpus import load_corpus
    from headlab.capture.distributed import ShardError
    from headlab.models.audio import takes_features
    from headlab.models.images import takes_pixels
    from headlab.report.tables import to_rich

    selection = head_selection(layers, heads)
    pattern_memory = None if max_pattern_memory is None else memory_size(max_pattern_memory,
                                                                         option="--max-pattern-memory")
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
    media = {"--images": (images, "images", "a folder of images or an image file"),
             "--audio": (audio, "recordings", "a folder of WAV files or a WAV file")}
    given = [name for name, (path, _, _) in media.items() if path is not None]
    if len(given) + (text is not None) + (pairs is not None) > 1:
        raise typer.BadParameter("give one corpus: --text for a text model, --pairs for a text encoder-decoder, "
                                 "--images for an image model, --audio for an audio model",
                                 param_hint=given[-1] if given else "--pairs")
    if pairs is not None and engine != "local":
        raise typer.BadParameter("the Ray engine shards corpora of texts; analyse pairs with --engine local",
                                 param_hint="--engine")
    for name in given:
        path, what, expected = media[name]
        if path is not None and not path.exists():
            raise typer.BadParameter(f"{str(path)!r}: no such file or folder; expected {expected}", param_hint=name)
        if engine != "local":
            raise typer.BadParameter(f"the Ray engine shards text corpora; analyse {what} with --engine local",
                                     param_hint="--engine")
    output_folder(out, owner="heads.json")
    try:
        corpus = (load_corpus(pairs, pairs=True) if pairs is not None else load_corpus(text)
                  if images is None and audio is None else images or audio)
    except INPUT_ERRORS as err:
        fail(str(err))
    console = Console(stderr=as_json)
    with staged_folder(out) as work:
        # an architecture headlab cannot serve is refused here, with the reason
        loaded = load_model(model, images=True, audio=True, given="text" if images is None else "images",
                            pairs=pairs is not None)
        reads = "images" if takes_pixels(loaded.model) else "audio" if takes_features(loaded.model) else "text"
        wanted = {"images": "--images", "audio": "--audio"}.get(reads)
        if wanted is not None and media[wanted][0] is None:
            folder = "images" if reads == "images" else "WAV files"
            fail(f"{loaded.source}: {loaded.architecture} takes {reads}, and headlab bundles none: give a folder of "
                 f"{folder} with {wanted} FOLDER")
        for wrong in given:
            if wrong != wanted:
                kind = "an image model" if wrong == "--images" else "an audio model"
                fail(f"{wrong} is for {kind}; {loaded.source} ({loaded.architecture}) reads {reads}: give its corpus "
                     f"with {'--text FILE' if wanted is None else wanted + ' FOLDER'}")
        try:
            result = run_analysis(loaded, corpus, heads=selection, quick=quick, importance=importance,
                                  syntax=syntax, streaming=streaming, max_length=max_length, engine=engine,
                                  max_pattern_memory=pattern_memory,
                                  address=address,
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
    items, tokens = (("images", "positions") if result.grid is not None else ("recordings", "frames holding audio")
                     if result.timeline is not None else ("items", "tokens"))
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
    streaming conversions per window; for an image model roles and the heads by distance attended; for an audio model
    roles."""
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
    if result.timeline is not None:
        return [roles_table(result.roles)]
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
