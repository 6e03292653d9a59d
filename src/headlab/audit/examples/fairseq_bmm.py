"""Heads folded into the batch axis, sequence-first inputs: the layout of fairseq's MultiheadAttention.

``forward(query, key, value, key_padding_mask=None, need_weights=True)`` takes ``(T, B, C)``
inputs; queries are scaled before the product; heads are moved into the batch axis, so the scores
are ``(B·heads, T, S)`` and both products are ``torch.bmm``. A ``(B, S)`` bool key padding mask
(True = padding) is filled with -inf, so a sequence that is all padding gives NaN. Returns
``(output, weights averaged over heads or None)``.

Shapes: query ``(tgt_len, bsz, embed_dim)``; q ``(bsz·heads, tgt_len, head_dim)``; attn_weights
``(bsz·heads, tgt_len, src_len)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class FoldedHeadsAttention(nn.Module):
    """Multi-head attention with heads in the batch axis, sequence-first."""

    def __init__(self, embed_dim: int = 64, num_heads: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide embed_dim={embed_dim}")
        self.num_heads, self.head_dim, self.dropout = num_heads, embed_dim // num_heads, dropout
        self.scaling = self.head_dim**-0.5
        self.k_proj, self.v_proj, self.q_proj = (nn.Linear(embed_dim, embed_dim) for _ in range(3))
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True) -> tuple[Tensor, Tensor | None]:
        tgt_len, bsz, embed_dim = query.size()
        src_len = key.size(0)
        q = self.q_proj(query) * self.scaling
        k, v = self.k_proj(key), self.v_proj(value)
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(src_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(src_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))  # (bsz·heads, tgt_len, src_len)
        if key_padding_mask is not None:
            attn_weights = attn_weights.view(bsz, self.num_heads, tgt_len, src_len)
            attn_weights = attn_weights.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
            attn_weights = attn_weights.view(bsz * self.num_heads, tgt_len, src_len)
        attn_probs = F.dropout(F.softmax(attn_weights, dim=-1), p=self.dropout, training=self.training)
        attn = torch.bmm(attn_probs, v)  # (bsz·heads, tgt_len, head_dim)
        attn = self.out_proj(attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim))
        if not need_weights:
            return attn, None
        return attn, attn_probs.view(bsz, self.num_heads, tgt_len, src_len).mean(dim=1)
