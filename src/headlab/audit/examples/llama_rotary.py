"""A LLaMA-style attention layer: a config dataclass, grouped-query heads, rotary positions in complex64.

``Attention(args: ModelArgs)`` takes its sizes from a dataclass, as LLaMA's reference code does
(from the command line: ``--init '{"args": {"dim": 64, "n_heads": 4, "n_kv_heads": 2}}'``). The
rotary table ``freqs_cis`` is a complex64 buffer; queries and keys are cast to float32, viewed as
complex numbers (pairs of adjacent dims) and multiplied by it (Su et al. 2021); the scores go
through the softmax in float32 and back. Keys and values have ``n_kv_heads`` heads, each repeated
for its group of query heads (Ainslie et al. 2023); causal through an additive -inf mask.
Called as ``forward(x)``.

Shapes: x ``(batch, pos, dim)``; q ``(batch, pos, n_heads, head_dim)``; scores
``(batch, head, query_pos, key_pos)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class ModelArgs:
    dim: int = 64  # model width
    n_heads: int = 4  # query heads
    n_kv_heads: int = 2  # key/value heads, each shared by n_heads / n_kv_heads query heads
    max_seq_len: int = 256  # length of the rotary table
    rope_theta: float = 10000.0  # rotary frequency base


def precompute_freqs_cis(head_dim: int, length: int, theta: float) -> Tensor:
    """``(length, head_dim / 2)`` complex64: e^{i·pos·θ_j} with θ_j = theta^(−2j / head_dim)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(length).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb(xq: Tensor, xk: Tensor, freqs_cis: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate each pair of adjacent dims of queries and keys by its position's angle."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))  # (batch, pos, head, head_dim / 2)
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs = freqs_cis[: xq.shape[1]][None, :, None, :]
    return (torch.view_as_real(xq_ * freqs).flatten(3).type_as(xq),
            torch.view_as_real(xk_ * freqs).flatten(3).type_as(xk))


class Attention(nn.Module):
    """Grouped-query causal self-attention with complex rotary positions."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = args.n_heads, args.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, args.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)
        self.register_buffer("freqs_cis", precompute_freqs_cis(self.head_dim, args.max_seq_len, args.rope_theta),
                             persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, self.freqs_cis)
        repeats = self.n_heads // self.n_kv_heads
        keys = xk.repeat_interleave(repeats, dim=2).transpose(1, 2)  # (batch, head, pos, head_dim)
        values = xv.repeat_interleave(repeats, dim=2).transpose(1, 2)
        scores = torch.matmul(xq.transpose(1, 2), keys.transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device).triu(1)
        scores = F.softmax((scores + mask).float(), dim=-1).type_as(xq)  # (batch, head, query_pos, key_pos)
        output = torch.matmul(scores, values)  # (batch, head, pos, head_dim)
        return self.wo(output.transpose(1, 2).reshape(bsz, seqlen, -1))
