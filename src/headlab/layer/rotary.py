"""Rotary position embedding (Su et al. 2021, "RoFormer"), in the half-split layout.

Axis legend: x is ``(batch, head, pos, d_head)``. The first ``rotary_dim`` features of each
head are split into two halves (x1, x2) that rotate together:
``x1' = x1 cos θ - x2 sin θ``, ``x2' = x2 cos θ + x1 sin θ``, with θ = pos · base^(-2i/rotary_dim).
This is the layout of GPT-NeoX and of Hugging Face's LLaMA-family models.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class RotaryEmbedding(nn.Module):
    """Rotates queries and keys by their absolute position.

    Args:
        rotary_dim: leading features of each head that rotate (even); the rest pass through.
        base: frequency base θ.
    """

    def __init__(self, rotary_dim: int, *, base: float = 10000.0) -> None:
        super().__init__()
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"rotary_dim={rotary_dim} must be an even int >= 2")
        if not (isinstance(base, (int, float)) and not isinstance(base, bool) and 1.0 < base < math.inf):
            raise ValueError(f"base={base!r} must be a finite number > 1")
        self.rotary_dim = rotary_dim
        self.base = float(base)

    def forward(self, x: Tensor, *, offset: int = 0, cos_sin: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Rotate ``x`` ``(batch, head, pos, d_head)``.

        Args:
            x: queries or keys.
            offset: position of x's first row (used when ``cos_sin`` is None).
            cos_sin: precomputed ``(cos, sin)``, each ``(batch | 1, pos, rotary_dim)`` or
                ``(pos, rotary_dim)`` (e.g. from a model with scaled or per-example positions).
        """
        if cos_sin is not None:
            cos, sin = cos_sin
            if cos.shape != sin.shape or cos.shape[-1] != self.rotary_dim or cos.shape[-2] != x.shape[-2]:
                raise ValueError(
                    f"rotary_cos_sin has shapes {tuple(cos.shape)} and {tuple(sin.shape)}; expected "
                    f"(batch | 1, pos={x.shape[-2]}, rotary_dim={self.rotary_dim}) for both"
                )
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
            if cos.dim() == 3:  # (batch, pos, rotary_dim): broadcast over heads
                cos, sin = cos[:, None], sin[:, None]
        else:
            # Angles in float32 (float64 for float64 inputs), then cast, as HF's LLaMA does. The
            # frequencies are not a buffer: layer.half() would round them and skew long positions.
            dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
            exponent = torch.arange(0, self.rotary_dim, 2, device=x.device, dtype=dtype) / self.rotary_dim
            pos = torch.arange(offset, offset + x.shape[-2], device=x.device, dtype=dtype)
            angles = torch.outer(pos, self.base**-exponent)  # (pos, rotary_dim / 2)
            cos = angles.cos().to(x.dtype).repeat(1, 2)  # (pos, rotary_dim)
            sin = angles.sin().to(x.dtype).repeat(1, 2)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = rot * cos + torch.cat((-x2, x1), dim=-1) * sin
        return torch.cat((rotated, rest), dim=-1) if rest.shape[-1] else rotated

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, base={self.base}"
