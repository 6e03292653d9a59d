"""Bilinear attention: each head scores with one full ``d_model × d_model`` matrix instead of W_Q W_Kᵀ.

score_h(x_q, x_k) = x_q W[h] x_kᵀ / sqrt(d_model), with ``W`` an ``(n_heads, d_model, d_model)``
parameter: the one W_QK per head that could be learned instead of separate W_Q and W_K, so a
head's query-key form can have rank d_model rather than d_head. Values and the output projection
are the standard ones. Called as ``forward(x)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class BilinearAttention(nn.Module):
    """A full query-key form per head."""

    def __init__(self, d_model: int = 32, n_heads: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.W = nn.Parameter(torch.randn(n_heads, d_model, d_model) / d_model)
        self.values = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        scores = torch.einsum("bqd,hde,bke->bhqk", x, self.W, x) / math.sqrt(width)  # (batch, head, query, key)
        v = self.values(x).view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
        z = torch.softmax(scores, dim=-1) @ v  # (batch, head, pos, d_head)
        return self.out(z.transpose(1, 2).reshape(batch, length, width))
