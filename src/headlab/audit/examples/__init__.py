"""Attention layers written for headlab in the styles people use: the issue's ``examples/`` folder.

Each file is self-contained (it imports only torch), so it works both as part of this package
and as a file handed to the command line, e.g.
``headlab audit src/headlab/audit/examples/thread_000.py:SliceSharedAttention``.

    thread_000       the layout of ../seeds thread 000: one Linear(head_dim, head_dim) per role
                     shared by all heads, each applied to its head's slice; forward(values, keys, query, mask)
    narrow           narrow heads with their own projections; forward(x)
    separate_qkv     the standard layer with separate q/k/v Linears; forward(query, key, value)
    fused_causal     a fused qkv Linear and causal scaled_dot_product_attention; forward(x)
    einsum_heads     einsum over per-head parameter tensors W_Q, W_K, W_V, W_O; forward(x)
    torch_mha        torch.nn.MultiheadAttention itself (sequence-first by default)
    grouped_query    grouped-query attention, repeat_interleave + softmax; forward(x)
    multi_query      multi-query attention, scaled_dot_product_attention(enable_gqa=True); forward(x)
    bilinear         a full d_model × d_model query-key form per head; forward(x)
    single_head      one head, scores without a head axis, bmm; forward(x)
    same_weights     every head projects the full input with the same weights; forward(x)

``EXAMPLES`` maps each name to its class and the constructor arguments the tests and the report
use. What the audit must say about each is asserted in tests/audit/test_examples.py.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from headlab.audit.examples.bilinear import BilinearAttention
from headlab.audit.examples.einsum_heads import EinsumHeadsAttention
from headlab.audit.examples.fused_causal import FusedCausalAttention
from headlab.audit.examples.grouped_query import GroupedQueryAttention
from headlab.audit.examples.multi_query import MultiQueryAttention
from headlab.audit.examples.narrow import NarrowAttention
from headlab.audit.examples.same_weights import RepeatedHeadAttention
from headlab.audit.examples.separate_qkv import SeparateProjectionAttention
from headlab.audit.examples.single_head import SingleHeadAttention
from headlab.audit.examples.thread_000 import SliceSharedAttention
from headlab.audit.examples.torch_mha import MultiheadAttention

__all__ = [
    "EXAMPLES", "BilinearAttention", "EinsumHeadsAttention", "FusedCausalAttention", "GroupedQueryAttention",
    "MultiQueryAttention", "MultiheadAttention", "NarrowAttention", "RepeatedHeadAttention",
    "SeparateProjectionAttention", "SingleHeadAttention", "SliceSharedAttention", "build",
]

EXAMPLES: dict[str, tuple[type[nn.Module], dict[str, Any]]] = {
    "thread_000": (SliceSharedAttention, {}),
    "narrow": (NarrowAttention, {}),
    "separate_qkv": (SeparateProjectionAttention, {}),
    "fused_causal": (FusedCausalAttention, {}),
    "einsum_heads": (EinsumHeadsAttention, {}),
    "torch_mha": (MultiheadAttention, {"embed_dim": 64, "num_heads": 8}),
    "grouped_query": (GroupedQueryAttention, {}),
    "multi_query": (MultiQueryAttention, {}),
    "bilinear": (BilinearAttention, {}),
    "single_head": (SingleHeadAttention, {}),
    "same_weights": (RepeatedHeadAttention, {}),
}


def build(name: str) -> nn.Module:
    """A fresh instance of example ``name`` (seed torch first for the same weights every time).

    Raises:
        ValueError: ``name`` is not in ``EXAMPLES`` (the names are listed).
    """
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r}; examples: {', '.join(EXAMPLES)}")
    cls, kwargs = EXAMPLES[name]
    return cls(**kwargs)
