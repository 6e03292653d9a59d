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
from typing import Any, cast

import torch
from torch import Tensor, nn

from headlab.models.audio import FEATURES, feature_shape, takes_decoder_ids
from headlab.models.calls import AttentionCall, ProjectionCall
from headlab.models.handle import evaluating
from headlab.models.interface import observing

PROBE_LENGTH = 6  # tokens per probe item
TOWERS = ("text_config", "vision_config", "audio_config")  # a multimodal config's parts
PROBE_BATCH = 2
_active: ContextVar[object | None] = ContextVar("headlab_probe", default=None)  # the recording of this context


def probe_inputs(model: nn.Module) -> dict[str, Tensor]:
    """A small batch of inputs the model accepts, on its device.

    Token ids (no padding, no special meaning); for a model whose main input is an image
    (``main_input_name == "pixel_values"``) seeded random pixels of its configured size; for one whose main
    input is log-mel features (``"input_features"``: Whisper) seeded random features ``(batch, n_mels, frames)``
    of the length its encoder requires (``headlab.models.audio.feature_shape``). An encoder-decoder's decoder
    gets token ids shorter than the encoder's input, so its cross calls tell from its self calls.

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
    """``(PROBE_BATCH, PROBE_LENGTH)`` token ids of the model's vocabulary, none of them a special token.

    Raises:
        ValueError: a model of several towers, or one whose vocabulary size cannot be told.
    """
    try:
        embeddings = cast(Any, model).get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    except NotImplementedError:  # no one input embedding: a model of several towers (CLIP's text and vision)
        towers = [name for name in TOWERS if getattr(config, name, None) is not None]
        if towers:
            raise ValueError(f"{type(model).__name__} is a model of several towers ({', '.join(towers)}) with no one "
                             "input embedding, which headlab does not attach as one yet: attach its text model on "
                             "its own (the submodule whose input is the token ids)") from None
        embeddings = None
    vocab = getattr(embeddings, "num_embeddings", None) or getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < 2:
        raise ValueError(f"{type(model).__name__}: cannot tell its vocabulary size; headlab probes text models "
                         "through their input ids")
    avoid = {getattr(config, name, None) for name in ("pad_token_id", "bos_token_id", "eos_token_id")}
    ids = [i for i in range(3, 3 + 64) if i % vocab not in avoid][: PROBE_BATCH * PROBE_LENGTH]
    return torch.tensor(ids, device=device).remainder(vocab).view(PROBE_BATCH, PROBE_LENGTH)


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
