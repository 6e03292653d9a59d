"""A Python loop over heads: one fused projection, then each head sliced out and attended on its own.

The loop runs one ``torch.bmm`` and one ``torch.softmax`` per head over that head's slice of the
fused queries, keys and values; the heads' outputs are concatenated and projected. The forward
takes an optional ``mask`` (``(T, T)`` or ``(B, T, T)``; 0 or False = not allowed) filled with
-1e9, the way many tutorials write it. Called as ``forward(x, mask=None)``.

Shapes: x ``(B, T, d_model)``; one head's q, k, v ``(B, T, d_head)``; scores ``(B, T, T)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class LoopedHeadsAttention(nn.Module):
    """Multi-head attention computed head by head in a loop."""

    def __init__(self, d_model: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # (B, T, d_model) each
        heads = []
        for h in range(self.n_heads):
            part = slice(h * self.d_head, (h + 1) * self.d_head)
            scores = torch.bmm(q[..., part], k[..., part].transpose(1, 2)) / math.sqrt(self.d_head)  # (B, T, T)
            if mask is not None:
                scores = scores.masked_fill(mask == 0, -1e9)
            heads.append(torch.bmm(torch.softmax(scores, dim=-1), v[..., part]))  # (B, T, d_head)
        return self.out(torch.cat(heads, dim=-1))
