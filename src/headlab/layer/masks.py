"""Attention masks, with ``torch.nn.MultiheadAttention``'s conventions, merged into one bias.

Axis legend: ``(batch, head, query_pos, key_pos)``.

Accepted masks (as in nn.MultiheadAttention, so a layer imported from torch gives
identical outputs for identical calls):
    key_padding_mask  (batch, key_pos); bool True = padding, or float, added to the scores
    attn_mask         (query_pos, key_pos), (batch * n_heads, query_pos, key_pos) or
                      (batch | 1, n_heads | 1, query_pos, key_pos);
                      bool True = not allowed, or float, added to the scores
    causal            query i sits at key position ``key_len - query_len + i`` (aligned to the
                      end, which is what a kv cache needs) and sees keys up to there

A query row with no allowed key gets a zero pattern and a zero output, never NaN: its
bias row is cleared before the softmax (so no NaN reaches the gradients either) and the
row is zeroed afterwards through ``AttentionMask.dead``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class AttentionMask:
    """What the attention math needs to know about masking, already merged.

    Attributes:
        bias: additive scores bias ``(batch | 1, n_heads | 1, query_pos, key_pos)`` with
            ``-inf`` where not allowed and dead rows cleared to 0; None when nothing is masked
            or the causal mask is left to the kernel (``is_causal``).
        is_causal: the mask is exactly the square causal mask, to be applied by the kernel.
        dead: bool ``(batch | 1, n_heads | 1, query_pos)``, True for query rows with no
            allowed key; None when no row can be dead.
    """

    bias: Tensor | None
    is_causal: bool
    dead: Tensor | None

    def explicit_bias(self, q_len: int, *, dtype: torch.dtype, device: torch.device) -> Tensor | None:
        """The bias for the explicit (non-kernel) path: ``bias``, or the causal bias."""
        if self.is_causal:
            return causal_bias(q_len, q_len, dtype=dtype, device=device)
        return self.bias


def causal_bias(q_len: int, k_len: int, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Additive causal bias ``(1, 1, query_pos, key_pos)``, aligned to the end of the keys.

    Query i may see key j when ``j <= k_len - q_len + i``; everything else is ``-inf``.
    """
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(k_len - q_len)
    return _bool_to_bias(~allowed, dtype)[None, None]


def build_mask(
    *,
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    causal: bool,
    batch: int,
    n_heads: int,
    q_len: int,
    k_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> AttentionMask:
    """Validate the masks of one call and merge them into an ``AttentionMask``.

    Args:
        key_padding_mask: ``(batch, key_pos)`` bool (True = padding) or float additive.
        attn_mask: ``(query_pos, key_pos)``, ``(batch * n_heads, query_pos, key_pos)`` or
            ``(batch | 1, n_heads | 1, query_pos, key_pos)``; bool (True = not allowed) or
            float additive.
        causal: apply the causal mask (aligned to the end of the keys).
        batch, n_heads, q_len, k_len: the call's sizes, to check the masks against.
        dtype, device: of the scores.

    Returns:
        The merged mask.

    Raises:
        ValueError: a mask has the wrong shape.
        TypeError: a mask is not a tensor, or has a dtype other than bool or floating.
    """
    parts: list[Tensor] = []
    if key_padding_mask is not None:
        kpm = _as_bias("key_padding_mask", key_padding_mask, dtype, device)
        if kpm.shape != (batch, k_len):
            raise ValueError(
                f"key_padding_mask has shape {tuple(kpm.shape)}; expected (batch, key_pos) = "
                f"({batch}, {k_len})"
            )
        parts.append(kpm[:, None, None, :])
    if attn_mask is not None:
        parts.append(_attn_mask_bias(attn_mask, batch, n_heads, q_len, k_len, dtype, device))
    # With q_len == 1 the end-aligned causal mask allows every key: nothing to mask.
    causal = causal and q_len > 1
    if not parts and (not causal or q_len == k_len):
        return AttentionMask(bias=None, is_causal=causal, dead=None)
    if causal:
        parts.append(causal_bias(q_len, k_len, dtype=dtype, device=device))
    bias = parts[0]
    for part in parts[1:]:
        bias = bias + part
    dead = torch.isneginf(bias).all(dim=-1)  # (batch | 1, n_heads | 1, query_pos)
    bias = bias.masked_fill(dead[..., None], 0.0)
    return AttentionMask(bias=bias, is_causal=False, dead=dead)


def _attn_mask_bias(
    attn_mask: Tensor, batch: int, n_heads: int, q_len: int, k_len: int,
    dtype: torch.dtype, device: torch.device,
) -> Tensor:
    bias = _as_bias("attn_mask", attn_mask, dtype, device)
    shape = tuple(bias.shape)
    if bias.dim() == 2 and shape == (q_len, k_len):
        return bias[None, None]
    if bias.dim() == 3 and shape == (batch * n_heads, q_len, k_len):
        return bias.view(batch, n_heads, q_len, k_len)
    if (
        bias.dim() == 4
        and shape[0] in (1, batch)
        and shape[1] in (1, n_heads)
        and shape[2:] == (q_len, k_len)
    ):
        return bias
    raise ValueError(
        f"attn_mask has shape {shape}; expected (query_pos, key_pos) = ({q_len}, {k_len}), "
        f"(batch * n_heads, query_pos, key_pos) = ({batch * n_heads}, {q_len}, {k_len}) or "
        f"(batch | 1, n_heads | 1, query_pos, key_pos) = ({batch} | 1, {n_heads} | 1, {q_len}, {k_len})"
    )


def _as_bias(name: str, mask: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return _bool_to_bias(mask.to(device), dtype)
    if mask.is_floating_point():
        return mask.to(device=device, dtype=dtype)
    raise TypeError(f"{name} has dtype {mask.dtype}; expected torch.bool or a floating dtype")


def _bool_to_bias(not_allowed: Tensor, dtype: torch.dtype) -> Tensor:
    zeros = torch.zeros(not_allowed.shape, dtype=dtype, device=not_allowed.device)
    return zeros.masked_fill(not_allowed, float("-inf"))
