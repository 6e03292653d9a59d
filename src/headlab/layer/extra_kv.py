"""Key/value positions that every query may attend to, appended after the keys of the call.

Axis legend: k ``(batch, kv_heads, key_pos, qk_dim)``, v ``(batch, kv_heads, key_pos, d_head_v)``.

These are ``torch.nn.MultiheadAttention``'s ``add_bias_kv`` (one learned key and value, the
same for every sequence) and ``add_zero_attn`` (one all-zero key and value, so that a query can
put weight on "nothing": its score is 0 and its value adds nothing). As in torch's functional
attention they come in that order, after the projections, and every mask is padded so that
they are always allowed: a query whose own keys are all masked still sees them, so its pattern
is the softmax over them alone (never the all-zero row of a query that sees nothing).

In headlab they are appended after the rotary embedding (they have no position to rotate) and
after the kv cache (they are not cached: every call appends them to the keys it attends to).
Patterns include them as the last key positions, as torch's attention weights do.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ExtraKeyValues(nn.Module):
    """The learned (``bias_k``, ``bias_v``) and/or all-zero key/value positions.

    Args:
        kv_heads: key/value heads of the keys they join.
        qk_dim: width of each head's keys.
        d_head_v: width of each head's values.
        learned: add the learned position (``bias_k (kv_heads, qk_dim)``, ``bias_v (kv_heads, d_head_v)``).
        zero: add the all-zero position.
    """

    def __init__(self, *, kv_heads: int, qk_dim: int, d_head_v: int, learned: bool, zero: bool) -> None:
        super().__init__()
        self.bias_k = nn.Parameter(torch.empty(kv_heads, qk_dim)) if learned else None
        self.bias_v = nn.Parameter(torch.empty(kv_heads, d_head_v)) if learned else None
        self.zero = zero
        self.reset_parameters()

    @property
    def count(self) -> int:
        """How many positions ``forward`` appends."""
        return int(self.bias_k is not None) + int(self.zero)

    def reset_parameters(self) -> None:
        """Normal with torch's scale: nn.MultiheadAttention draws its (1, 1, width) bias_k with
        xavier_normal_, i.e. std 1/sqrt(width), width = all heads' keys (values) side by side."""
        for bias in (self.bias_k, self.bias_v):
            if bias is not None:
                nn.init.normal_(bias, std=bias.numel() ** -0.5)

    def forward(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the positions to every sequence's keys and values.

        Args:
            k: ``(batch, kv_heads, key_pos, qk_dim)``.
            v: ``(batch, kv_heads, key_pos, d_head_v)``.

        Returns:
            ``(k, v)`` with ``count`` more key positions, the learned one first.
        """
        batch, kv_heads = k.shape[:2]
        keys, values = [k], [v]
        if self.bias_k is not None and self.bias_v is not None:  # learned: both or neither
            keys.append(self.bias_k[None, :, None].expand(batch, kv_heads, 1, -1))
            values.append(self.bias_v[None, :, None].expand(batch, kv_heads, 1, -1))
        if self.zero:
            keys.append(k.new_zeros(batch, kv_heads, 1, k.shape[3]))
            values.append(v.new_zeros(batch, kv_heads, 1, v.shape[3]))
        return torch.cat(keys, dim=2), torch.cat(values, dim=2)

    def extra_repr(self) -> str:
        return f"learned={self.bias_k is not None}, zero={self.zero}"
