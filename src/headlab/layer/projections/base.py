"""The projection seam: how a layer turns its inputs into per-head q, k, v and back.

Axis legend:
    query (batch, query_pos, d_model); key (batch, key_pos, kdim); value (batch, key_pos, vdim)
    q (batch, n_heads, query_pos, d_head); k (batch, n_kv_heads, key_pos, d_head);
    v (batch, n_kv_heads, key_pos, d_head_v); z (batch, n_heads, query_pos, d_head_v)

A variant (wide, narrow, shared, ...) is one subclass in its own file plus one line in the
registry; ``MultiHeadAttention`` only calls this interface.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from headlab.layer.config import AttentionConfig


class Projection(nn.Module):
    """Base class of the projection variants.

    Subclasses implement ``forward`` (inputs → q, k, v), ``merge`` (z → output) and the
    per-head weight views ``W_Q W_K W_V W_O`` and biases ``b_Q b_K b_V b_O``.
    """

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__()
        self.config = config

    @classmethod
    def validate(cls, config: AttentionConfig) -> None:
        """Raise ValueError if ``config`` does not suit this variant (default: any config does)."""

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Project the inputs to ``(q, k, v)`` in head layout."""
        raise NotImplementedError

    def merge(self, z: Tensor) -> Tensor:
        """Combine the heads' z ``(batch, n_heads, query_pos, d_head_v)`` into the output."""
        raise NotImplementedError

    def head_results(self, z: Tensor, heads: list[int] | None = None) -> Tensor:
        """Each head's contribution to the output, without the output bias.

        Args:
            z: ``(batch, n_heads, query_pos, d_head_v)``.
            heads: query heads to compute, or None for all.

        Returns:
            ``(batch, len(heads), query_pos, d_model)``; summed over the head axis (all heads)
            and added to ``b_O`` it is the layer's output.
        """
        W_O = self.W_O  # (n_heads, d_head_v, d_model)
        if heads is not None:
            index = torch.tensor(heads, device=z.device)
            z, W_O = z.index_select(1, index), W_O.index_select(0, index)
        return torch.einsum("bhqd,hdm->bhqm", z, W_O)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights (inputs must match it)."""
        raise NotImplementedError

    # Per-head views; subclasses override with zero-copy views over their parameters.
    @property
    def W_Q(self) -> Tensor:  # noqa: N802
        """``(n_heads, d_model, d_head)``."""
        raise NotImplementedError

    @property
    def W_K(self) -> Tensor:  # noqa: N802
        """``(n_kv_heads, kdim, d_head)``."""
        raise NotImplementedError

    @property
    def W_V(self) -> Tensor:  # noqa: N802
        """``(n_kv_heads, vdim, d_head_v)``."""
        raise NotImplementedError

    @property
    def W_O(self) -> Tensor:  # noqa: N802
        """``(n_heads, d_head_v, d_model)``."""
        raise NotImplementedError

    @property
    def b_Q(self) -> Tensor | None:  # noqa: N802
        """``(n_heads, d_head)`` or None."""
        raise NotImplementedError

    @property
    def b_K(self) -> Tensor | None:  # noqa: N802
        """``(n_kv_heads, d_head)`` or None."""
        raise NotImplementedError

    @property
    def b_V(self) -> Tensor | None:  # noqa: N802
        """``(n_kv_heads, d_head_v)`` or None."""
        raise NotImplementedError

    @property
    def b_O(self) -> Tensor | None:  # noqa: N802
        """``(d_model,)`` or None."""
        raise NotImplementedError
