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

Bool masks stay bool when every mask of a call is bool (a padded batch of a Hugging Face
model, a causal mask with a cache): merging, finding dead rows and the kernel's own masking
then read one byte per score instead of building a float bias of four, once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class AttentionMask:
    """What the attention math needs to know about masking, already merged.

    Attributes:
        bias: ``(batch | 1, n_heads | 1, query_pos, key_pos)``, either a float additive bias
            with ``-inf`` where not allowed, or bool with True = not allowed; dead rows are
            cleared (every key allowed). None when nothing is masked or the causal mask is
            left to the kernel (``is_causal``).
        is_causal: the mask is exactly the square causal mask, to be applied by the kernel.
        dead: bool ``(batch | 1, n_heads | 1, query_pos)``, True for query rows with no
            allowed key; None when no row is dead.
    """

    bias: Tensor | None
    is_causal: bool
    dead: Tensor | None

    def kernel_mask(self) -> Tensor | None:
        """``bias`` as ``scaled_dot_product_attention`` takes it (bool there means True = allowed)."""
        if self.bias is not None and self.bias.dtype == torch.bool:
            return ~self.bias
        return self.bias

    def explicit_bias(self, q_len: int, *, device: torch.device) -> Tensor | None:
        """The mask for the explicit (non-kernel) path: ``bias``, or the causal mask (bool, True = not allowed)."""
        if self.is_causal:
            return causal_blocked(q_len, q_len, device=device)
        return self.bias


