"""The standard ("wide") projection of Vaswani et al. 2017: every head reads all of the input.

Weights are stored as nn.MultiheadAttention stores them, under the same state_dict names
(so torch layers convert by ``load_state_dict``), which is also the fastest layout to multiply:
when the query, key and value inputs have the same width, one fused ``in_proj_weight``
``(n_heads·d_head + n_kv_heads·d_head + n_kv_heads·d_head_v, d_model)`` whose rows are
[W_Q; W_K; W_V] with heads contiguous; otherwise one weight per input.
Self-attention then costs one matrix multiply for q, k and v together.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.layer.config import AttentionConfig
from headlab.layer.projections.base import Projection


class WideProjection(Projection):
    """Standard multi-head projections (grouped-query when n_kv_heads < n_heads)."""

    # Registered parameters, as nn.MultiheadAttention names them: the fused weight when the three inputs
    # have one width, else the three separate ones; the bias with bias=True.
    in_proj_weight: nn.Parameter | None
    q_proj_weight: nn.Parameter | None
    k_proj_weight: nn.Parameter | None
    v_proj_weight: nn.Parameter | None
    in_proj_bias: nn.Parameter | None

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__(config)
        c = config
        self.sizes = (c.n_heads * c.d_head, c.n_kv_heads * c.d_head, c.n_kv_heads * c.d_head_v)
        if c.kdim == c.d_model and c.vdim == c.d_model:
            self.in_proj_weight = nn.Parameter(torch.empty(sum(self.sizes), c.d_model))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = nn.Parameter(torch.empty(self.sizes[0], c.d_model))
            self.k_proj_weight = nn.Parameter(torch.empty(self.sizes[1], c.kdim))
            self.v_proj_weight = nn.Parameter(torch.empty(self.sizes[2], c.vdim))
        self.in_proj_bias = nn.Parameter(torch.empty(sum(self.sizes))) if c.bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.MultiheadAttention's initialisation: Xavier-uniform inputs, Linear-default output, zero biases."""
        super().reset_parameters()
        for weight in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if weight is not None:
                nn.init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)

    @property
    def q_weight(self) -> Tensor:
        """``(n_heads·d_head, d_model)``: rows of W_Q, head-major."""
        if self.in_proj_weight is not None:
            return self.in_proj_weight[: self.sizes[0]]
        assert self.q_proj_weight is not None  # the separate weights exist where the fused one does not
        return self.q_proj_weight

    @property
    def k_weight(self) -> Tensor:
        """``(n_kv_heads·d_head, kdim)``."""
        if self.in_proj_weight is not None:
            return self.in_proj_weight[self.sizes[0] : self.sizes[0] + self.sizes[1]]
        assert self.k_proj_weight is not None
        return self.k_proj_weight

    @property
    def v_weight(self) -> Tensor:
        """``(n_kv_heads·d_head_v, vdim)``."""
        if self.in_proj_weight is not None:
            return self.in_proj_weight[self.sizes[0] + self.sizes[1] :]
        assert self.v_proj_weight is not None
        return self.v_proj_weight

    def _bias(self, part: int) -> Tensor | None:
        if self.in_proj_bias is None:
            return None
        start = sum(self.sizes[:part])
        return self.in_proj_bias[start : start + self.sizes[part]]

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = self.config
        batch, q_len, k_len = query.shape[0], query.shape[1], key.shape[1]
        if self.in_proj_weight is not None and query is key and key is value:
            # Self-attention: one multiply for q, k and v. One split, not three slices: its backward
            # is one concatenation instead of three zero-filled full-width gradients summed.
            q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).split(self.sizes, dim=-1)
        else:
            q = F.linear(query, self.q_weight, self._bias(0))
            k = F.linear(key, self.k_weight, self._bias(1))
            v = F.linear(value, self.v_weight, self._bias(2))
        q = q.view(batch, q_len, c.n_heads, c.d_head).transpose(1, 2)  # (batch, n_heads, query_pos, d_head)
        k = k.view(batch, k_len, c.n_kv_heads, c.d_head).transpose(1, 2)  # (batch, n_kv_heads, key_pos, d_head)
        v = v.view(batch, k_len, c.n_kv_heads, c.d_head_v).transpose(1, 2)  # (batch, n_kv_heads, key_pos, d_head_v)
        return q, k, v

    @property
    def W_Q(self) -> Tensor:
        c = self.config
        return self.q_weight.view(c.n_heads, c.d_head, c.d_model).transpose(1, 2)

    @property
    def W_K(self) -> Tensor:
        c = self.config
        return self.k_weight.view(c.n_kv_heads, c.d_head, c.kdim).transpose(1, 2)

    @property
    def W_V(self) -> Tensor:
        c = self.config
        return self.v_weight.view(c.n_kv_heads, c.d_head_v, c.vdim).transpose(1, 2)

    @property
    def b_Q(self) -> Tensor | None:
        bias = self._bias(0)
        return None if bias is None else bias.view(self.config.n_heads, self.config.d_head)

    @property
    def b_K(self) -> Tensor | None:
        bias = self._bias(1)
        return None if bias is None else bias.view(self.config.n_kv_heads, self.config.d_head)

    @property
    def b_V(self) -> Tensor | None:
        bias = self._bias(2)
        return None if bias is None else bias.view(self.config.n_kv_heads, self.config.d_head_v)
