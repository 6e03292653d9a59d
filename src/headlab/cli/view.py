"""``headlab view``: the interactive attention viewer for one text, as a standalone page or served locally."""

from __future__ import annotations

import json
import os
import re
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer

from headlab.cli.errors import INPUT_ERRORS, fail
from headlab.cli.loading import load_model
from headlab.cli.options import LAYERS_HELP, head_selection
from headlab.cli.output import output_file, staged_files

# A Hugging Face Hub id of the form org/name (one slash, no spaces): read as a model, never as a text.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")

ARGUMENTS_HELP = (
    "[MODEL] TEXT: a checkpoint directory or hub id (default: the packaged MiniLM), then the text. A lone argument "
    "is the TEXT, unless it names a model (an existing directory or an org/name hub id): that is an error, no text "
    "given. With --text FILE the only argument is a MODEL, a directory or an org/name hub id. A TEXT that is an "
    "existing file is refused: read files with --text. MODEL IMAGE...: for an image model (a vision transformer "
    "whose checkpoint holds preprocessor_config.json), one or more images, each an image file (.png, .jpg, ...) or "
    "a folder of them; the page switches between them. MODEL WAV...: for an audio model (Whisper, likewise), one or "
    "more recordings, each a 16-bit PCM WAV file or a folder of them. With --pair SOURCE TARGET (a text "
    "encoder-decoder) the only argument is a MODEL."
)


def _is_dir(arg: str) -> bool:
    return os.path.isdir(os.path.expanduser(arg))  # os.path: False, not OSError, for a text too long to be a path


def _model_and_files(args: list[str]) -> tuple[str | None, list[str]] | None:
    """The MODEL and IMAGEs (or WAVs) of ``ARGUMENTS_HELP`` when every argument after a MODEL is an existing image
    file, WAV file or folder (or a lone argument is such a file), else None: the arguments are a text's."""
    from headlab.models.audio import RECORDINGS
    from headlab.models.images import PICTURES

    def media_file(arg: str) -> bool:
        path = os.path.expanduser(arg)  # os.path: False, not OSError, for a text too long to be a path
        return os.path.isfile(path) and os.path.splitext(path)[1].lower() in PICTURES.suffixes + RECORDINGS.suffixes

    if len(args) == 1 and media_file(args[0]):
        return None, args
    if len(args) >= 2 and all(media_file(arg) or _is_dir(arg) for arg in args[1:]):
        return args[0], args[1:]
    return None


def _model_and_text(args: list[str], text_file: Path | None) -> tuple[str | None, str]:
    """Split the positional arguments by the rule of ``ARGUMENTS_HELP``, reading ``--text`` if given.

    Raises:
        typer.BadParameter: the arguments do not follow the rule, or the text file is missing,
            not UTF-8 text, or blank.
    """
    from headlab.capture.corpus import read_text_file

    if len(args) > 2:
        raise typer.BadParameter(f"expected [MODEL] TEXT, got {len(args)} arguments: {args!r} (quote the text)")
    if text_file is not None:
        if len(args) > 1:
            raise typer.BadParameter(f"with --text, give at most a MODEL, got {len(args)} arguments: {args!r}")
        if args and not (_is_dir(args[0]) or _HUB_ID.fullmatch(args[0])):
            raise typer.BadParameter(f"{args[0]!r} is neither a directory nor an org/name hub id, and --text gives "
                                     "the text already; give the text once, as TEXT or with --text FILE",
                                     param_hint="MODEL")
        try:
            text = read_text_file(text_file)
        except INPUT_ERRORS as err:
            raise typer.BadParameter(str(err), param_hint="--text") from None
        if not text.strip():
            raise typer.BadParameter(f"{str(text_file)!r} holds no text (empty or blank); expected the text to view",
                                     param_hint="--text")
        return (args[0] if args else None), text
    if not args:
        raise typer.BadParameter('give the text to view, e.g. headlab view "The cat sat on the mat.", or --text FILE')
    text = args[-1]
    if os.path.isfile(os.path.expanduser(text)):  # os.path: False, not OSError, for a text too long to be a path
        raise typer.BadParameter(f"{text!r} is a file; to view the text in it, use --text {text}", param_hint="TEXT")
    if len(args) == 1 and (_is_dir(text) or _HUB_ID.fullmatch(text)):
        raise typer.BadParameter(f"no text given: {text!r} names a model; give the text after it, e.g. headlab view "
                                 f'{text} "The cat sat on the mat.", or --text FILE', param_hint="TEXT")
    if not text.strip():
        raise typer.BadParameter("the text is empty or blank; expected the text to view", param_hint="TEXT")
    return (args[0] if len(args) == 2 else None), text


