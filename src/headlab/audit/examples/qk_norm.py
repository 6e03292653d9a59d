"""Query-key normalisation: each head's queries and keys are RMS-normalised before the dot product.

Written by hand, as it often is: x · rsqrt(mean(x²) + eps) · a learned per-dim scale, on each
head's queries and keys (Dehghani et al. 2023 normalise them to keep the logits from growing).
The values are untouched, so each head's W_OV is still exact; the scores are not a bilinear form
of the input, and the audit names the steps (``pow``, ``rsqrt``, and the product of the input
with its own norm). Separate q/k/v Linears, ``torch.softmax``. Called as ``forward(x)``.

Shapes: x ``(batch, pos, d_model)``; q, k, v ``(batch, head, pos, d_head)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class QKNormAttention(nn.Module):
    """Multi-head self-attention with RMS-normalised queries and keys."""

    def __init__(self, d_model: int = 64, n_heads: int = 4, eps: float = 1e-6) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.n_heads, self.d_head, self.eps = n_heads, d_model // n_heads, eps
        self.q_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, d_model) for _ in range(3))
        self.o_proj = nn.Linear(d_model, d_model)
        self.q_scale = nn.Parameter(torch.ones(self.d_head))
        self.k_scale = nn.Parameter(torch.ones(self.d_head))

    def _rms(self, t: Tensor, scale: Tensor) -> Tensor:
        return t * torch.rsqrt(t.pow(2).mean(dim=-1, keepdim=True) + self.eps) * scale

    def forward(self, x: Tensor) -> Tensor:
        batch, length, width = x.shape

        def heads(t: Tensor) -> Tensor:  # (batch, pos, d_model) -> (batch, head, pos, d_head)
            return t.view(batch, length, self.n_heads, self.d_head).transpose(1, 2)

        q = self._rms(heads(self.q_proj(x)), self.q_scale)
        k = self._rms(heads(self.k_proj(x)), self.k_scale)
        pattern = torch.softmax(q @ k.transpose(-2, -1) * self.d_head**-0.5, dim=-1)  # (batch, head, query, key)
        z = pattern @ heads(self.v_proj(x))
        return self.o_proj(z.transpose(1, 2).reshape(batch, length, width))
