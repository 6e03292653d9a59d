"""A layer whose initial weights do not follow ``torch.manual_seed``.

The weights are allocated with ``torch.empty`` and filled from a ``torch.Generator`` of the
layer's own, seeded from the operating system: two constructions after the same
``torch.manual_seed`` differ, as they would with ``torch.empty`` left uninitialised. The audit
compares two constructions and warns that the same ``--seed`` can give a different audit. The
layout itself is the standard one, einsum over per-head weights. Called as ``forward(x)``.

Shapes: x ``(batch, pos, d_model)``; W_QKV ``(3, n_heads, d_model, d_head)``; W_O
``(n_heads, d_head, d_model)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class UnseededAttention(nn.Module):
    """Standard multi-head attention, initialised from a generator torch's seed does not reach."""

    def __init__(self, d_model: int = 32, n_heads: int = 4) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.d_head = d_model // n_heads
        self.W_QKV = nn.Parameter(torch.empty(3, n_heads, d_model, self.d_head))
        self.W_O = nn.Parameter(torch.empty(n_heads, self.d_head, d_model))
        generator = torch.Generator()
        generator.seed()  # from the operating system, not from torch.manual_seed
        with torch.no_grad():
            for weight in (self.W_QKV, self.W_O):
                weight.normal_(0.0, 1 / math.sqrt(d_model), generator=generator)

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = torch.einsum("bpd,rhde->rbhpe", x, self.W_QKV)  # (batch, head, pos, d_head) each
        pattern = torch.softmax(torch.einsum("bhqe,bhke->bhqk", q, k) / math.sqrt(self.d_head), dim=-1)
        z = torch.einsum("bhqk,bhke->bhqe", pattern, v)  # (batch, head, query_pos, d_head)
        return torch.einsum("bhqe,hem->bqm", z, self.W_O)
