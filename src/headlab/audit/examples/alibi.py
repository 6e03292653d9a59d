"""ALiBi: a fixed linear penalty on the distance between query and key, one slope per head.

Instead of position embeddings, head h adds −m_h·(i − j) to the score of query i on key j,
with slopes m_h = 2^(−8(h+1)/n_heads) (Press et al. 2022), and masks later keys. The bias is a
buffer computed once for ``max_len`` positions; the scores are then not a bilinear form of the
input, and the audit names the sum with a fixed tensor that follows the positions. Fused qkv
Linear, ``torch.softmax``. Called as ``forward(x)``.

Shapes: x ``(batch, pos, d_model)``; bias ``(head, max_len, max_len)``; scores
``(batch, head, query_pos, key_pos)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ALiBiAttention(nn.Module):
    """Causal self-attention with attention linear biases."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, max_len: int = 256) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        slopes = 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)  # (head,)
        distance = torch.arange(max_len)[:, None] - torch.arange(max_len)[None, :]  # query − key
        self.register_buffer("bias", -slopes[:, None, None] * distance.clamp(min=0))
        self.register_buffer("future", torch.ones(max_len, max_len, dtype=torch.bool).triu(1))

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))  # (batch, head, pos, d_head)
        scores = q @ k.transpose(-2, -1) / self.d_head**0.5 + self.bias[:, :length, :length]
        scores = scores.masked_fill(self.future[:length, :length], float("-inf"))
        z = torch.softmax(scores, dim=-1) @ v  # (batch, head, pos, d_head)
        return self.out(z.transpose(1, 2).reshape(batch, length, width))
