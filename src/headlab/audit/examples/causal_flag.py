"""A causal flag that is lost when the weights are asked for.

``forward(x, is_causal=False, need_weights=False)``: without weights the layer calls
``F.scaled_dot_product_attention(..., is_causal=is_causal)``; with weights it computes the
pattern itself, to return it, and forgets the causal mask there, so the flag does nothing when
weights are requested. nn.MultiheadAttention does the same with ``is_causal`` and
``need_weights=True`` (it then follows ``attn_mask`` alone); the audit tries both ways. Separate
q/k/v Linears. Returns the output, or ``(output, weights)``.

Shapes: x ``(batch, pos, d_model)``; q, k, v ``(batch, head, pos, d_head)``; weights
``(batch, head, query_pos, key_pos)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalFlagAttention(nn.Module):
    """Self-attention with an ``is_causal`` flag that the weights path ignores."""

    def __init__(self, d_model: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, d_model) for _ in range(3))
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, is_causal: bool = False,
                need_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        batch, length, width = x.shape
        q, k, v = (p(x).view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))  # (batch, head, pos, d_head)
        if need_weights:
            weights = torch.softmax(q @ k.transpose(-2, -1) / self.d_head**0.5, dim=-1)  # no causal mask here
            z = weights @ v
        else:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        out = self.out_proj(z.transpose(1, 2).reshape(batch, length, width))
        return (out, weights) if need_weights else out
