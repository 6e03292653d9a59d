"""Run a model once on a few tokens and record what its attention calls and projections did.

``attach`` learns from this one forward, rather than from a table of architectures, which
modules call the attention function (in the order they run: the layers), each one's head
geometry and causality, which projection takes the heads' z right after the call (the output
projection), and which projections inside the module ran before it (the q/k/v projections,
whose layout ``headlab.models.layout`` reads off their outputs).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor, nn

from headlab.models import multimodal
from headlab.models.audio import FEATURES, feature_shape
from headlab.models.calls import AttentionCall, ProjectionCall
from headlab.models.handle import evaluating, token_embedding
from headlab.models.interface import observing
from headlab.models.seq2seq import takes_decoder_ids

PROBE_LENGTH = 6  # tokens per probe item (image tokens not counted)
PROBE_BATCH = 2
_active: ContextVar[object | None] = ContextVar("headlab_probe", default=None)  # the recording of this context


def probe_inputs(model: nn.Module) -> dict[str, Tensor]:
    """A small batch of inputs the model accepts, on its device.

    Token ids (no padding, no special meaning); for a model whose main input is an image
    (``main_input_name == "pixel_values"``) seeded random pixels of its configured size; for one whose main
    input is log-mel features (``"input_features"``: Whisper) seeded random features ``(batch, n_mels, frames)``
    of the length its encoder requires (``headlab.models.audio.feature_shape``). An encoder-decoder's decoder
    gets token ids shorter than the encoder's input, so its cross calls tell from its self calls. A model of
    several towers (``headlab.models.multimodal``) gets every tower's input, so that all of them run: token ids and
    pixels of its vision tower's size, one image per item, the ids holding the image's tokens after their first
    token where the text has a place for it (Gemma 3, LLaVA: as many as ``get_image_features`` gives one image).

    Returns:
        The keyword arguments of a forward.

    Raises:
        ValueError: a main input of another kind, or a size the model does not tell (the message names it).
    """
    config = getattr(model, "config", None)
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    dtype = parameter.dtype if parameter is not None else None
    takes = getattr(model, "main_input_name", "input_ids")
    if takes not in ("input_ids", "pixel_values", FEATURES):
        raise ValueError(f"{type(model).__name__} takes {takes} (not token ids, pixels or log-mel features), which "
                         "headlab cannot probe yet")
    generator = torch.Generator().manual_seed(0)
    if takes == "pixel_values":
        size, channels = getattr(config, "image_size", None), getattr(config, "num_channels", 3)
        if not isinstance(size, int):
            raise ValueError(f"{type(model).__name__}: cannot tell its image size (config.image_size)")
        pixels = torch.randn(PROBE_BATCH, channels, size, size, generator=generator)
        return {"pixel_values": pixels.to(device=device, dtype=dtype)}
    if multimodal.vision_config(model) is not None:
        pixels = torch.randn(PROBE_BATCH, *multimodal.image_shape(model), generator=generator)
        return _with_image(model, _token_ids(model, config, device), pixels.to(device=device, dtype=dtype))
    if takes == FEATURES:
        features = torch.randn(PROBE_BATCH, *feature_shape(model), generator=generator)
        inputs = {FEATURES: features.to(device=device, dtype=dtype)}
        if takes_decoder_ids(model):  # the encoder has max_source_positions positions, more than these
            inputs["decoder_input_ids"] = _token_ids(model, config, device)[:, : PROBE_LENGTH - 2]
        return inputs
    input_ids = _token_ids(model, config, device)
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    if getattr(config, "is_encoder_decoder", False):  # the decoder shorter than the encoder: cross calls tell
        inputs["decoder_input_ids"] = input_ids[:, : PROBE_LENGTH - 2]
    return inputs


def _token_ids(model: nn.Module, config: Any, device: torch.device) -> Tensor:
    """``(PROBE_BATCH, PROBE_LENGTH)`` token ids of the model's vocabulary (its text tower's), none of them a special
    token or an image token.

    Raises:
        ValueError: a model whose vocabulary size cannot be told.
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    vocab = getattr(token_embedding(model), "num_embeddings", None) or getattr(text, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"{type(model).__name__}: cannot tell its vocabulary size; headlab probes text models "
                         "through their input ids")
    avoid = {getattr(text, name, None) for name in ("pad_token_id", "bos_token_id", "eos_token_id")}
    avoid |= {getattr(config, name, None) for name in ("pad_token_id", "bos_token_id", "eos_token_id")}
    avoid.add(multimodal.image_token(model))
    ids = [i for i in range(3, 3 + 64) if i % vocab not in avoid][: PROBE_BATCH * PROBE_LENGTH]
    return torch.tensor(ids, device=device).remainder(vocab).view(PROBE_BATCH, PROBE_LENGTH)


