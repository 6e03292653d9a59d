"""Conversions between projection variants, exact where the maths allows.

Axis legend: W_Q (n_heads, d_model, d), W_K (kv_heads, kdim, d), W_V (kv_heads, vdim, d_head_v),
W_O (n_heads, d_head_v, d_model); query head h uses key/value head config.kv_head_of[h].

- ``to_wide``: any layer → the standard layout. Exact: every variant's scores are
  (x W_Q[h] + b_Q[h])·(y W_K[h] + b_K[h]), and narrow/shared layers are block-structured wide ones.
- ``to_bilinear``: any layer → one full W_QK = W_Q W_Kᵀ per head. Exact: of the bias terms in the
  scores, b_Q·(y W_K) is the only one that varies along a softmax row; it becomes the bilinear
  layer's query bias W_K b_Q. Needs no rotary positions and no extra key positions (add_bias_kv,
  add_zero_attn): the term (x W_Q + b_Q)·b_K that the bilinear form drops is the same for every
  real key of a row but not for those positions.
- ``to_grouped``: standard → grouped-query by mean-pooling each group's key and value heads
  (Ainslie et al. 2023, "GQA", the starting point before uptraining). Approximate:
  ``output_change`` measures how far outputs move.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from headlab.layer.config import AttentionConfig
from headlab.layer.module import MultiHeadAttention


def to_wide(layer: MultiHeadAttention) -> MultiHeadAttention:
    """The same attention as a standard ("wide") layer.

    Args:
        layer: a layer of any projection variant.

    Returns:
        A wide layer with identical outputs; head h's weights are ``layer.W_Q[h]`` etc., and
        its d_head is the variant's query/key width.
    """
    c = layer.config
    projection = type(layer.projection)
    config = _derived(c, projection="wide", d_head=projection.qk_dim(c), n_kv_heads=projection.kv_heads(c))
    target = _like(layer, config)
    with torch.no_grad():
        for name in ("W_Q", "W_K", "W_V", "b_Q", "b_K", "b_V"):
            source = getattr(layer, name)
            if source is not None:
                getattr(target, name).copy_(source)
    return target


def to_bilinear(layer: MultiHeadAttention) -> MultiHeadAttention:
    """The same attention with each head's W_QK = W_Q W_Kᵀ stored in full.

    Args:
        layer: a layer of any projection variant, without rotary positions.

    Returns:
        A bilinear layer with identical outputs.

    Raises:
        ValueError: the layer uses rotary positions, which a position-free W_QK cannot carry, or
            extra key positions (add_bias_kv, add_zero_attn), see the module docstring.
    """
    c = layer.config
    if c.rotary:
        raise ValueError("rotary=True: a bilinear layer's W_QK cannot carry rotary positions")
    if c.add_bias_kv or c.add_zero_attn:
        raise ValueError(f"add_bias_kv={c.add_bias_kv}, add_zero_attn={c.add_zero_attn}: a bilinear layer drops the "
                         "score term (x W_Q + b_Q)·b_K, which is the same for every real key but not for the extra "
                         "positions")
    config = _derived(c, projection="bilinear", n_kv_heads=c.n_heads, kv_head_of=None)
    target = _like(layer, config)
    kv = torch.tensor(c.kv_head_of, device=layer.W_O.device)  # key/value head of each query head
    W_K = layer.W_K.index_select(0, kv)  # (n_heads, kdim, d)
    with torch.no_grad():
        target.W_Q.copy_(layer.W_Q @ W_K.transpose(1, 2))  # W_QK: (n_heads, d_model, kdim)
        target.W_V.copy_(layer.W_V.index_select(0, kv))
        if target.b_Q is not None:  # config.bias
            b_Q = layer.b_Q
            target.b_Q.copy_(torch.zeros_like(target.b_Q) if b_Q is None else (W_K @ b_Q[:, :, None])[..., 0])
            if layer.b_V is not None and target.b_V is not None:
                target.b_V.copy_(layer.b_V.index_select(0, kv))
    return target


def to_grouped(layer: MultiHeadAttention, n_kv_heads: int) -> MultiHeadAttention:
    """Group a standard layer's key/value heads by mean-pooling them (approximate).

    Args:
        layer: a wide layer.
        n_kv_heads: key/value heads to keep; must divide the layer's n_kv_heads.

    Returns:
        A wide layer with ``n_kv_heads`` key/value heads: each is the mean of the consecutive
        heads (weights and biases) of its group. Queries and the output are unchanged.

    Raises:
        ValueError: the layer is not wide, or n_kv_heads does not divide its key/value heads.
    """
    c = layer.config
    if c.projection != "wide":
        raise ValueError(f"projection={c.projection!r}: to_grouped pools a 'wide' layer's key/value heads")
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, int) or n_kv_heads < 1 or c.n_kv_heads % n_kv_heads:
        raise ValueError(f"n_kv_heads={n_kv_heads!r} must be a positive int dividing the layer's "
                         f"n_kv_heads={c.n_kv_heads}")
    if not c.uniform_groups:
        raise ValueError(f"kv_head_of={c.kv_head_of}: to_grouped pools consecutive, equal groups of key/value heads")
    target = _like(layer, _derived(c, n_kv_heads=n_kv_heads, kv_head_of=None))

    def pool(x: Tensor) -> Tensor:  # (kv_heads, ...) → (n_kv_heads, ...), means over consecutive groups
        return x.reshape(n_kv_heads, c.n_kv_heads // n_kv_heads, *x.shape[1:]).mean(dim=1)

    with torch.no_grad():
        target.W_Q.copy_(layer.W_Q)
        target.W_K.copy_(pool(layer.W_K))
        target.W_V.copy_(pool(layer.W_V))
        for mine, source, grouped in ((target.b_Q, layer.b_Q, False), (target.b_K, layer.b_K, True),
                                      (target.b_V, layer.b_V, True)):
            if mine is not None and source is not None:  # c.bias: all three are there
                mine.copy_(pool(source) if grouped else source)
        if target.extra_kv is not None and layer.extra_kv is not None:
            for mine, source in ((target.extra_kv.bias_k, layer.extra_kv.bias_k),
                                 (target.extra_kv.bias_v, layer.extra_kv.bias_v)):
                if mine is not None and source is not None:  # c.add_bias_kv
                    mine.copy_(pool(source))
    return target


def output_change(before: MultiHeadAttention, after: MultiHeadAttention, *, batch: int = 4, seq_len: int = 32,
                  seed: int = 0) -> float:
    """Relative change of the outputs, ‖after(x) − before(x)‖ / ‖before(x)‖, on standard-normal inputs.

    Args:
        before, after: layers with the same input and output widths.
        batch, seq_len: size of the random input (self-attention; cross-attention layers get
            random keys and values of their widths).
        seed: seeds the input.

    Returns:
        The relative Frobenius-norm change (0 for an exact conversion, up to rounding).
    """
    c = before.config
    generator = torch.Generator().manual_seed(seed)
    dtype, device = before.projection.dtype, before.W_O.device

    def randn(width: int) -> Tensor:
        return torch.randn(batch, seq_len, width, generator=generator, dtype=dtype).to(device)

    query = randn(c.d_model)
    key, value = (None, None) if (c.kdim, c.vdim) == (c.d_model, c.d_model) else (randn(c.kdim), randn(c.vdim))
    with torch.no_grad():
        reference, converted = before(query, key, value), after(query, key, value)
    return float((converted - reference).norm() / reference.norm())


def _derived(config: AttentionConfig, **changes: Any) -> AttentionConfig:
    """``config`` with ``changes``, keeping the score scale the source actually used."""
    return dataclasses.replace(config, scale=config.softmax_scale, **changes)


def _like(layer: MultiHeadAttention, config: AttentionConfig) -> MultiHeadAttention:
    """A new layer for ``config`` on the source's device and dtype, sharing its output projection,
    attention core values and (where their shapes agree) extra key/value positions (copied), and
    its train/eval mode."""
    target = MultiHeadAttention(config).to(device=layer.W_O.device, dtype=layer.projection.dtype)
    with torch.no_grad():
        target.projection.out_proj.load_state_dict(layer.projection.out_proj.state_dict())
        if isinstance(target.core, nn.Module) and isinstance(layer.core, nn.Module):  # config.talking_heads
            target.core.load_state_dict(layer.core.state_dict())
        mine, source = target.extra_kv, layer.extra_kv
        if (mine is not None and source is not None and mine.bias_k is not None and source.bias_k is not None
                and mine.bias_k.shape == source.bias_k.shape):  # config.add_bias_kv, and the shapes agree
            mine.load_state_dict(source.state_dict())
    return target.train(layer.training)
