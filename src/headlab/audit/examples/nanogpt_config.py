"""A nanoGPT-style causal self-attention layer: ``__init__(self, config)``, with no annotation.

The sizes come from a config object the constructor reads as ``config.n_embd``, ``config.n_head``
and so on; ``GPTConfig`` is the dataclass written for it. From the command line a nested
``--init`` object becomes that config (a ``types.SimpleNamespace``, since the constructor names
no class): ``--init '{"config": {"n_embd": 64, "n_head": 4, "block_size": 32, "dropout": 0.0,
"bias": true, "flash": false}}'``. One fused ``c_attn`` Linear; ``flash`` switches between
the fused kernel and the explicit math, whose causal mask is a buffer of ``block_size``, so
longer inputs fail. Called as ``forward(x)``.

Shapes: x ``(B, T, C)``; q, k, v ``(B, nh, T, hs)``; att ``(B, nh, T, T)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class GPTConfig:
    block_size: int = 32  # longest input; the mask buffer is this size
    n_embd: int = 64  # model width
    n_head: int = 4  # heads
    dropout: float = 0.0  # on the pattern and the output
    bias: bool = True  # biases in the Linears
    flash: bool = False  # F.scaled_dot_product_attention instead of the explicit math


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention over a fused ``c_attn`` Linear."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout, self.flash = config.n_head, config.n_embd, config.dropout, config.flash
        if not self.flash:
            mask = torch.tril(torch.ones(config.block_size, config.block_size))
            self.register_buffer("bias", mask.view(1, 1, config.block_size, config.block_size))

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.flash:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, T)
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = self.attn_dropout(F.softmax(att, dim=-1))
            y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))
