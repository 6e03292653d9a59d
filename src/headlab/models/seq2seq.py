"""The decoder's inputs of an encoder-decoder (BART, Marian, T5, Whisper): what its decoder reads when the caller
gives only the source, and source/target text pairs.

One rule for every encoder-decoder: given no decoder input, the decoder reads the source shifted one place to
the right behind ``config.decoder_start_token_id`` (what BART does by itself, and T5 needs given); a model whose
source is not token ids (Whisper's features) gets the start token alone. Given ``(source, target)`` text pairs
(``HeadedModel.inputs``), the decoder reads the target, shifted the same way.

Each site reads one or two sides of a pair (``site_sides``): the encoder's self-attention the source, the decoder's
the target, cross-attention target queries over source keys.

Axis legend: ids and masks ``(batch, pos)``; the decoder's ``(batch, target_pos)``.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from headlab.models.site import AttentionSite

Pair = tuple[str, str]  # (source, target)
SOURCE, TARGET = "source", "target"  # the sides of a pair; a text model's one side is its SOURCE


def site_sides(site: AttentionSite) -> tuple[str, str]:
    """The sides ``(queries, keys)`` a site of an encoder-decoder reads in a forward on pairs: cross-attention
    ``(TARGET, SOURCE)``, the decoder's self-attention (the causal one) ``(TARGET, TARGET)``, the encoder's
    ``(SOURCE, SOURCE)``."""
    if site.cross:
        return TARGET, SOURCE
    return (TARGET, TARGET) if site.causal else (SOURCE, SOURCE)


def takes_decoder_ids(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes ``decoder_input_ids`` (an encoder-decoder, not its encoder alone)."""
    return "decoder_input_ids" in inspect.signature(model.forward).parameters


def start_token(model: nn.Module) -> int:
    """``config.decoder_start_token_id``.

    Raises:
        ValueError: the config sets none.
    """
    start = getattr(getattr(model, "config", None), "decoder_start_token_id", None)
    if not isinstance(start, int):
        raise ValueError(f"{type(model).__name__} sets no config.decoder_start_token_id: pass decoder_input_ids "
                         "with the inputs in a dict")
    return start


def decoder_start(model: nn.Module, batch: int, device: torch.device) -> Tensor:
    """A one-token decoder input per item, the start token: ``(batch, 1)``."""
    return torch.full((batch, 1), start_token(model), dtype=torch.long, device=device)


def shifted(model: nn.Module, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The decoder's inputs that read ``ids`` shifted one place right behind the start token.

    Args:
        model: the encoder-decoder.
        ids: ``(batch, pos)`` token ids, right-padded.
        mask: ``(batch, pos)``, 1 for real tokens.

    Returns:
        ``decoder_input_ids`` and ``decoder_attention_mask``, ``(batch, pos)`` each.
    """
    start = torch.full_like(ids[:, :1], start_token(model))
    return {"decoder_input_ids": torch.cat([start, ids[:, :-1]], dim=1),
            "decoder_attention_mask": torch.cat([torch.ones_like(mask[:, :1]), mask[:, :-1]], dim=1)}


def with_decoder(model: nn.Module, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` of a forward, with the decoder's inputs (the module docstring's rule) when an encoder-decoder is
    given none; anything else unchanged."""
    given = ("decoder_input_ids", "decoder_inputs_embeds", "labels")
    if not takes_decoder_ids(model) or any(kwargs.get(name) is not None for name in given):
        return kwargs
    ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
    if isinstance(ids, Tensor) and ids.dim() == 2:
        return kwargs | shifted(model, ids, torch.ones_like(ids) if mask is None else mask)
    first = next((v for v in kwargs.values() if isinstance(v, Tensor)), None)
    if first is None:
        return kwargs
    return kwargs | {"decoder_input_ids": decoder_start(model, len(first), first.device)}


def is_pairs(inputs: object) -> bool:
    """Whether ``inputs`` is a ``(source, target)`` pair of texts or a non-empty list of them."""
    def pair(x: object) -> bool:
        return isinstance(x, tuple) and len(x) == 2 and all(isinstance(t, str) for t in x)
    return pair(inputs) or (isinstance(inputs, list) and bool(inputs) and all(pair(x) for x in inputs))
