"""The swapped attention modules of a loaded model, and their headlab layers, in layer order."""

from __future__ import annotations

from torch import nn

from headlab.interop.hf_attention import SwappedAttention
from headlab.interop.hf_registry import swapped_modules
from headlab.layer import MultiHeadAttention
from headlab.models.loading import LoadedModel


def attention_modules(model: LoadedModel | nn.Module) -> list[SwappedAttention]:
    """Every swapped attention module, ordered by layer index.

    Each carries ``.attn`` (the headlab layer), ``.layer_index`` and ``.tap``.

    Args:
        model: a ``LoadedModel`` or a transformers model swapped by ``headlab.interop.swap``.

    Returns:
        One module per attention block.

    Raises:
        ValueError: the model has no swapped attention module.
    """
    target = model.model if isinstance(model, LoadedModel) else model
    found = swapped_modules(target)
    if not found:
        raise ValueError(
            f"{type(target).__name__} has no headlab attention: load it with headlab.load(...) "
            "or swap it with headlab.interop.swap(model)"
        )
    return found


def attention_layers(model: LoadedModel | nn.Module) -> list[MultiHeadAttention]:
    """The headlab layer of every swapped attention module, ordered by layer index.

    Raises:
        ValueError: the model has no swapped attention module.
    """
    return [module.attn for module in attention_modules(model)]
