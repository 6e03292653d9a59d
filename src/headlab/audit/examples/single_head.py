"""One attention head, with scores of shape ``(batch, query_pos, key_pos)`` and no head axis at all.

Queries, keys and values are ``Linear(d_model, d_head)`` projections, the output is
``Linear(d_head, d_model)``; ``torch.bmm`` for both products. Called as ``forward(x)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class SingleHeadAttention(nn.Module):
    """A single head of width d_head."""

    def __init__(self, d_model: int = 64, d_head: int = 32) -> None:
        super().__init__()
        self.q = nn.Linear(d_model, d_head)
        self.k = nn.Linear(d_model, d_head)
        self.v = nn.Linear(d_model, d_head)
        self.o = nn.Linear(d_head, d_model)
        self.scale = d_head**-0.5

    def forward(self, x: Tensor) -> Tensor:
        scores = torch.bmm(self.q(x), self.k(x).transpose(1, 2)) * self.scale  # (batch, query_pos, key_pos)
        return self.o(torch.bmm(scores.softmax(dim=-1), self.v(x)))
