"""The "collaborative" projection (Cordonnier, Loukas & Jaggi 2020, "Multi-Head Attention:
Collaborate Instead of Concatenate").

All heads share one query projection and one key projection of width D = d_head; head h
re-weights the shared query dimensions with its own mixing vector m_h:
score_h = (x_q W̃_Q + b̃_Q) diag(m_h) (x_k W̃_K + b̃_K)ᵀ. The query/key cost is 2·d_model·D + n_heads·D
parameters instead of 2·d_model·n_heads·d_head, and heads can reuse the dimensions they share.
Values and the output projection are the standard ones.

The mixing starts as a partition of the D dimensions into n_heads contiguous blocks of ones (when
D ≥ n_heads), which is exactly standard multi-head attention with d_head = D / n_heads: training
starts from the concatenated layout and may learn to share.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.layer.config import AttentionConfig
from headlab.layer.projections.base import check_one_kv_head_per_head
from headlab.layer.projections.values import PerHeadValues


class CollaborativeProjection(PerHeadValues):
    """Shared ``q_weight (d_head, d_model)``, ``k_weight (d_head, kdim)`` and per-head ``mixing (n_heads, d_head)``."""

    q_bias: nn.Parameter | None  # registered (None without bias)
    k_bias: nn.Parameter | None

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        c = config
        self.q_weight = nn.Parameter(torch.empty(c.d_head, c.d_model))
        self.k_weight = nn.Parameter(torch.empty(c.d_head, c.kdim))
        self.mixing = nn.Parameter(torch.empty(c.n_heads, c.d_head))
        self.register_values(config)
        for part in ("q_bias", "k_bias"):
            self.register_parameter(part, nn.Parameter(torch.empty(c.d_head)) if c.bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections, block-partition mixing (see module docstring), zero biases."""
        super().reset_parameters()
        for weight in (self.q_weight, self.k_weight, self.v_weight):
            nn.init.xavier_uniform_(weight)
        n_heads, d_shared = self.mixing.shape
        with torch.no_grad():
            if d_shared >= n_heads:
                owner = torch.arange(d_shared) * n_heads // d_shared  # head that owns each shared dimension
                self.mixing.copy_((owner[None, :] == torch.arange(n_heads)[:, None]).to(self.mixing.dtype))
            else:
                nn.init.normal_(self.mixing, mean=1.0, std=0.5)
        for bias in (self.q_bias, self.k_bias, self.v_bias):
            if bias is not None:
                nn.init.zeros_(bias)

    @classmethod
    def validate(cls, config: AttentionConfig) -> None:
        check_one_kv_head_per_head(config, "collaborative")

    @classmethod
    def kv_heads(cls, config: AttentionConfig) -> int:
        return config.n_heads

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.config
        batch, k_len = key.shape[0], key.shape[1]
        shared_q = F.linear(query, self.q_weight, self.q_bias)  # (batch, query_pos, d_head)
        q = shared_q[:, None] * self.mixing[None, :, None, :]  # (batch, n_heads, query_pos, d_head)
        k = F.linear(key, self.k_weight, self.k_bias)[:, None].expand(batch, c.n_heads, k_len, c.d_head)
        return q, k, self.values(value)  # v: (batch, n_heads, key_pos, d_head_v)

    @property
    def W_Q(self) -> Tensor:
        """``(n_heads, d_model, d_head)``: W̃_Q diag(m_h), a copy."""
        return self.q_weight.T[None] * self.mixing[:, None, :]

    @property
    def W_K(self) -> Tensor:
        """``(n_heads, kdim, d_head)``: the shared W̃_K for every head (a broadcast view)."""
        return self.k_weight.T.expand(self.config.n_heads, -1, -1)

    @property
    def b_Q(self) -> Tensor | None:
        """``(n_heads, d_head)``: b̃_Q ⊙ m_h, a copy."""
        return None if self.q_bias is None else self.q_bias[None] * self.mixing

    @property
    def b_K(self) -> Tensor | None:
        return None if self.k_bias is None else self.k_bias.expand(self.config.n_heads, -1)
