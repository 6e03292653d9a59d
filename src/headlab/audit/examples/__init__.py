"""Attention layers written for headlab in the styles people use.

Each file is self-contained (it imports only torch), so it works both as part of this package
and as a file handed to the command line, e.g.
``headlab audit src/headlab/audit/examples/slice_shared.py:SliceSharedAttention``.

    slice_shared     a widely copied tutorial layer: one Linear(head_dim, head_dim) per role shared by
                     all heads, each applied to its head's slice; forward(values, keys, query, mask)
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

The corpus of layers written the ways people write them, for the audit to survive real code:

    llama_rotary     a ModelArgs dataclass, grouped-query heads, rotary positions in complex64
    neox_rotary      rotate-half rotary positions in real form, causal scaled_dot_product_attention
    nanogpt_config   __init__(self, config) unannotated, a block_size mask buffer or the fused kernel
    head_modules     a ModuleList of single-head modules, concatenated (the tutorial layout)
    head_loop        a Python loop over heads with one softmax each; forward(x, mask=None)
    prenorm          a LayerNorm inside the module, before queries, keys and values
    qk_norm          queries and keys RMS-normalised per head, by hand
    wide_heads       heads at least as wide as the input (d_head ≥ d_model), separate maps
    unseeded_init    weights from torch.empty filled by a generator torch's seed does not reach
    alibi            linear distance biases per head (ALiBi), causal
    causal_flag      forward(x, is_causal, need_weights): the flag is lost when weights are asked for
    padding_safe     a key padding mask that gives no attention, not NaN, to an all-padding row
    gpt2_conv1d      GPT-2 as transformers writes it: Conv1D, a bool mask buffer, torch.where
    fairseq_bmm      heads folded into the batch axis, (T, B, C) inputs, a NaN-giving padding mask
    residual_inside  x + attention(x): part of the output goes around the attention

``EXAMPLES`` maps each name to its class and the constructor arguments the tests and the report
use. What the audit must say about each is asserted in tests/audit/test_examples.py (the first
eleven) and tests/audit/test_corpus.py (the corpus).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from headlab.audit.examples.alibi import ALiBiAttention
from headlab.audit.examples.bilinear import BilinearAttention
from headlab.audit.examples.causal_flag import CausalFlagAttention
from headlab.audit.examples.einsum_heads import EinsumHeadsAttention
from headlab.audit.examples.fairseq_bmm import FoldedHeadsAttention
from headlab.audit.examples.fused_causal import FusedCausalAttention
from headlab.audit.examples.gpt2_conv1d import GPT2Attention
from headlab.audit.examples.grouped_query import GroupedQueryAttention
from headlab.audit.examples.head_loop import LoopedHeadsAttention
from headlab.audit.examples.head_modules import MultiHeadAttention as HeadModulesAttention
from headlab.audit.examples.llama_rotary import Attention as LlamaAttention
from headlab.audit.examples.llama_rotary import ModelArgs
from headlab.audit.examples.multi_query import MultiQueryAttention
from headlab.audit.examples.nanogpt_config import CausalSelfAttention, GPTConfig
from headlab.audit.examples.narrow import NarrowAttention
from headlab.audit.examples.neox_rotary import RotaryAttention
from headlab.audit.examples.padding_safe import SafePaddingAttention
from headlab.audit.examples.prenorm import PreNormAttention
from headlab.audit.examples.qk_norm import QKNormAttention
from headlab.audit.examples.residual_inside import ResidualAttention
from headlab.audit.examples.same_weights import RepeatedHeadAttention
from headlab.audit.examples.separate_qkv import SeparateProjectionAttention
from headlab.audit.examples.single_head import SingleHeadAttention
from headlab.audit.examples.slice_shared import SliceSharedAttention
from headlab.audit.examples.torch_mha import MultiheadAttention
from headlab.audit.examples.unseeded_init import UnseededAttention
from headlab.audit.examples.wide_heads import FullWidthHeadsAttention

__all__ = [
    "EXAMPLES", "ALiBiAttention", "BilinearAttention", "CausalFlagAttention", "CausalSelfAttention",
    "EinsumHeadsAttention", "FoldedHeadsAttention", "FullWidthHeadsAttention", "FusedCausalAttention",
    "GPT2Attention", "GPTConfig", "GroupedQueryAttention", "HeadModulesAttention", "LlamaAttention",
    "LoopedHeadsAttention", "ModelArgs", "MultiQueryAttention", "MultiheadAttention", "NarrowAttention",
    "PreNormAttention", "QKNormAttention", "RepeatedHeadAttention", "ResidualAttention", "RotaryAttention",
    "SafePaddingAttention", "SeparateProjectionAttention", "SingleHeadAttention", "SliceSharedAttention",
    "UnseededAttention", "build",
]

EXAMPLES: dict[str, tuple[type[nn.Module], dict[str, Any]]] = {
    "slice_shared": (SliceSharedAttention, {}),
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
    "llama_rotary": (LlamaAttention, {"args": ModelArgs()}),
    "neox_rotary": (RotaryAttention, {}),
    "nanogpt_config": (CausalSelfAttention, {"config": GPTConfig()}),
    "head_modules": (HeadModulesAttention, {}),
    "head_loop": (LoopedHeadsAttention, {}),
    "prenorm": (PreNormAttention, {}),
    "qk_norm": (QKNormAttention, {}),
    "wide_heads": (FullWidthHeadsAttention, {}),
    "unseeded_init": (UnseededAttention, {}),
    "alibi": (ALiBiAttention, {}),
    "causal_flag": (CausalFlagAttention, {}),
    "padding_safe": (SafePaddingAttention, {}),
    "gpt2_conv1d": (GPT2Attention, {"n_embd": 64, "n_head": 4, "n_positions": 64}),
    "fairseq_bmm": (FoldedHeadsAttention, {}),
    "residual_inside": (ResidualAttention, {}),
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
