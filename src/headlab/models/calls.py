"""What the probe records: the attention calls of one forward and the projections around them
(``headlab.models.probe``), read by ``attach`` and ``headlab.models.layout``. Plain data."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn


@dataclass
class ProjectionCall:
    """One Linear (or Conv1D) forward during the probe."""

    module: nn.Module
    input: Tensor
    output: Tensor


@dataclass
class AttentionCall:
    """One attention-function call during the probe, with the projections around it.

    Attributes:
        module: the attention module.
        query, key, value: what the module passed (transformers' layout).
        mask: the additive mask the eager path would use, or None.
        output: what the function returned ``(batch, query_pos, n_heads, d_head_v)``.
        before: projections that ran since the previous attention call (in order).
        after: projections that ran after this call, until the next one.
    """

    module: nn.Module
    query: Tensor
    key: Tensor
    value: Tensor
    mask: Tensor | None
    output: Tensor
    before: list[ProjectionCall] = field(default_factory=list)
    after: list[ProjectionCall] = field(default_factory=list)

    @property
    def cross(self) -> bool:
        """Keys from another sequence than the queries: the probe gives an encoder-decoder's decoder fewer positions
        than its encoder."""
        return self.key.shape[-2] != self.query.shape[-2]

    @property
    def causal(self) -> bool:
        """The first query cannot see the second key (no padding in the probe)."""
        return self.mask is not None and bool((self.mask[..., 0, 1] < 0).all())
