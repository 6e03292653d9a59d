"""Heads written as separate modules, the layout of the "build GPT from scratch" tutorials.

``Head`` is one causal head with its own ``key``, ``query`` and ``value`` Linears (no bias) and a
lower-triangular buffer of ``block_size``; ``MultiHeadAttention`` keeps ``num_heads`` of them in an
``nn.ModuleList``, runs each (one softmax per head), concatenates their outputs and projects
them. Called as ``forward(x)``.

Shapes: x ``(B, T, C)``; one head's k, q, v ``(B, T, head_size)``; wei ``(B, T, T)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Head(nn.Module):
    """One head of causal self-attention."""

    def __init__(self, n_embd: int, head_size: int, block_size: int, dropout: float) -> None:
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        T = x.shape[1]
        k, q = self.key(x), self.query(x)  # (B, T, head_size)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, T)
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = self.dropout(F.softmax(wei, dim=-1))
        return wei @ self.value(x)  # (B, T, head_size)


class MultiHeadAttention(nn.Module):
    """``num_heads`` Heads in parallel, concatenated and projected."""

    def __init__(self, num_heads: int = 4, head_size: int = 16, n_embd: int = 64, block_size: int = 32,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.heads = nn.ModuleList(Head(n_embd, head_size, block_size, dropout) for _ in range(num_heads))
        self.proj = nn.Linear(num_heads * head_size, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        out = torch.cat([h(x) for h in self.heads], dim=-1)  # (B, T, num_heads·head_size)
        return self.dropout(self.proj(out))
