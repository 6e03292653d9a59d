"""Masking, scaling and ablation of heads, on any model headlab has swapped.

Every intervention sets the layers' persistent per-head affine on z (``MultiHeadAttention.
set_head_affine``): head h's z becomes ``scale[h]·z + shift[h]`` before the output projection.
So a masked or ablated head costs nothing extra, the state moves with ``.to()``, and it is
saved with the model. Interventions compose: scaling an ablated head scales its replacement.

Heads are addressed as (layer, head) with the layer's current head numbering (see
``headlab.heads.address``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from headlab.heads.address import HeadSelection, by_layer
from headlab.layer import MultiHeadAttention
from headlab.models import attention_layers


def mask(model: nn.Module, heads: HeadSelection) -> None:
    """Zero-ablate heads: their output becomes zero (a 0 gate; Michel et al. 2019's masking).

    Args:
        model: a model loaded by ``headlab.load`` (or swapped by an interop adapter).
        heads: (layer, head) pairs or {layer: heads}.
    """
    _apply(model, heads, lambda layer, h, scale, shift: (scale.index_fill(0, h, 0.0), shift.index_fill(0, h, 0.0)))


def scale(model: nn.Module, heads: HeadSelection, factor: float) -> None:
    """Multiply heads' outputs by ``factor`` (any real number; 0 masks, 1 leaves them).

    Raises:
        ValueError: factor is not a finite number.
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not torch.isfinite(torch.tensor(factor)):
        raise ValueError(f"factor={factor!r} must be a finite number")

    def scaled(layer: MultiHeadAttention, h: Tensor, scale_: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
        scale_, shift = scale_.clone(), shift.clone()
        scale_[h] *= factor
        shift[h] *= factor
        return scale_, shift

    _apply(model, heads, scaled)


def mean_ablate(model: nn.Module, heads: HeadSelection, means: Mapping[int, Tensor]) -> None:
    """Replace heads' outputs by their mean output (Michel et al. 2019; Wang et al. 2022).

    Args:
        model: a swapped model.
        heads: (layer, head) pairs or {layer: heads}.
        means: ``{layer: z means (n_heads, d_head_v)}`` as ``headlab.heads.mean_z`` computes them
            over a reference corpus; rows of heads not ablated are ignored.

    Raises:
        ValueError: a layer of ``heads`` has no means, or they have the wrong shape.
    """
    def ablated(layer_index: int):
        def apply(layer: MultiHeadAttention, h: Tensor, scale_: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
            if layer_index not in means:
                raise ValueError(f"no mean z for layer {layer_index}; means has layers {sorted(means)}")
            mean = means[layer_index].to(shift)
            if mean.shape != shift.shape:
                raise ValueError(f"means[{layer_index}] has shape {tuple(mean.shape)}; expected {tuple(shift.shape)}")
            shift = shift.clone()
            shift[h] = mean[h]
            return scale_.index_fill(0, h, 0.0), shift
        return apply

    _apply(model, heads, None, per_layer=ablated)


def restore(model: nn.Module, heads: HeadSelection | None = None) -> None:
    """Undo interventions: on the given heads, or (None) on every head of the model."""
    layers = attention_layers(model)
    if heads is None:
        for layer in layers:
            layer.set_head_affine(None, None)
        return
    _apply(model, heads, lambda layer, h, scale_, shift: (scale_.index_fill(0, h, 1.0), shift.index_fill(0, h, 0.0)))


def summary(model: nn.Module) -> list[dict[str, object]]:
    """What is done to which head, read from the layers' state: one dict per affected head.

    Each dict: ``layer``, ``head``, ``scale`` (float) and ``shifted`` (bool: replaced by a
    constant, as in mean ablation), with ``kind`` one of "zero-ablated", "mean-ablated",
    "scaled".
    """
    rows: list[dict[str, object]] = []
    for index, layer in enumerate(attention_layers(model)):
        if layer.head_scale is None and layer.head_shift is None:
            continue
        scale_, shift = _affine(layer)
        for h in range(layer.config.n_heads):
            s, shifted = float(scale_[h]), bool(shift[h].abs().sum() > 0)
            if s == 1.0 and not shifted:
                continue
            kind = "mean-ablated" if s == 0.0 and shifted else "zero-ablated" if s == 0.0 else "scaled"
            rows.append({"layer": index, "head": h, "scale": s, "shifted": shifted, "kind": kind})
    return rows


def _affine(layer: MultiHeadAttention) -> tuple[Tensor, Tensor]:
    """The layer's current (scale, shift), identity where unset."""
    c, weight = layer.config, layer.projection.out_proj.weight
    scale_ = layer.head_scale if layer.head_scale is not None else torch.ones(c.n_heads, dtype=weight.dtype,
                                                                              device=weight.device)
    shift = layer.head_shift if layer.head_shift is not None else torch.zeros(c.n_heads, c.d_head_v,
                                                                              dtype=weight.dtype, device=weight.device)
    return scale_, shift


def _apply(model: nn.Module, heads: HeadSelection, update, *, per_layer=None) -> None:
    """Compute every affected layer's new affine first, then set them: a refused call changes nothing."""
    layers = attention_layers(model)
    updates = []
    for index, hs in by_layer(heads, layers).items():
        layer = layers[index]
        fn = per_layer(index) if per_layer is not None else update
        updates.append((layer, fn(layer, torch.tensor(hs, device=layer.projection.out_proj.weight.device),
                                  *_affine(layer))))
    for layer, (scale_, shift) in updates:
        layer.set_head_affine(scale_, shift)
