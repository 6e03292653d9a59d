"""Key padding done safely: a query whose keys are all padding gets no attention instead of NaN.

``forward(x, key_padding_mask=None)`` takes a ``(batch, key_pos)`` bool mask, True = padding, as
nn.MultiheadAttention does. A softmax over keys that are all -inf is NaN; this layer zeroes the
pattern of such rows afterwards, so that a fully padded sequence gives the output bias alone (the
behaviour of headlab's own layer, which gives zeros before the output projection). Fused qkv
Linear, ``F.softmax``. Called as ``forward(x, key_padding_mask=None)``.

Shapes: x ``(batch, pos, d_model)``; scores ``(batch, head, query_pos, key_pos)``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class SafePaddingAttention(nn.Module):
    """Self-attention with a key padding mask that never produces NaN."""

    def __init__(self, d_model: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))  # (batch, head, pos, d_head)
        scores = q @ k.transpose(-2, -1) / self.d_head**0.5
        if key_padding_mask is not None:
            padded = key_padding_mask[:, None, None, :]  # (batch, 1, 1, key_pos)
            scores = scores.masked_fill(padded, float("-inf"))
        pattern = F.softmax(scores, dim=-1)
        if key_padding_mask is not None:
            pattern = pattern.masked_fill(padded.all(dim=-1, keepdim=True), 0.0)  # all padding: no attention
        z = pattern @ v  # (batch, head, pos, d_head)
        return self.out(z.transpose(1, 2).reshape(batch, length, width))
