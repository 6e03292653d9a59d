"""The projection seam: how a layer turns its inputs into per-head q, k, v and back.

Axis legend:
    query (batch, query_pos, d_model); key (batch, key_pos, kdim); value (batch, key_pos, vdim)
    q (batch, n_heads, query_pos, qk_dim); k (batch, kv_heads, key_pos, qk_dim);
    v (batch, kv_heads, key_pos, d_head_v); z (batch, n_heads, query_pos, d_head_v)

A variant (wide, narrow, shared, ...) is one subclass in its own file plus one line in the
registry; ``MultiHeadAttention`` only calls this interface. Every variant shares the standard
output projection ``out_proj`` (n_heads·d_head_v → d_model), defined here. A variant checks
the sizes it can use (``validate``, run when the layer is built) and states the widths that
the rest of the layer needs before any weight exists (``qk_dim``, ``kv_heads``) and the rank
bound of W_QK; its parameter and FLOP counts are read off the built module
(``headlab.layer.accounting``), never restated here.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from headlab.layer.config import AttentionConfig
from headlab.layer.functional import head_results


class Projection(nn.Module):
    """Base class of the projection variants.

    Subclasses implement ``forward`` (inputs → q, k, v) and the per-head views ``W_Q W_K W_V``
    and biases ``b_Q b_K b_V``; they override ``validate``, ``qk_dim``, ``kv_heads`` and
    ``qk_rank_bound`` where the defaults (those of the standard layer) do not hold.
    """

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__()
        self.config = config
        self.out_proj = nn.Linear(config.n_heads * config.d_head_v, config.d_model, bias=config.bias)

    def reset_parameters(self) -> None:
        """The output projection as nn.MultiheadAttention starts it: Linear-default weight, zero bias."""
        nn.init.kaiming_uniform_(self.out_proj.weight, a=math.sqrt(5))
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    # --- the variant's contract with the config ---
    @classmethod
    def validate(cls, config: AttentionConfig) -> None:
        """Raise ValueError if ``config`` does not suit this variant (default: any config does)."""

    @classmethod
    def qk_dim(cls, config: AttentionConfig) -> int:
        """Width of each head's queries and keys as they meet in the scores."""
        return config.d_head

    @classmethod
    def kv_heads(cls, config: AttentionConfig) -> int:
        """Key/value heads that ``forward`` returns (and a kv cache stores)."""
        return config.n_kv_heads

    @classmethod
    def qk_rank_bound(cls, config: AttentionConfig) -> int:
        """The largest rank any head's W_QK (d_model × kdim) can have."""
        return min(config.d_model, config.kdim, config.d_head)

    # --- forward ---
    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project the inputs to ``(q, k, v)`` in head layout."""
        raise NotImplementedError

    def merge(self, z: Tensor) -> Tensor:
        """Combine the heads' z ``(batch, n_heads, query_pos, d_head_v)`` into the output."""
        batch, n_heads, q_len, d_head_v = z.shape
        return self.out_proj(z.transpose(1, 2).reshape(batch, q_len, n_heads * d_head_v))

    def result(self, z: Tensor, heads: list[int] | None = None) -> Tensor:
        """Each head's contribution to the output, without the output bias.

        Args:
            z: ``(batch, n_heads, query_pos, d_head_v)``.
            heads: query heads to compute, or None for all.

        Returns:
            ``(batch, len(heads), query_pos, d_model)``; summed over the head axis (all heads)
            and added to ``b_O`` it is the layer's output.
        """
        return head_results(z, self.W_O, heads)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights (inputs must match it)."""
        return self.out_proj.weight.dtype

    # --- per-head views: zero-copy where the variant stores them, else documented as copies ---
    @property
    def W_Q(self) -> Tensor:
        """``(n_heads, d_model, qk_dim)``."""
        raise NotImplementedError

    @property
    def W_K(self) -> Tensor:
        """``(kv_heads, kdim, qk_dim)``."""
        raise NotImplementedError

    @property
    def W_V(self) -> Tensor:
        """``(kv_heads, vdim, d_head_v)``."""
        raise NotImplementedError

    @property
    def W_O(self) -> Tensor:
        """``(n_heads, d_head_v, d_model)``, a view of ``out_proj.weight``."""
        c = self.config
        return self.out_proj.weight.view(c.d_model, c.n_heads, c.d_head_v).permute(1, 2, 0)

    @property
    def b_Q(self) -> Tensor | None:
        """``(n_heads, qk_dim)`` or None."""
        raise NotImplementedError

    @property
    def b_K(self) -> Tensor | None:
        """``(kv_heads, qk_dim)`` or None."""
        raise NotImplementedError

    @property
    def b_V(self) -> Tensor | None:
        """``(kv_heads, d_head_v)`` or None."""
        raise NotImplementedError

    @property
    def b_O(self) -> Tensor | None:
        """``(d_model,)`` or None."""
        return self.out_proj.bias


def check_divides(config: AttentionConfig, variant: str) -> None:
    """Raise ValueError unless n_heads divides d_model, kdim and vdim (for variants that slice inputs)."""
    for name in ("d_model", "kdim", "vdim"):
        width = getattr(config, name)
        if width % config.n_heads:
            raise ValueError(
                f"projection={variant!r} gives each head a slice of the input, so n_heads={config.n_heads} "
                f"must divide {name}={width}"
            )


def check_one_kv_head_per_head(config: AttentionConfig, variant: str) -> None:
    """Raise ValueError for grouped-query configs on variants that define no key/value groups."""
    if config.n_kv_heads != config.n_heads:
        raise ValueError(
            f"projection={variant!r} has one key/value projection per head: n_kv_heads={config.n_kv_heads} "
            f"must equal n_heads={config.n_heads} (grouped-query attention is a 'wide' layer with n_kv_heads)"
        )
