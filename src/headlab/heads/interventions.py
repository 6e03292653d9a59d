"""Masking, scaling and ablation of heads, on any model with headlab's attention attached.

Every intervention sets the sites' persistent per-head affine on z (``AttentionSite.
set_affine``): head h's z becomes ``scale[h]·z + shift[h]`` before the output projection. A
masked or ablated head costs one multiply-add on z, and ``headlab.heads.save`` writes the state
beside the model. Interventions compose: scaling an ablated head scales its replacement.

Heads are addressed as (layer, head) with the layer's current head numbering (see
``headlab.heads.selection``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from headlab.heads.selection import HeadSelection
from headlab.models import AttentionSite, HeadedModel, headed

Model = HeadedModel | nn.Module  # a handle, or an attached model (headlab.attach)
# (site, heads, scale, shift) → the site's new (scale, shift)
_Update = Callable[[AttentionSite, Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]


def mask(model: Model, heads: HeadSelection) -> None:
    """Zero-ablate heads: their output becomes zero (a 0 gate; Michel et al. 2019's masking).

    Args:
        model: a ``HeadedModel`` or an attached model (``headlab.attach``).
        heads: a head selection (``headlab.heads.selection``).
    """
    _apply(model, heads, lambda layer, h, scale, shift: (scale.index_fill(0, h, 0.0), shift.index_fill(0, h, 0.0)))


def scale(model: Model, heads: HeadSelection, factor: float) -> None:
    """Multiply heads' outputs by ``factor`` (any real number; 0 masks, 1 leaves them).

    Raises:
        ValueError: factor is not a finite number.
    """
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not torch.isfinite(torch.tensor(factor)):
        raise ValueError(f"factor={factor!r} must be a finite number")

    def scaled(site: AttentionSite, h: Tensor, scale_: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
        scale_, shift = scale_.clone(), shift.clone()
        scale_[h] *= factor
        shift[h] *= factor
        return scale_, shift

    _apply(model, heads, scaled)


def mean_ablate(model: Model, heads: HeadSelection, means: Mapping[int, Tensor]) -> None:
    """Replace heads' outputs by their mean output (Michel et al. 2019; Wang et al. 2022).

    Args:
        model: a ``HeadedModel`` or an attached model.
        heads: a head selection (``headlab.heads.selection``).
        means: ``{layer: z means (n_heads, d_head_v)}`` as ``headlab.capture.mean_z`` computes them
            over a reference corpus; rows of heads not ablated are ignored.

    Raises:
        ValueError: a layer of ``heads`` has no means, or they have the wrong shape.
    """
    def ablated(layer_index: int) -> _Update:
        def apply(site: AttentionSite, h: Tensor, scale_: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
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


def restore(model: Model, heads: HeadSelection = None) -> None:
    """Undo interventions: on the given heads, or (None) on every head of the model."""
    _apply(model, heads, lambda site, h, scale_, shift: (scale_.index_fill(0, h, 1.0), shift.index_fill(0, h, 0.0)))


def summary(model: Model) -> list[dict[str, object]]:
    """What is done to which head, read from the layers' state: one dict per affected head.

    Each dict: ``layer``, ``head``, ``scale`` (float) and ``shifted`` (bool: replaced by a
    constant, as in mean ablation), with ``kind`` one of "zero-ablated", "mean-ablated",
    "scaled".
    """
    rows: list[dict[str, object]] = []
    for site in headed(model).sites:
        if site.scale is None and site.shift is None:
            continue
        scale_, shift = _affine(site)
        for h in range(site.n_heads):
            s, shifted = float(scale_[h]), bool(shift[h].abs().sum() > 0)
            if s == 1.0 and not shifted:
                continue
            kind = "mean-ablated" if s == 0.0 and shifted else "zero-ablated" if s == 0.0 else "scaled"
            rows.append({"layer": site.layer, "head": h, "scale": s, "shifted": shifted, "kind": kind})
    return rows


def _affine(site: AttentionSite) -> tuple[Tensor, Tensor]:
    """The site's current (scale, shift), identity where unset."""
    scale_ = site.scale if site.scale is not None else torch.ones(site.n_heads)
    shift = site.shift if site.shift is not None else torch.zeros(site.n_heads, site.d_head_v)
    return scale_, shift


def _apply(model: Model, heads: HeadSelection, update: _Update | None, *,
           per_layer: Callable[[int], _Update] | None = None) -> None:
    """Compute every affected site's new affine first, then set them: a refused call changes nothing."""
    handle = headed(model)
    sites = handle.sites
    updates = []
    for index, hs in handle.heads(heads).items():
        site = sites[index]
        fn = per_layer(index) if per_layer is not None else update
        assert fn is not None  # the callers give update or per_layer
        scale_, shift = _affine(site)
        updates.append((site, fn(site, torch.tensor(hs, device=scale_.device), scale_, shift)))
    for site, (scale_, shift) in updates:
        site.set_affine(scale_, shift)
