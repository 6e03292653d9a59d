"""The MODEL argument of the commands: load it, or stop with one line saying why not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headlab.cli.errors import INPUT_ERRORS, fail

if TYPE_CHECKING:
    import torch

__all__ = ["load_model", "load_for_pair", "quiet_loading"]


def quiet_loading() -> None:
    """Hide transformers' "Loading weights" bar, drawn on every load; download bars stay as they were."""
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from transformers.utils import logging

    downloads_shown = not are_progress_bars_disabled()
    logging.disable_progress_bar()  # also turns off huggingface_hub's bars,
    if downloads_shown:
        enable_progress_bars()  # which a download of a large checkpoint needs


def load_model(model: str | None, *, dtype: torch.dtype | None = None, device: str | None = None,
               images: bool = False, audio: bool = False, given: str = "text", pairs: bool = False) -> Any:
    """``headlab.load(model, dtype=dtype, device=device)`` for a command.

    Args:
        model: the MODEL argument: a checkpoint directory, a hub id, or None for the packaged MiniLM.
        dtype, device: as ``headlab.load`` takes them (None: its defaults).
        images: the command reads images too (``view``, ``analyze``): an image model (``main_input_name ==
            "pixel_values"``) is served when it has its image processor; otherwise it is refused as every model
            whose input is not text.
        audio: the command reads audio too (``view``, ``analyze``): an audio model (``main_input_name ==
            "input_features"``: Whisper) is served when it has its feature extractor; otherwise refused likewise.
        given: what the command was given, "text" or "images": a model of several towers that needs both
            (CLIP, SigLIP) is loaded as its tower of that input (``headlab.load(..., tower=)``), as every
            command runs one input.
        pairs: the command was given (source, target) pairs: a model that is not a text encoder-decoder (BART,
            Marian, T5), or one without a fast tokenizer, is refused.

    Returns:
        The ``HeadedModel``.

    Raises:
        typer.Exit: code 2, after one line naming the model and why it cannot be used (missing,
            not a checkpoint, not cached offline, an architecture headlab cannot serve, a model
            whose input is not text (an image model with ``images``, an audio model with ``audio``: one without its
            image processor or feature extractor, which names the file to add), pairs for a model that cannot read
            them, the default model not installed).
    """
    import headlab
    from headlab.models.audio import FEATURES, feature_extractor
    from headlab.models.images import PIXELS, image_processor
    from headlab.models.loading import checkpoint_config
    from headlab.models.multimodal import needs_pixels

    quiet_loading()
    try:
        # text and images in every forward (CLIP): the tower of the command's input
        tower = ("vision" if given == "images" else "text") if needs_pixels(checkpoint_config(model)) else None
        loaded = headlab.load(model, dtype=dtype, device=device, tower=tower)
    except (*INPUT_ERRORS, ModuleNotFoundError) as err:
        fail(str(err))
    if pairs:
        _check_pairs(loaded)
    takes = getattr(loaded.model, "main_input_name", "input_ids")
    preprocessor = {PIXELS: image_processor, FEATURES: feature_extractor}.get(takes)
    if preprocessor is not None and (images if takes == PIXELS else audio):
        try:
            preprocessor(loaded.tokenizer, architecture=loaded.architecture, source=loaded.source)
        except TypeError as err:
            fail(f"{loaded.source}: {err}")
        return loaded
    if takes != "input_ids":  # the command reads text
        served = ("images are read by headlab view, analyze --images, patch and circuit" if takes == PIXELS
                  else "audio is read by headlab view and headlab analyze --audio" if takes == FEATURES
                  else "the commands read text, images and audio only")
        fail(f"{loaded.source}: {loaded.architecture} takes {takes}, not text; this command reads text ({served}): use "
             "the library on its inputs (headlab.attach, run_with_cache)")
    return loaded


def load_for_pair(model: str | None, clean: str, corrupt: str, *, metric: str | None) -> Any:
    """``load_model`` for the commands that compare a clean and a corrupted input (``patch``, ``circuit``): a text
    model reads ``--clean`` and ``--corrupt`` as texts, an image model as image files (of one size after its image
    processor), compared by the similarity of its output to the clean image's.

    Raises:
        typer.Exit: code 2, after one line: what ``load_model`` refuses, or for an image model an input that is not
            a file, or another metric than similarity.
    """
    from pathlib import Path

    from headlab.models.images import takes_pixels

    def is_file(value: str) -> bool:
        try:
            return Path(value).is_file()
        except OSError:  # a long text is no file name
            return False

    loaded = load_model(model, images=True, given="images" if is_file(clean) else "text")
    if takes_pixels(loaded.model):
        for option, value in (("--clean", clean), ("--corrupt", corrupt)):
            if not is_file(value):
                fail(f"{option} {value!r}: {loaded.architecture} takes images; expected an image file")
        if metric not in (None, "similarity"):
            fail(f"--metric {metric}: an image model is compared by the similarity of its output to the clean "
                 "image's (--metric similarity)")
    return loaded


def _check_pairs(loaded: Any) -> None:
    """Stop (code 2, one line) unless ``loaded`` reads (source, target) pairs: a text encoder-decoder with a fast
    tokenizer."""
    from headlab.capture.encoding import backend_tokenizer
    from headlab.capture.run import check_pairs

    try:
        check_pairs(loaded)
        if loaded.tokenizer is None:
            raise TypeError(f"{loaded.architecture} has no tokenizer to read the pairs' texts with")
        backend_tokenizer(loaded.tokenizer)
    except (ValueError, TypeError) as err:
        fail(f"{loaded.source}: {err}")
