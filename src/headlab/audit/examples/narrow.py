"""Narrow heads with weights of their own: head i projects only slice i of the input.

Each head has its own ``Linear(d_slice, d_slice)`` for queries, keys and values (a ModuleList per
role), the heads are stacked before one softmax, and ``@`` weights the values. Called as
``forward(x)``. Unlike the tutorial layout of ``slice_shared`` the heads do not share weights,
but each still reads only ``d_model / n_heads`` dimensions of the input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class NarrowAttention(nn.Module):
    """Per-head projections of per-head input slices."""

    def __init__(self, d_model: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_slice = n_heads, d_model // n_heads
        self.q = nn.ModuleList(nn.Linear(self.d_slice, self.d_slice) for _ in range(n_heads))
        self.k = nn.ModuleList(nn.Linear(self.d_slice, self.d_slice) for _ in range(n_heads))
        self.v = nn.ModuleList(nn.Linear(self.d_slice, self.d_slice) for _ in range(n_heads))
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        parts = x.chunk(self.n_heads, dim=-1)  # n_heads × (batch, pos, d_slice)
        q = torch.stack([proj(p) for proj, p in zip(self.q, parts)], dim=1)  # (batch, head, pos, d_slice)
        k = torch.stack([proj(p) for proj, p in zip(self.k, parts)], dim=1)
        v = torch.stack([proj(p) for proj, p in zip(self.v, parts)], dim=1)
        pattern = F.softmax(q @ k.transpose(-2, -1) / self.d_slice**0.5, dim=-1)  # (batch, head, query, key)
        z = pattern @ v  # (batch, head, pos, d_slice)
        return self.out(z.transpose(1, 2).flatten(2))
