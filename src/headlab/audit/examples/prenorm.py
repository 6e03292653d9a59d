"""Attention with its LayerNorm inside: the input is normalised before queries, keys and values.

Pre-norm transformers normalise the residual stream before each attention; some code puts that
``nn.LayerNorm`` inside the attention module itself. The scores are then not a bilinear form of
the module's input, nor the output linear in it: the audit names ``layer_norm`` as the step.
One fused ``Linear(d_model, 3·d_model)``, ``F.scaled_dot_product_attention``. Called as
``forward(x)``.

Shapes: x ``(batch, pos, d_model)``; q, k, v ``(batch, head, pos, d_head)``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class PreNormAttention(nn.Module):
    """LayerNorm, then multi-head self-attention."""

    def __init__(self, d_model: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads = n_heads
        self.norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = (t.view(batch, length, self.n_heads, -1).transpose(1, 2)
                   for t in self.qkv(self.norm(x)).chunk(3, dim=-1))  # (batch, head, pos, d_head)
        z = F.scaled_dot_product_attention(q, k, v)
        return self.out(z.transpose(1, 2).reshape(batch, length, width))
