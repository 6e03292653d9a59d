"""The "shared" projection: narrow heads that all use one and the same projection.

This is the layout of a widely copied tutorial layer, the one that makes readers ask "do heads
share Q/K/V weights?": the input is cut into n_heads slices and one Linear(d_slice, d_head) is
applied to every slice. Its heads do share their query, key and value weights, and each reads
only its own slice of the input; its projections hold n_heads² times fewer parameters than the
standard layer's.
"""

from __future__ import annotations

from headlab.layer.config import AttentionConfig
from headlab.layer.projections.narrow import NarrowProjection


class SharedProjection(NarrowProjection):
    """Narrow projection with one (d_slice × d) matrix per role, shared by every head.

    ``q_weight`` is ``(1, d_model/n_heads, d_head)``; ``W_Q[h]`` places that same matrix in
    head h's slice.
    """

    name = "shared"

    @classmethod
    def weight_heads(cls, config: AttentionConfig) -> int:
        return 1
