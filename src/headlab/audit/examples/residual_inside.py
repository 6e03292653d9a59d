"""An attention module that adds its own residual connection: ``x + attention(x)``.

Written when a block's sub-layer and its residual are kept together. Part of the output then
reaches it around the attention: with every attention weight set to zero the output still moves
with the input, which the audit reports, and no attention layer alone reproduces the module.
Separate q/k/v Linears, ``Tensor.softmax``. Called as ``forward(x)``.

Shapes: x ``(batch, pos, d_model)``; q, k, v ``(batch, head, pos, d_head)``.
"""

from __future__ import annotations

from torch import Tensor, nn


class ResidualAttention(nn.Module):
    """Multi-head self-attention plus the input."""

    def __init__(self, d_model: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q, self.k, self.v = (nn.Linear(d_model, d_model) for _ in range(3))
        self.o = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape
        q, k, v = (p(x).view(batch, length, self.n_heads, self.d_head).transpose(1, 2)
                   for p in (self.q, self.k, self.v))  # (batch, head, pos, d_head)
        z = (q @ k.transpose(-2, -1) / self.d_head**0.5).softmax(dim=-1) @ v
        return x + self.o(z.transpose(1, 2).reshape(batch, length, width))
