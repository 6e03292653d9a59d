"""Multi-head attention over per-head parameter tensors, written with einsum.

``W_Q, W_K, W_V`` are ``(n_heads, d_model, d_head)`` parameters and ``W_O`` is
``(n_heads, d_head, d_model)``, as interpretability code lays them out; every product is an
``einsum`` (operands passed as a list, as a widely copied tutorial layer writes them). d_head
is set on its own, so n_heads·d_head need not equal d_model. Called as ``forward(x)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class EinsumHeadsAttention(nn.Module):
    """Per-head weight tensors, einsum products."""

    def __init__(self, d_model: int = 48, n_heads: int = 6, d_head: int = 6) -> None:
        super().__init__()
        self.d_head = d_head
        bound = 1 / math.sqrt(d_model)
        self.W_Q = nn.Parameter(torch.empty(n_heads, d_model, d_head).uniform_(-bound, bound))
        self.W_K = nn.Parameter(torch.empty(n_heads, d_model, d_head).uniform_(-bound, bound))
        self.W_V = nn.Parameter(torch.empty(n_heads, d_model, d_head).uniform_(-bound, bound))
        self.W_O = nn.Parameter(torch.empty(n_heads, d_head, d_model).uniform_(-bound, bound))
        self.b_O = nn.Parameter(torch.zeros(d_model).uniform_(-bound, bound))

    def forward(self, x: Tensor) -> Tensor:
        q = torch.einsum("bpd,hde->bhpe", [x, self.W_Q])  # (batch, head, pos, d_head)
        k = torch.einsum("bpd,hde->bhpe", [x, self.W_K])
        v = torch.einsum("bpd,hde->bhpe", [x, self.W_V])
        pattern = F.softmax(torch.einsum("bhqe,bhke->bhqk", [q, k]) / math.sqrt(self.d_head), dim=-1)
        z = torch.einsum("bhqk,bhke->bhqe", [pattern, v])  # (batch, head, query_pos, d_head)
        return torch.einsum("bhqe,hem->bqm", [z, self.W_O]) + self.b_O