def causal_blocked(q_len: int, k_len: int, *, device: torch.device) -> Tensor:
    """Causal mask ``(1, 1, query_pos, key_pos)``, bool with True = not allowed, aligned to the end of the keys.

    Query i may see key j when ``j <= k_len - q_len + i``.
    """
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu(k_len - q_len + 1)[None, None]


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
    extra_keys: int = 0,
    blocked: Tensor | None = None,
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
        extra_keys: key positions after the k_len that the masks describe, allowed to every
            query (``headlab.layer.extra_kv``): the merged mask is padded with them, as torch
            pads its masks for add_bias_kv and add_zero_attn, and then no row is dead.
        blocked: ``(n_heads, query_pos, key_pos)`` bool, True = not allowed: keys dropped per head
            (the windowed heads of ``headlab.heads.windowed``), merged like the other masks; or None.

    Returns:
        The merged mask.

    Raises:
        ValueError: a mask has the wrong shape.
        TypeError: a mask is not a tensor, or has a dtype other than bool or floating.
    """
    parts: list[Tensor] = []  # bool (True = not allowed) or float additive, each broadcastable to the scores
    if key_padding_mask is not None:
        kpm = _as_part("key_padding_mask", key_padding_mask, dtype, device)
        if kpm.shape != (batch, k_len):
            raise ValueError(
                f"key_padding_mask has shape {tuple(kpm.shape)}; expected (batch, key_pos) = "
                f"({batch}, {k_len})"
            )
        parts.append(kpm[:, None, None, :])
    if attn_mask is not None:
        parts.append(_attn_mask_part(attn_mask, batch, n_heads, q_len, k_len, dtype, device))
    if blocked is not None:
        parts.append(blocked.to(device)[None])
    # With q_len == 1 the end-aligned causal mask allows every key: nothing to mask.
    causal = causal and q_len > 1
    if not parts and (not causal or (q_len == k_len and not extra_keys)):
        return AttentionMask(bias=None, is_causal=causal, dead=None)
    if causal:
        parts.append(causal_blocked(q_len, k_len, device=device))
    if extra_keys:
        parts = [F.pad(part, (0, extra_keys), value=False if part.dtype == torch.bool else 0.0) for part in parts]
    if all(part.dtype == torch.bool for part in parts):
        blocked = parts[0]
        for part in parts[1:]:
            blocked = blocked | part
        dead = blocked.all(dim=-1)  # (batch | 1, n_heads | 1, query_pos)
        if not dead.any():
            return AttentionMask(bias=blocked, is_causal=False, dead=None)
        return AttentionMask(bias=blocked.masked_fill(dead[..., None], False), is_causal=False, dead=dead)
    biases = [_bool_to_bias(part, dtype) if part.dtype == torch.bool else part for part in parts]
    bias = biases[0]  # parts is not empty here: an empty one returned above
    for part in biases[1:]:
        bias = bias + part
    dead = torch.isneginf(bias).all(dim=-1)  # (batch | 1, n_heads | 1, query_pos)
    if not dead.any():
        return AttentionMask(bias=bias, is_causal=False, dead=None)
    return AttentionMask(bias=bias.masked_fill(dead[..., None], 0.0), is_causal=False, dead=dead)


def _attn_mask_part(
    attn_mask: Tensor, batch: int, n_heads: int, q_len: int, k_len: int,
    dtype: torch.dtype, device: torch.device,
) -> Tensor:
    part = _as_part("attn_mask", attn_mask, dtype, device)
    shape = tuple(part.shape)
    if part.dim() == 2 and shape == (q_len, k_len):
        return part[None, None]
    if part.dim() == 3 and shape == (batch * n_heads, q_len, k_len):
        return part.view(batch, n_heads, q_len, k_len)
    if (
        part.dim() == 4
        and shape[0] in (1, batch)
        and shape[1] in (1, n_heads)
        and shape[2:] == (q_len, k_len)
    ):
        return part
    raise ValueError(
        f"attn_mask has shape {shape}; expected (query_pos, key_pos) = ({q_len}, {k_len}), "
        f"(batch * n_heads, query_pos, key_pos) = ({batch * n_heads}, {q_len}, {k_len}) or "
        f"(batch | 1, n_heads | 1, query_pos, key_pos) = ({batch} | 1, {n_heads} | 1, {q_len}, {k_len})"
    )


def _as_part(name: str, mask: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A mask as given: bool (True = not allowed) kept bool, float cast to the scores' dtype."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype == torch.bool:
        return mask.to(device)
    if mask.is_floating_point():
        return mask.to(device=device, dtype=dtype)
    raise TypeError(f"{name} has dtype {mask.dtype}; expected torch.bool or a floating dtype")


def _bool_to_bias(not_allowed: Tensor, dtype: torch.dtype) -> Tensor:
    zeros = torch.zeros(not_allowed.shape, dtype=dtype, device=not_allowed.device)
    return zeros.masked_fill_(not_allowed, float("-inf"))


def sink_window_blocked(q_len: int, k_len: int, *, window: int, sinks: int, causal: bool, offset: int,
                        device: torch.device | str = "cpu") -> Tensor:
    """The keys a streaming head drops: ``(query_pos, key_pos)``, bool with True = not allowed.

    A streaming head (StreamingLLM, Xiao et al. 2023; DuoAttention, Xiao et al. 2024) keeps the
    first ``sinks`` keys and a window of recent ones. Query i sits at key position ``p = offset + i``
    and keeps key j when ``j < sinks`` or, causal, ``0 <= p − j < window`` (the ``window`` most
    recent keys, its own included: a key/value cache of ``sinks + window`` entries); bidirectional,
    ``|p − j| <= window`` (Longformer's sliding window, Beltagy et al. 2020). Causality itself is
    the model's mask's business: a causal window only drops keys older than the window.

    Args:
        q_len, k_len: queries and keys of the call.
        window: ``>= 1``.
        sinks: ``>= 0``.
        causal: the head's model is causal.
        offset: the key position of query 0 (``k_len − q_len`` when queries end the keys).
        device: where the mask is made.

    Returns:
        ``(query_pos, key_pos)`` bool.
    """
    position = torch.arange(q_len, device=device)[:, None] + offset  # (query_pos, 1)
    distance = position - torch.arange(k_len, device=device)[None, :]  # (query_pos, key_pos): p − j
    kept = distance < window if causal else distance.abs() <= window
    kept |= torch.arange(k_len, device=device)[None, :] < sinks
    return ~kept
