"""Standard per-head values, for variants that change only how heads score (bilinear, collaborative).

``v_weight`` is ``(n_heads·d_head_v, vdim)`` with heads contiguous (as the value rows of
nn.MultiheadAttention's in_proj_weight), ``v_bias`` is ``(n_heads·d_head_v,)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.layer.config import AttentionConfig
from headlab.layer.projections.base import Projection


class PerHeadValues(Projection):
    """A projection whose values are n_heads standard value heads."""

    v_weight: nn.Parameter
    v_bias: nn.Parameter | None  # registered (None without bias)

    def register_values(self, config: AttentionConfig) -> None:
        """Create ``v_weight`` and (with bias) ``v_bias``; the subclass initialises them."""
        self.v_weight = nn.Parameter(torch.empty(config.n_heads * config.d_head_v, config.vdim))
        bias = nn.Parameter(torch.empty(config.n_heads * config.d_head_v)) if config.bias else None
        self.register_parameter("v_bias", bias)

    def values(self, value: Tensor) -> Tensor:
        """``(batch, key_pos, vdim)`` → v ``(batch, n_heads, key_pos, d_head_v)``."""
        c = self.config
        batch, k_len = value.shape[0], value.shape[1]
        v = F.linear(value, self.v_weight, self.v_bias)
        return v.view(batch, k_len, c.n_heads, c.d_head_v).transpose(1, 2)

    @property
    def W_V(self) -> Tensor:
        c = self.config
        return self.v_weight.view(c.n_heads, c.d_head_v, c.vdim).transpose(1, 2)

    @property
    def b_V(self) -> Tensor | None:
        return None if self.v_bias is None else self.v_bias.view(self.config.n_heads, self.config.d_head_v)
