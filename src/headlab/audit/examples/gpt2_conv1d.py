"""GPT-2's attention as the transformers library writes it: Conv1D projections and a boolean mask buffer.

``Conv1D`` is a Linear whose weight is stored transposed, ``(in, out)``, applied with
``torch.addmm``; ``c_attn`` gives queries, keys and values at once. Heads are split with
``view``/``permute``; the causal mask is a ``(n_positions, n_positions)`` bool buffer applied
with ``torch.where`` and the dtype's most negative value. The defaults are GPT-2 small's sizes
(768 wide, 12 heads). Called as ``forward(hidden_states)``.

Shapes: hidden_states ``(batch, pos, n_embd)``; q, k, v ``(batch, head, pos, head_dim)``;
w ``(batch, head, query_pos, key_pos)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Conv1D(nn.Module):
    """x W + b with W stored ``(nx, nf)``."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: Tensor) -> Tensor:
        size_out = (*x.size()[:-1], self.nf)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class GPT2Attention(nn.Module):
    """Causal self-attention, fused Conv1D projections, a fixed-length mask buffer."""

    def __init__(self, n_embd: int = 768, n_head: int = 12, n_positions: int = 1024) -> None:
        super().__init__()
        if n_embd % n_head:
            raise ValueError(f"n_head={n_head} must divide n_embd={n_embd}")
        self.num_heads, self.head_dim, self.split_size = n_head, n_embd // n_head, n_embd
        self.c_attn = Conv1D(3 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)
        tril = torch.tril(torch.ones(n_positions, n_positions, dtype=torch.bool))
        self.register_buffer("bias", tril.view(1, 1, n_positions, n_positions), persistent=False)

    def _split_heads(self, t: Tensor) -> Tensor:  # (batch, pos, n_embd) -> (batch, head, pos, head_dim)
        return t.view((*t.size()[:-1], self.num_heads, self.head_dim)).permute(0, 2, 1, 3)

    def forward(self, hidden_states: Tensor) -> Tensor:
        query, key, value = (self._split_heads(t) for t in self.c_attn(hidden_states).split(self.split_size, dim=2))
        w = torch.matmul(query, key.transpose(-1, -2)) / torch.full([], value.size(-1) ** 0.5, dtype=query.dtype)
        length = query.size(-2)
        causal_mask = self.bias[:, :, :length, :length]
        w = torch.where(causal_mask, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
        w = nn.functional.softmax(w, dim=-1).type(value.dtype)
        a = torch.matmul(w, value).permute(0, 2, 1, 3).contiguous()  # (batch, pos, head, head_dim)
        return self.c_proj(a.view((*a.size()[:-2], self.num_heads * self.head_dim)))
