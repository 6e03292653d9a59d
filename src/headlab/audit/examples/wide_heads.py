"""Heads at least as wide as the input: each head has its own full-size query, key and value maps.

Each of ``n_heads`` heads projects the input with its own ``Linear(d_model, d_head)`` per role
(``nn.ModuleList`` per role) with ``d_head ≥ d_model``; the heads are stacked for one softmax, and
``Linear(n_heads·d_head, d_model)`` merges them. Every head's keys and values then read all of the
input through maps of full rank, so whether the heads share one key/value head cannot be seen from
what the layer computes. Called as ``forward(x)``.

Shapes: x ``(batch, pos, d_model)``; q, k, v ``(batch, head, pos, d_head)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FullWidthHeadsAttention(nn.Module):
    """Heads of size d_head ≥ d_model with separate projections."""

    def __init__(self, d_model: int = 16, n_heads: int = 4, d_head: int = 16) -> None:
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head
        self.q = nn.ModuleList(nn.Linear(d_model, d_head) for _ in range(n_heads))
        self.k = nn.ModuleList(nn.Linear(d_model, d_head) for _ in range(n_heads))
        self.v = nn.ModuleList(nn.Linear(d_model, d_head) for _ in range(n_heads))
        self.out = nn.Linear(n_heads * d_head, d_model)

    def forward(self, x: Tensor) -> Tensor:
        q = torch.stack([proj(x) for proj in self.q], dim=1)  # (batch, head, pos, d_head)
        k = torch.stack([proj(x) for proj in self.k], dim=1)
        v = torch.stack([proj(x) for proj in self.v], dim=1)
        pattern = torch.softmax(q @ k.transpose(-2, -1) / self.d_head**0.5, dim=-1)
        z = pattern @ v  # (batch, head, pos, d_head)
        return self.out(z.transpose(1, 2).flatten(2))