def _with_image(model: nn.Module, input_ids: Tensor, pixels: Tensor) -> dict[str, Tensor]:
    """The inputs of a forward of a model of several towers: ``input_ids``, with one image's tokens after each item's
    first token where the text has a place for the image, their attention mask and ``pixels``
    ``(PROBE_BATCH, channels, height, width)``."""
    token = multimodal.image_token(model)
    if token is not None:
        image = torch.full((len(input_ids), _tokens_per_image(model, pixels)), token, dtype=input_ids.dtype,
                           device=input_ids.device)
        input_ids = torch.cat([input_ids[:, :1], image, input_ids[:, 1:]], dim=1)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "pixel_values": pixels}


def _tokens_per_image(model: nn.Module, pixels: Tensor) -> int:
    """How many image tokens one image takes in the text: the features the model's ``get_image_features`` gives it
    (Gemma 3's ``mm_tokens_per_image``; LLaVA's patches, with the CLS token or without it as its
    ``vision_feature_select_strategy`` says).

    Raises:
        ValueError: the model puts images in its text but has no ``get_image_features``, or its vision tower does
            not run on one image ``(1, channels, height, width)`` (it takes several per item, or more inputs).
    """
    name = type(model).__name__
    get = getattr(model, "get_image_features", None)
    if not callable(get):
        raise ValueError(f"{name} puts images in its text (config.image_token_id) but has no get_image_features: "
                         "cannot tell how many image tokens an image takes")
    try:
        with evaluating(model, grad=False):
            features = get(pixel_values=pixels[:1])
    except (TypeError, ValueError, RuntimeError) as err:  # the tower's own words, on one line
        why = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(f"{name}: its vision tower (config.vision_config) does not run on one image "
                         f"{tuple(pixels[:1].shape)} of its image size ({why}), which is how headlab runs it") from err
    pooled = getattr(features, "pooler_output", features)  # (1, tokens, d_model), or one (tokens, d_model) per image
    return int(pooled[0].shape[0])


def first_output(output: Any) -> Tensor:
    """The first tensor of a model's output (logits or last hidden state)."""
    if isinstance(output, Tensor):
        return output
    first = output[0] if isinstance(output, (tuple, list)) else output.to_tuple()[0]
    return first


@contextmanager
def recording(model: nn.Module) -> Iterator[list[AttentionCall]]:
    """Record every call of headlab's attention function and every Linear/Conv1D forward of ``model``
    that runs in this thread (this context) while the block lasts.

    Nothing global changes: headlab's attention function reports its calls to the observer of the
    current context (``headlab.models.interface.observing``), and ``model``'s own projections carry
    hooks that record only in the context that set them. Another thread running the same model, or
    another model, records nothing.

    Yields:
        The list the calls are appended to, in the order they ran.
    """
    from transformers.pytorch_utils import Conv1D

    calls: list[AttentionCall] = []
    pending: list[ProjectionCall] = []
    marker = object()

    def observer(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None,
                 output: Tensor) -> None:
        if calls:
            calls[-1].after = list(pending)
        calls.append(AttentionCall(module, query, key, value, mask, output, before=list(pending)))
        pending.clear()

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if _active.get() is marker and args and isinstance(args[0], Tensor) and isinstance(output, Tensor):
            pending.append(ProjectionCall(module, args[0], output))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (nn.Linear, Conv1D))]
    token = _active.set(marker)
    try:
        with observing(observer):
            yield calls
    finally:
        _active.reset(token)
        for handle in handles:
            handle.remove()
        if calls:
            calls[-1].after = list(pending)


def run_probe(model: nn.Module) -> tuple[list[AttentionCall], Tensor]:
    """Run ``model`` once on ``probe_inputs`` in eval mode without gradients (its mode is restored).

    Returns:
        The attention calls in the order they ran, and the model's first output.
    """
    inputs = probe_inputs(model)
    with evaluating(model, grad=False), recording(model) as calls:
        output = first_output(model(**inputs))
    return calls, output
