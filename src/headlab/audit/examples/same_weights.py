"""Heads that all project the full input with the same weights.

One ``Linear(d_model, d_head)`` per role is applied to the whole input and its result is given to
every one of n_heads heads (``expand``); only the output projection ``Linear(n_heads·d_head,
d_model)`` has a separate block per head. Every head therefore computes the same pattern over the
same values: n_heads copies of one head. Called as ``forward(x)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class RepeatedHeadAttention(nn.Module):
    """n_heads heads with one shared, full-width query, key and value projection."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, d_head: int = 16) -> None:
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head
        self.query = nn.Linear(d_model, d_head)
        self.key = nn.Linear(d_model, d_head)
        self.value = nn.Linear(d_model, d_head)
        self.out = nn.Linear(n_heads * d_head, d_model)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape

        def every_head(t: Tensor) -> Tensor:  # (batch, pos, d_head) -> (batch, head, pos, d_head), one copy per head
            return t.unsqueeze(1).expand(batch, self.n_heads, length, self.d_head)

        q, k, v = every_head(self.query(x)), every_head(self.key(x)), every_head(self.value(x))
        pattern = torch.softmax(q @ k.transpose(-2, -1) / self.d_head**0.5, dim=-1)
        z = pattern @ v  # (batch, head, pos, d_head)
        return self.out(z.transpose(1, 2).reshape(batch, length, -1))
