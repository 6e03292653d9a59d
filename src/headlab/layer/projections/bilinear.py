"""The "bilinear" projection: one full W_QK per head instead of the factored W_Q W_Kᵀ.

Why does attention keep W_Q and W_K apart instead of learning one W_QK? Here each head scores with a
full (d_model × kdim) matrix, score = x_q W_QK[h] x_kᵀ: rank up to min(d_model, kdim) instead of
d_head, at d_model·kdim parameters per head instead of (d_model + kdim)·d_head. Values and the
output projection are the standard ones.

Computed as q = x_q W_QK[h] + b_Q[h] against keys that are the raw key inputs, so W_K is the
identity and ``QK`` is W_QK itself. The query bias is exactly the one bias term of a factored
layer that the softmax does not cancel, b_Q·W_Kᵀ x_k: with it, ``convert.to_bilinear`` is exact.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headlab.layer.config import AttentionConfig
from headlab.layer.projections.base import check_one_kv_head_per_head
from headlab.layer.projections.values import PerHeadValues


class BilinearProjection(PerHeadValues):
    """A full query-key bilinear form per head: ``qk_weight (n_heads, d_model, kdim)``."""

    q_bias: nn.Parameter | None  # registered (None without bias)

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        c = config
        self.qk_weight = nn.Parameter(torch.empty(c.n_heads, c.d_model, c.kdim))
        self.register_parameter("q_bias", nn.Parameter(torch.empty(c.n_heads, c.kdim)) if c.bias else None)
        self.register_values(config)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """W_QK with the entry scale of a product of two Xavier-initialised factors; Xavier values; zero biases."""
        super().reset_parameters()
        c = self.config
        factor_std = math.sqrt(2.0 / (c.d_model + c.n_heads * c.d_head))
        nn.init.normal_(self.qk_weight, std=math.sqrt(c.d_head) * factor_std**2)
        nn.init.xavier_uniform_(self.v_weight)
        for bias in (self.q_bias, self.v_bias):
            if bias is not None:
                nn.init.zeros_(bias)

    @classmethod
    def validate(cls, config: AttentionConfig) -> None:
        check_one_kv_head_per_head(config, "bilinear")
        if config.rotary:
            raise ValueError("rotary=True: projection='bilinear' has no key projection for rotary positions to rotate")

    @classmethod
    def qk_dim(cls, config: AttentionConfig) -> int:
        return config.kdim

    @classmethod
    def kv_heads(cls, config: AttentionConfig) -> int:
        return config.n_heads

    @classmethod
    def qk_rank_bound(cls, config: AttentionConfig) -> int:
        return min(config.d_model, config.kdim)

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.config
        batch, k_len = key.shape[0], key.shape[1]
        q = torch.matmul(query[:, None], self.qk_weight)  # (batch, n_heads, query_pos, kdim)
        if self.q_bias is not None:
            q = q + self.q_bias[None, :, None, :]
        k = key[:, None].expand(batch, c.n_heads, k_len, c.kdim)  # every head scores the raw keys
        return q, k, self.values(value)  # v: (batch, n_heads, key_pos, d_head_v)

    @property
    def W_Q(self) -> Tensor:
        """``(n_heads, d_model, kdim)``: W_QK itself."""
        return self.qk_weight

    @property
    def W_K(self) -> Tensor:
        """``(n_heads, kdim, kdim)``: the identity (keys are the raw inputs)."""
        eye = torch.eye(self.config.kdim, dtype=self.qk_weight.dtype, device=self.qk_weight.device)
        return eye.expand(self.config.n_heads, -1, -1)

    @property
    def b_Q(self) -> Tensor | None:
        return self.q_bias

    @property
    def b_K(self) -> Tensor | None:
        return None
