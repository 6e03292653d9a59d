"""The standard layer with separate query, key and value Linears, called as ``forward(query, key, value)``.

Each ``Linear(d_model, d_model)`` is split into n_heads heads of d_head = d_model / n_heads, so
every head reads all of the input with its own weights (Vaswani et al. 2017). ``Tensor.softmax``,
dropout on the pattern, and ``@`` for both products.
"""

from __future__ import annotations

from torch import Tensor, nn


class SeparateProjectionAttention(nn.Module):
    """Multi-head attention with ``q_proj``, ``k_proj``, ``v_proj`` and ``out_proj``."""

    def __init__(self, d_model: int = 64, n_heads: int = 8, dropout: float = 0.1) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def _heads(self, t: Tensor) -> Tensor:  # (batch, pos, d_model) -> (batch, head, pos, d_head)
        return t.view(t.shape[0], t.shape[1], self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        q, k, v = self._heads(self.q_proj(query)), self._heads(self.k_proj(key)), self._heads(self.v_proj(value))
        pattern = (q @ k.transpose(-2, -1) * self.d_head**-0.5).softmax(dim=-1)  # (batch, head, query, key)
        z = self.dropout(pattern) @ v  # (batch, head, query_pos, d_head)
        return self.out_proj(z.transpose(1, 2).reshape(query.shape[0], query.shape[1], -1))
