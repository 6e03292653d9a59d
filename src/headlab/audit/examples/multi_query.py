"""Multi-query attention (Shazeer 2019): every query head reads one shared key and value head.

Queries come from ``Linear(d_model, d_model)`` split into n_heads heads; one key head and one value
head come from ``Linear(d_model, 2·d_head)``; ``F.scaled_dot_product_attention(...,
enable_gqa=True)`` broadcasts them to every query head. Called as ``forward(x)``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class MultiQueryAttention(nn.Module):
    """n_heads query heads, one key/value head."""

    def __init__(self, d_model: int = 64, n_heads: int = 8) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * self.d_head)
        self.o_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q = self.q_proj(x).view(batch, length, self.n_heads, self.d_head).transpose(1, 2)  # (batch, head, pos, d_head)
        k, v = self.kv_proj(x).unsqueeze(1).split(self.d_head, dim=-1)  # (batch, 1, pos, d_head) each
        z = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return self.o_proj(z.transpose(1, 2).reshape(batch, length, width))
