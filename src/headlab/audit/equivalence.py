"""A headlab layer with the recovered weights, and the check that it computes what the module does.

From W_QK, w, W_OV and the output on a zero input (``headlab.audit.probes``) a layer is built in
the variant the audit names:

- ``wide`` (standard, grouped-query, multi-query, single head, anything else): per key/value
  group g, W_K[g] is an orthonormal basis of the group's key-side subspace and W_Q[h] = W_QK[h]
  W_K[g] / scale, so scale·W_Q[h] W_K[g]ᵀ = W_QK[h]; the query bias b_Q[h] = W_K[g]ᵀ w[h] / scale
  gives the key-side term. W_V[g] is a basis of the group's value subspace and W_O[h] =
  W_V[g]ᵀ W_OV[h]. Value biases fold into the output bias (patterns sum to one), which is the
  output on a zero input.
- ``narrow`` / ``shared``: the same, per head inside its own slice (head i of the layer is the
  module's head that reads slice i; the output is a sum over heads, so the order is free); for
  shared, one W_Q, W_K from the common block and one W_V spanning every head's value block.
- ``bilinear``: W_QK[h] / scale is the layer's qk_weight itself, w[h] / scale its query bias.

``verify`` runs both on the same random input: the largest output difference is the evidence.
The construction is exact whenever the module's scores are a bilinear form of its inputs and its
output is linear in its heads' patterns — what every layout in headlab's variants satisfies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from headlab.audit.structure import Reads, basis
from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.projections import BilinearProjection, NarrowProjection

__all__ = ["Recovered", "build_equivalent", "verify"]


@dataclass(frozen=True)
class Recovered:
    """What the probes recovered, as the builders need it.

    Attributes:
        W_QK: ``(head, d_model, d_model)``, scale included.
        w: ``(head, d_model)``.
        W_OV: ``(head, d_model, d_model)``.
        output_bias: ``(d_model,)``: the output on an all-zero input.
        key_sides: per head, a thin ``(d_model, r)`` matrix with the column space (and Gram
            matrix) of [W_QKᵀ | w]: the subspace its keys read (``structure.Spectrum.thin``).
        value_sides: per head, a thin ``(d_model, r)`` matrix with the column space of W_OV.
        groups: key/value groups of heads.
        reads: per head, what its queries read (its slice, for narrow layouts).
        causal: causal masking.
        d_head: the audited head size (the layer's is wider if a key subspace needs it).
        d_head_v: the audited value head size (likewise).
        rtol: the relative tolerance of the audit.
    """

    W_QK: Tensor
    w: Tensor
    W_OV: Tensor
    output_bias: Tensor
    key_sides: list[Tensor]
    value_sides: list[Tensor]
    groups: list[list[int]]
    reads: list[Reads]
    causal: bool
    d_head: int
    d_head_v: int
    rtol: float


def _pad(m: Tensor, cols: int) -> Tensor:
    """Zero columns up to ``cols`` (F.pad would crop silently if there were more)."""
    if m.shape[-1] > cols:
        raise ValueError(f"a recovered map needs {m.shape[-1]} columns but the layer's head has {cols}")
    return F.pad(m, (0, cols - m.shape[-1]))


def _key_basis(W_QK: Tensor, w: Tensor, rtol: float) -> Tensor:
    """Orthonormal basis ``(d, r)`` of the key-side subspace of [W_QKᵀ | w] of one head's block."""
    return basis(torch.cat([W_QK.T, w[:, None]], dim=1), rtol=rtol)


def _value_basis(W_OV: Tensor, rtol: float) -> Tensor:
    """Orthonormal basis ``(d, r)`` of the input-side subspace of W_OV ``(…, d, d_model)``, blocks stacked."""
    return basis(W_OV.transpose(-1, -2).reshape(-1, W_OV.shape[-2]).T, rtol=rtol)


def _layer(r: Recovered, *, d_head: int, d_head_v: int, **options: Any) -> MultiHeadAttention:
    """A float64 layer at the recovered sizes, heads at least as wide as the maps need."""
    n_heads, d_model = r.W_QK.shape[0], r.W_QK.shape[1]
    config = AttentionConfig(d_model=d_model, n_heads=n_heads, d_head=max(r.d_head, d_head),
                             d_head_v=max(r.d_head_v, d_head_v), causal=r.causal, **options)
    return MultiHeadAttention(config).double()


def _wide(r: Recovered) -> MultiHeadAttention:
    kv_head_of = [0] * r.W_QK.shape[0]
    for g, group in enumerate(r.groups):
        for h in group:
            kv_head_of[h] = g
    keys = [basis(torch.cat([r.key_sides[h] for h in group], dim=1), rtol=r.rtol) for group in r.groups]
    values = [basis(torch.cat([r.value_sides[h] for h in group], dim=1), rtol=r.rtol) for group in r.groups]
    layer = _layer(r, d_head=max(k.shape[1] for k in keys), d_head_v=max(v.shape[1] for v in values),
                   n_kv_heads=len(r.groups), kv_head_of=tuple(kv_head_of))
    c, scale, b_Q = layer.config, layer.config.softmax_scale, layer.b_Q
    assert b_Q is not None  # bias=True, the default
    for g, group in enumerate(r.groups):
        layer.W_K[g].copy_(_pad(keys[g], c.d_head))
        layer.W_V[g].copy_(_pad(values[g], c.d_head_v))
        for h in group:
            layer.W_Q[h].copy_(_pad(r.W_QK[h] @ keys[g] / scale, c.d_head))
            b_Q[h].copy_(_pad(keys[g].T @ r.w[h] / scale, c.d_head))
            layer.W_O[h].copy_(_pad((values[g].T @ r.W_OV[h]).T, c.d_head_v).T)
    return layer


def _sliced(r: Recovered, *, shared: bool) -> MultiHeadAttention:
    # layer head i = module head order[i]; every head reads a slice here
    order = sorted(range(len(r.reads)), key=lambda h: cast(int, r.reads[h].slice_index))
    blocks = [slice(r.reads[h].start, r.reads[h].stop) for h in order]
    qk = [r.W_QK[h][b, b] for h, b in zip(order, blocks)]
    w = [r.w[h][b] for h, b in zip(order, blocks)]
    ov = [r.W_OV[h][b] for h, b in zip(order, blocks)]  # (d_slice, d_model)
    keys = [_key_basis(a, v, r.rtol) for a, v in zip(qk, w)]
    values = [_value_basis(torch.stack(ov), r.rtol)] * len(ov) if shared else [_value_basis(m, r.rtol) for m in ov]
    layer = _layer(r, d_head=max(k.shape[1] for k in keys), d_head_v=max(v.shape[1] for v in values),
                   projection="shared" if shared else "narrow")
    p, c, scale = layer.projection, layer.config, layer.config.softmax_scale
    assert isinstance(p, NarrowProjection) and p.q_bias is not None  # narrow or shared, with bias
    for i in range(len(order)):
        if i == 0 or not shared:  # a shared layer stores one matrix per role: the common block
            p.q_weight[i].copy_(_pad(qk[i] @ keys[i] / scale, c.d_head))
            p.k_weight[i].copy_(_pad(keys[i], c.d_head))
            p.q_bias[i].copy_(_pad(keys[i].T @ w[i] / scale, c.d_head))
            p.v_weight[i].copy_(_pad(values[i], c.d_head_v))
        layer.W_O[i].copy_(_pad((values[i].T @ ov[i]).T, c.d_head_v).T)
    return layer


def _bilinear(r: Recovered) -> MultiHeadAttention:
    values = [basis(side, rtol=r.rtol) for side in r.value_sides]
    layer = _layer(r, d_head=1, d_head_v=max(v.shape[1] for v in values), projection="bilinear")
    c, scale = layer.config, layer.config.softmax_scale
    p = layer.projection
    assert isinstance(p, BilinearProjection) and p.q_bias is not None  # with bias
    p.qk_weight.copy_(r.W_QK / scale)
    p.q_bias.copy_(r.w / scale)
    for h, v in enumerate(values):
        layer.W_V[h].copy_(_pad(v, c.d_head_v))
        layer.W_O[h].copy_(_pad((v.T @ r.W_OV[h]).T, c.d_head_v).T)
    return layer


_BUILDERS: dict[str, Callable[[Recovered], MultiHeadAttention]] = {
    "narrow": lambda r: _sliced(r, shared=False),
    "shared": lambda r: _sliced(r, shared=True),
    "bilinear": _bilinear,
}


def build_equivalent(variant: str, recovered: Recovered) -> MultiHeadAttention:
    """A float64 headlab layer of ``variant`` carrying the recovered weights (not yet verified).

    Args:
        variant: the headlab variant the audit named (``narrow``, ``shared`` and ``bilinear``
            get their own projection; every other name a ``wide`` layer with the audited
            key/value groups).
        recovered: the recovered maps.

    Returns:
        The layer, in eval mode.

    Raises:
        ValueError: the recovered sizes do not fit the variant (e.g. a key subspace wider than
            d_head), from ``AttentionConfig`` or the weight copies.
    """
    with torch.no_grad():
        layer = _BUILDERS.get(variant, _wide)(recovered)
        layer.projection.out_proj.bias.copy_(recovered.output_bias)
    return layer.eval()


def verify(layer: MultiHeadAttention, run_module: Callable[[Tensor], Tensor], inputs: Sequence[Tensor]) -> float:
    """Largest ``|layer(x) − module(x)|`` over ``inputs`` ``(batch, pos, d_model)`` (float64, no grad)."""
    worst = 0.0
    with torch.no_grad():
        for x in inputs:
            worst = max(worst, float((layer(x) - run_module(x)).abs().max()))
    return worst
