"""Rotary positions in real form (rotate-half, as GPT-NeoX writes them) before the fused kernel.

One ``Linear(d_model, 3·d_model)`` gives queries, keys and values; queries and keys are rotated
with cos/sin tables kept as (non-persistent) buffers: x·cos + rotate_half(x)·sin, where
rotate_half swaps the two halves of each head and negates the second (Su et al. 2021);
``F.scaled_dot_product_attention(..., is_causal=True)`` attends. Called as ``forward(x)``.

Shapes: x ``(batch, pos, d_model)``; q, k, v ``(batch, head, pos, d_head)``; cos, sin
``(max_len, d_head)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rotate_half(x: Tensor) -> Tensor:
    """``(…, d)`` → ``(−x₂, x₁)`` for the halves x₁, x₂ of the last axis."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class RotaryAttention(nn.Module):
    """Causal self-attention, fused qkv, rotate-half rotary positions."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, max_len: int = 256, base: float = 10000.0) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.dense = nn.Linear(d_model, d_model)
        inv_freq = 1.0 / base ** (torch.arange(0, self.d_head, 2).float() / self.d_head)
        angles = torch.outer(torch.arange(max_len).float(), inv_freq).repeat(1, 2)  # (max_len, d_head)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
                   for t in self.qkv(x).split(width, dim=-1))  # (batch, head, pos, d_head)
        cos, sin = self.cos[:length], self.sin[:length]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.dense(z.transpose(1, 2).reshape(batch, length, width))
