"""The "narrow" projection: head i reads only slice i of the input, with weights of its own.

The input (batch, pos, d_model) is cut into n_heads slices of width d_model / n_heads; head i
projects slice i with its own (d_slice × d_head) matrices. Seen as a standard layer, each W_Q[h]
is zero outside rows [i·d_slice, (i+1)·d_slice): a block-structured "wide" layer with n_heads
times fewer query/key/value parameters (``headlab.layer.convert.to_wide`` makes it one exactly).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headlab.layer.config import AttentionConfig
from headlab.layer.projections.base import Projection, check_divides, check_one_kv_head_per_head


class NarrowProjection(Projection):
    """Per-head projections of per-head input slices.

    Parameters are stored per weight head: ``q_weight (weight_heads, d_model/n_heads, d_head)``,
    likewise ``k_weight``, ``v_weight`` and the biases ``(weight_heads, d)``; weight_heads is
    n_heads here and 1 in the shared variant, whose one matrix serves every head.
    """

    name = "narrow"
    q_bias: nn.Parameter | None  # registered (None without bias)
    k_bias: nn.Parameter | None
    v_bias: nn.Parameter | None

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        c, w = config, self.weight_heads(config)
        self.q_weight = nn.Parameter(torch.empty(w, c.d_model // c.n_heads, c.d_head))
        self.k_weight = nn.Parameter(torch.empty(w, c.kdim // c.n_heads, c.d_head))
        self.v_weight = nn.Parameter(torch.empty(w, c.vdim // c.n_heads, c.d_head_v))
        for part, width in (("q_bias", c.d_head), ("k_bias", c.d_head), ("v_bias", c.d_head_v)):
            self.register_parameter(part, nn.Parameter(torch.empty(w, width)) if c.bias else None)
        self.reset_parameters()

    @classmethod
    def weight_heads(cls, config: AttentionConfig) -> int:
        """How many distinct per-head matrices are stored (n_heads: one per head)."""
        return config.n_heads

    def reset_parameters(self) -> None:
        """Xavier-uniform per head slice (fan_in = slice width), zero biases."""
        super().reset_parameters()
        for name, p in self.named_parameters(recurse=False):  # absent biases are None: not listed
            if name.endswith("_weight"):
                bound = math.sqrt(6.0 / (p.shape[1] + p.shape[2]))
                nn.init.uniform_(p, -bound, bound)
            else:
                nn.init.zeros_(p)

    @classmethod
    def validate(cls, config: AttentionConfig) -> None:
        check_divides(config, cls.name)
        check_one_kv_head_per_head(config, cls.name)

    @classmethod
    def qk_rank_bound(cls, config: AttentionConfig) -> int:
        return min(config.d_model // config.n_heads, config.kdim // config.n_heads, config.d_head)

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return (
            self._project(query, self.q_weight, self.q_bias),
            self._project(key, self.k_weight, self.k_bias),
            self._project(value, self.v_weight, self.v_bias),
        )

    def _project(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """(batch, pos, width) → (batch, n_heads, pos, d): slice h times weight h (or the one shared)."""
        batch, pos, width = x.shape
        n_heads = self.config.n_heads
        slices = x.view(batch, pos, n_heads, width // n_heads).transpose(1, 2)  # (batch, n_heads, pos, d_slice)
        out = torch.matmul(slices, weight[None])  # weight (1, weight_heads, d_slice, d) broadcasts over heads
        return out if bias is None else out + bias[None, :, None, :]

    def _full(self, weight: Tensor) -> Tensor:
        """(weight_heads, d_slice, d) → (n_heads, n_heads·d_slice, d), zero outside each head's slice."""
        n_heads = self.config.n_heads
        _, d_slice, d = weight.shape
        blocks = torch.eye(n_heads, dtype=weight.dtype, device=weight.device)[:, :, None, None] * weight[:, None]
        return blocks.reshape(n_heads, n_heads * d_slice, d)

    def _per_head(self, bias: Tensor | None) -> Tensor | None:
        return None if bias is None else bias.expand(self.config.n_heads, -1)

    # Per-head views over the whole input are copies: a narrow head's W_Q is zero outside its slice.
    @property
    def W_Q(self) -> Tensor:
        """``(n_heads, d_model, d_head)``, a copy (the parameter is ``q_weight``)."""
        return self._full(self.q_weight)

    @property
    def W_K(self) -> Tensor:
        """``(n_heads, kdim, d_head)``, a copy (the parameter is ``k_weight``)."""
        return self._full(self.k_weight)

    @property
    def W_V(self) -> Tensor:
        """``(n_heads, vdim, d_head_v)``, a copy (the parameter is ``v_weight``)."""
        return self._full(self.v_weight)

    @property
    def b_Q(self) -> Tensor | None:
        return self._per_head(self.q_bias)

    @property
    def b_K(self) -> Tensor | None:
        return self._per_head(self.k_bias)

    @property
    def b_V(self) -> Tensor | None:
        return self._per_head(self.v_bias)
