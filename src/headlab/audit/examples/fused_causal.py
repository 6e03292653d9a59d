"""A causal self-attention layer with one fused qkv projection and PyTorch's fused kernel.

One ``Linear(d_model, 3·d_model)`` gives queries, keys and values; heads are split by ``view``;
``F.scaled_dot_product_attention(..., is_causal=True)`` attends, so each position sees only
itself and earlier positions. Called as ``forward(x)``: the decoder style of GPT-like models.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class FusedCausalAttention(nn.Module):
    """Causal multi-head self-attention over a fused ``qkv`` Linear."""

    def __init__(self, d_model: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (batch, head, pos, d_head)
        q, k, v = (t.view(batch, length, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(z.transpose(1, 2).reshape(batch, length, width))
