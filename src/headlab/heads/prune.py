"""Physical pruning: remove heads' weights from a model's attention layers.

A pruned layer is a smaller headlab layer: the kept query heads, their output-projection
columns, and only the key/value heads some kept query head still reads (Ainslie et al.'s
grouped-query layout is respected: a key/value head goes only when all its query heads go;
uneven groups are kept through ``AttentionConfig.kv_head_of``). Outputs equal those of the
unpruned model with the same heads masked, and the layer does less work.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from headlab.heads.address import HeadSelection, by_layer
from headlab.layer import MultiHeadAttention
from headlab.models import attention_modules


def prune(model: nn.Module, heads: HeadSelection) -> dict[int, list[int]]:
    """Remove heads from a swapped model, in place.

    Args:
        model: a model loaded by ``headlab.load``.
        heads: (layer, head) pairs or {layer: heads}, in each layer's current numbering.

    Returns:
        ``{layer: original indices of the heads that remain}`` for the layers pruned.

    Raises:
        ValueError: a layer would lose every head (mask them instead), or uses a projection
            variant or talking heads, whose heads cannot be removed independently.
    """
    modules = attention_modules(model)
    selection = by_layer(heads, [m.attn for m in modules])
    for index, removed in selection.items():  # check everything before changing anything
        _check_prunable(index, modules[index].attn, removed)
    kept_ids = {}
    for index, removed in selection.items():
        module = modules[index]
        keep = [h for h in range(module.attn.config.n_heads) if h not in removed]
        module.attn = pruned_layer(module.attn, keep)
        module.head_ids = [module.head_ids[h] for h in keep]
        kept_ids[index] = list(module.head_ids)
    return kept_ids


def pruned_layer(layer: MultiHeadAttention, keep: list[int]) -> MultiHeadAttention:
    """A new layer with only the query heads ``keep`` (and the key/value heads they read).

    Args:
        layer: a wide layer without talking heads.
        keep: query heads to keep, in order.

    Returns:
        The smaller layer, on the same device and dtype, in the same train/eval mode, with
        the kept heads' interventions.
    """
    c = layer.config
    kv_keep = sorted({c.kv_head_of[h] for h in keep})
    config = dataclasses.replace(
        c, n_heads=len(keep), n_kv_heads=len(kv_keep), kv_head_of=tuple(kv_keep.index(c.kv_head_of[h]) for h in keep),
        d_head=c.d_head, d_head_v=c.d_head_v, scale=c.softmax_scale,
    )
    weight = layer.projection.out_proj.weight
    target = MultiHeadAttention(config).to(device=weight.device, dtype=weight.dtype)
    q_index = torch.tensor(keep, device=weight.device)
    kv_index = torch.tensor(kv_keep, device=weight.device)
    with torch.no_grad():
        for name, index in (("W_Q", q_index), ("W_K", kv_index), ("W_V", kv_index), ("W_O", q_index),
                            ("b_Q", q_index), ("b_K", kv_index), ("b_V", kv_index)):
            source = getattr(layer, name)
            if source is not None:
                getattr(target, name).copy_(source.index_select(0, index))
        if layer.b_O is not None:
            target.b_O.copy_(layer.b_O)
    if layer.head_scale is not None or layer.head_shift is not None:
        target.set_head_affine(
            None if layer.head_scale is None else layer.head_scale.index_select(0, q_index),
            None if layer.head_shift is None else layer.head_shift.index_select(0, q_index),
        )
    return target.train(layer.training)


def _check_prunable(index: int, layer: MultiHeadAttention, removed: list[int]) -> None:
    c = layer.config
    if len(removed) == c.n_heads:
        raise ValueError(f"pruning every head of layer {index} would leave no attention; mask them instead")
    if c.projection != "wide":
        raise ValueError(
            f"layer {index} has projection={c.projection!r}: its heads share input slices or projections and "
            "cannot be removed one by one (headlab.layer.convert.to_wide makes it prunable)"
        )
    if c.talking_heads:
        raise ValueError(f"layer {index} has talking heads: every head's pattern mixes all heads, so none can go alone")