def _model_and_pair(args: list[str], text_file: Path | None,
                    pair: tuple[str, str]) -> tuple[str | None, tuple[str, str]]:
    """The MODEL and the ``--pair`` to view: with ``--pair`` the only argument is a MODEL.

    Raises:
        typer.BadParameter: ``--text`` too, more than one argument, or a side that is empty or blank.
    """
    if text_file is not None:
        raise typer.BadParameter("--pair gives the texts to view; drop --text", param_hint="--pair")
    if len(args) > 1:
        raise typer.BadParameter(f"with --pair, give at most a MODEL, got {len(args)} arguments: {args!r}",
                                 param_hint="--pair")
    for side, text in zip(("SOURCE", "TARGET"), pair):
        if not text.strip():
            raise typer.BadParameter(f"the {side} is empty or blank; expected text on both sides of the pair",
                                     param_hint="--pair")
    return (args[0] if args else None), pair


def view(
    args: Annotated[list[str] | None, typer.Argument(metavar="[MODEL] [TEXT | IMAGE...]", help=ARGUMENTS_HELP,
                                                     show_default=False)] = None,
    text_file: Annotated[Path | None, typer.Option("--text", help="Read the text (all of it, one text) from this "
                                                                  "UTF-8 file instead.")] = None,
    pair: Annotated[tuple[str, str] | None, typer.Option(
        "--pair", metavar="SOURCE TARGET", help="For a text encoder-decoder (BART, Marian, T5): view a source and its "
                                                "target side by side instead of a text (the encoder reads the source, "
                                                "the decoder the target); the only argument is then a MODEL.")
                    ] = None,
    out: Annotated[Path, typer.Option("--out", help="The HTML file to write (replaced if it exists).")] = Path(
        "view.html"),
    serve: Annotated[bool, typer.Option("--serve", help="Serve the page on 127.0.0.1 until Ctrl-C.")] = False,
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port for --serve; 0 picks a free one.")] = 0,
    layers: Annotated[str | None, typer.Option("--layers", help=f"Layers to show (default: all): {LAYERS_HELP}.")
                      ] = None,
    heads: Annotated[str | None, typer.Option("--heads", help="Heads to show in each layer, e.g. 0,3.")] = None,
    flow_max_length: Annotated[int | None, typer.Option(
        "--flow-max-length", min=0, help="Longest text, in pieces, whose attention flow is solved for the flow "
                                         "toggle (cost grows like pieces⁴; default: FLOW_MAX_LENGTH, docs/analysis.md; "
                                         "0: none).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print what the page would show as JSON on stdout (each "
                                                         "item's positions, each shown head's pattern, statistics "
                                                         "and roles) instead of writing the page.")] = False,
) -> None:
    """Write an interactive page: every layer x head as thumbnails, one head open with its pattern,
    what each token attends to and what attends to it, at piece or word level, with each head's
    statistics and role labels measured on the text. For an image model, the image under its patch
    grid: hovering a patch shows the open head's attention from it as heat over the image. For a text encoder-decoder
    given --pair SOURCE TARGET, the source and the target side by side: encoder heads over the source, the decoder's
    self-attention heads over the target, cross-attention heads from target tokens to source tokens. For an audio model
    (Whisper), the encoder's frames as a strip of times beside the decoder's tokens: hovering a token (cross-attention)
    or a frame (the encoder's self-attention) shows the open head's attention from it as heat over the frames.

    Exits with status 2 on bad input (arguments, the text file, --out, the model, the selection;
    checked before the model runs) and 1 when interrupted (--out left as it was).
    """
    import warnings

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from headlab.capture import TruncationWarning
    from headlab.heads import head_label
    from headlab.models.audio import takes_features
    from headlab.models.images import takes_pixels
    from headlab.report.viewer import view_data, viewer_document

    files = None if text_file is not None or pair is not None else _model_and_files(list(args or []))
    viewed: Any
    if pair is not None:
        model, viewed = _model_and_pair(list(args or []), text_file, pair)
    else:
        model, viewed = _model_and_text(list(args or []), text_file) if files is None else files
    selection = head_selection(layers, heads)
    if as_json and serve:
        raise typer.BadParameter("--json prints the data and writes no page; --serve serves the page: give one",
                                 param_hint="--serve")
    if not as_json:
        output_file(out, example="view.html")
    console = Console(stderr=as_json)
    with nullcontext() if as_json else staged_files(out.parent, shown=out) as work:  # --json writes no file
        # an architecture headlab cannot serve is refused here, with the reason
        loaded = load_model(model, images=True, audio=True, given="text" if files is None else "images",
                            pairs=pair is not None)
        pixels, audio = takes_pixels(loaded.model), takes_features(loaded.model)
        if pixels and files is None:
            fail(f"{loaded.source}: {loaded.architecture} takes images, not text: give image files or folders of "
                 f"images after it (headlab view {model} IMAGE...)")
        if audio and files is None:
            fail(f"{loaded.source}: {loaded.architecture} takes audio, not text: give WAV files or folders of them "
                 f"after it (headlab view {model} WAV...)")
        if files is not None and not (pixels or audio):
            fail(f"{files[1][0]!r} is an image, a recording or a folder of them, but {loaded.source} "
                 f"({loaded.architecture}) reads text: give an image or audio model before it (a checkpoint with "
                 "preprocessor_config.json), or a text")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", TruncationWarning)
                limit: dict[str, Any] = {} if flow_max_length is None else {"flow_max_length": flow_max_length}
                data = view_data(loaded, viewed, heads=selection, progress=False, **limit)
        except INPUT_ERRORS as err:
            fail(str(err))
        for warning in caught:  # said as every command says it; the page shows it among its notes
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        warned = {str(warning.message) for warning in caught}
        if work is None:  # --json
            typer.echo(json.dumps(data.readable()))
            return
        (work / out.name).write_text(viewer_document(data), encoding="utf-8")

    item = data.items[0]
    count, unit = ((item.frames.n, "frames") if item.frames is not None
                   else (item.pieces.n + item.target.n, "pieces of source and target") if item.target is not None
                   else (item.pieces.n, "positions" if pixels else "pieces"))
    table = Table(title=f"Roles of {len(data.heads)} heads of {escape(data.name)} on {count} {unit}")
    table.add_column("role")
    table.add_column("heads")
    by_role: dict[str, list[str]] = {}
    for info in data.info:
        for role in info.roles or ("(none)",):
            by_role.setdefault(role, []).append(head_label(info.layer, info.head))
    for role, members in sorted(by_role.items()):
        table.add_row(escape(role), escape(", ".join(members)))
    console.print(table)
    for note in data.notes:
        if note not in warned:
            console.print(f"[yellow]note:[/yellow] {escape(note)}")
    console.print(f"wrote {escape(str(out))} ({out.stat().st_size / 1e6:.1f} MB)")
    if serve:
        from headlab.cli.serving import serve_until_interrupted

        serve_until_interrupted(out, port=port, console=console)
