"""Grouped-query attention (Ainslie et al. 2023): groups of query heads share one key and value head.

``n_heads`` query heads, ``n_kv_heads`` key/value heads from one ``Linear(d_model,
2·n_kv_heads·d_head)``; each key/value head is repeated (``repeat_interleave``) for its group of
n_heads / n_kv_heads consecutive query heads before an explicit softmax. Called as ``forward(x)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class GroupedQueryAttention(nn.Module):
    """n_heads query heads over n_kv_heads shared key/value heads."""

    def __init__(self, d_model: int = 64, n_heads: int = 8, n_kv_heads: int = 2) -> None:
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"need n_heads={n_heads} | d_model={d_model} and n_kv_heads={n_kv_heads} | n_heads")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * n_kv_heads * self.d_head)
        self.o_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.n_heads, self.d_head).transpose(1, 2)  # (batch, head, pos, d_head)
        k, v = self.kv_proj(x).view(batch, length, 2, self.n_kv_heads, self.d_head).permute(2, 0, 3, 1, 4)
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (batch, head, pos, d_head)
        pattern = torch.softmax(q @ k.transpose(-2, -1) / self.d_head**0.5, dim=-1)
        z = torch.matmul(pattern, v)
        return self.o_proj(z.transpose(1, 2).reshape(batch, length, -1))
