"""A widely copied tutorial layer's layout, written for headlab: one small projection per role, shared by all heads.

The input ``(batch, pos, embed_size)`` is cut into ``heads`` slices of ``head_dim =
embed_size / heads``; the same three ``Linear(head_dim, head_dim)`` layers project every slice, and
an output ``Linear(heads·head_dim, embed_size)`` merges the heads. So every head reads only its own
slice of the input, and all heads use one query, one key and one value projection. Called as
``forward(values, keys, query, mask)`` (mask: 0 = not allowed, or None), scores scaled by
1/sqrt(embed_size), einsum for both products: the style of the widely copied tutorial layer.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class SliceSharedAttention(nn.Module):
    """Heads that share one ``head_dim × head_dim`` query, key and value projection over their own slices."""

    def __init__(self, embed_size: int = 64, heads: int = 4) -> None:
        super().__init__()
        if embed_size % heads:
            raise ValueError(f"heads={heads} must divide embed_size={embed_size}")
        self.embed_size, self.heads, self.head_dim = embed_size, heads, embed_size // heads
        self.value_proj = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.key_proj = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.query_proj = nn.Linear(self.head_dim, self.head_dim, bias=False)
        self.merge = nn.Linear(heads * self.head_dim, embed_size)

    def forward(self, values: Tensor, keys: Tensor, query: Tensor, mask: Tensor | None) -> Tensor:
        batch, q_len = query.shape[0], query.shape[1]

        def slices(t: Tensor) -> Tensor:  # (batch, pos, embed) -> (batch, pos, head, head_dim)
            return t.reshape(batch, t.shape[1], self.heads, self.head_dim)

        v = self.value_proj(slices(values))
        k = self.key_proj(slices(keys))
        q = self.query_proj(slices(query))
        energy = torch.einsum("bqhd,bkhd->bhqk", q, k)  # (batch, head, query_pos, key_pos)
        if mask is not None:
            energy = energy.masked_fill(mask == 0, float("-1e20"))
        attention = torch.softmax(energy / self.embed_size**0.5, dim=3)
        mixed = torch.einsum("bhqk,bkhd->bqhd", attention, v)  # (batch, query_pos, head, head_dim)
        return self.merge(mixed.reshape(batch, q_len, self.heads * self.head_dim))
