"""Small modules for the error paths and edge cases of the audit (the examples cover the layouts).

The CLI tests also audit this file as a user's ``PATH.py:ClassName`` (and ``--factory layers:make_per_head``),
so it imports nothing but torch.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Raises(nn.Module):
    """Its forward always raises."""

    def __init__(self, d_model: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        raise ValueError("boom: this layer is broken")


class NoSoftmax(nn.Module):
    """A Linear layer: no attention at all."""

    def __init__(self, d_model: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


class WrongShape(nn.Module):
    """Attends, but returns d_model / 2 features."""

    def __init__(self, d_model: int = 8) -> None:
        super().__init__()
        self.v = nn.Linear(d_model, d_model // 2)

    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(x @ x.transpose(1, 2), dim=-1) @ self.v(x)


class TwoAttentions(nn.Module):
    """Two attentions in one forward."""

    def __init__(self, d_model: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        y = torch.softmax(x @ x.transpose(1, 2), dim=-1) @ self.proj(x)
        return torch.softmax(y @ y.transpose(1, 2), dim=-1) @ y


class Parameterless(nn.Module):
    """softmax(x xᵀ / sqrt(d)) x: one head whose W_QK and W_OV are scaled identities; any width works."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(x @ x.transpose(1, 2) / x.shape[-1] ** 0.5, dim=-1) @ x


class SelfOnlyQKV(nn.Module):
    """forward(query, key, value) that refuses anything but self-attention."""

    def __init__(self, d_model: int = 8) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        if key is not query or value is not query:
            raise ValueError("self-attention only")
        return torch.softmax(self.q(query) @ self.k(key).transpose(1, 2), dim=-1) @ value


class Float32Only(nn.Module):
    """Two heads that run only in float32."""

    def __init__(self, d_model: int = 8) -> None:
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != torch.float32:
            raise TypeError(f"float32 only, got {x.dtype}")
        b, n, d = x.shape
        q, k, v = (t.view(b, n, 2, d // 2).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        z = torch.softmax(q @ k.transpose(-2, -1) / (d // 2) ** 0.5, dim=-1) @ v
        return self.out(z.transpose(1, 2).reshape(b, n, d))


class Positional(nn.Module):
    """Scores with a learned additive bias per (query, key) offset: not a bilinear form of the inputs."""

    def __init__(self, d_model: int = 8) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.slope = nn.Parameter(torch.tensor(0.7))

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]
        scores = self.q(x) @ self.k(x).transpose(1, 2) - self.slope * offset.abs()
        return torch.softmax(scores, dim=-1) @ x


class BlockCausal(nn.Module):
    """Causal attention through a mask buffer of a fixed block size (minGPT style): longer inputs fail."""

    def __init__(self, d_model: int = 16, n_heads: int = 2, block_size: int = 10) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.n_heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        scores = (q @ k.transpose(-2, -1)) / (d // self.n_heads) ** 0.5
        scores = scores.masked_fill(self.mask[:, :, :n, :n] == 0, float("-inf"))
        z = torch.softmax(scores, dim=-1) @ v
        return self.out(z.transpose(1, 2).reshape(b, n, d))


class PerHeadWeights(nn.Module):
    """Per-head (d_head, d_head) maps on the input's slices: no parameter shape is the input width."""

    def __init__(self, n_heads: int = 4, d_head: int = 8) -> None:
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head
        self.W = nn.Parameter(torch.randn(3, n_heads, d_head, d_head) / d_head**0.5)

    def forward(self, x: Tensor) -> Tensor:
        assert x.shape[-1] == self.n_heads * self.d_head, "wrong input width"
        b, n, _ = x.shape
        q, k, v = (x.view(b, n, self.n_heads, self.d_head).transpose(1, 2) @ w for w in self.W)
        z = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v  # (b, head, n, d_head)
        return z.transpose(1, 2).reshape(b, n, -1)


def make_per_head(width: int = 32) -> PerHeadWeights:
    """A factory: PerHeadWeights for an input ``width`` wide, heads of 8."""
    return PerHeadWeights(n_heads=width // 8)


class NeedsPositions(nn.Module):
    """A forward that needs an argument besides the inputs (its position table)."""

    def __init__(self, d_model: int = 8) -> None:
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        q, k, v = self.qkv(x + positions).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


class ConfigAttention(nn.Module):
    """``__init__(self, config)`` reading ``config.width`` and ``config.heads``, nanoGPT style."""

    def __init__(self, config) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        return (torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v).transpose(1, 2).reshape(b, n, d)
