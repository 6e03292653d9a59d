"""The verdicts the audit must give on the corpus: for each layer of the corpus half of
``headlab.audit.examples.EXAMPLES`` (layers written the ways people write them), what its audit must
say (``Expected``). test_corpus.py checks them; test_examples.py checks that the corpus and
headlab's own variants together are every example.

The small modules for the audit's error paths are in tests/support/layers.py.
"""

from __future__ import annotations

from dataclasses import dataclass

SOFTMAX, F_SOFTMAX, SDPA = "torch.softmax", "torch.nn.functional.softmax", \
    "torch.nn.functional.scaled_dot_product_attention"


@dataclass(frozen=True)
class Expected:
    """What the audit of one corpus layer must say (fields of ``AuditResult``; ``says``: verdict fragments)."""

    function: str
    causal: bool
    standard: bool = True
    bilinear: bool = True
    linear: bool = True
    verified: bool = True
    n_heads: int = 4
    n_kv_heads: int = 4
    kv_sharing: str = "tested"
    attention_calls: int = 1
    call: str = "self"
    batch_first: bool = True
    layout: str = "standard"
    says: tuple[str, ...] = ()


NOT_BILINEAR = dict(standard=False, bilinear=False, verified=False, kv_sharing="values only")
CORPUS = {
    "llama_rotary": Expected(F_SOFTMAX, True, **NOT_BILINEAR, n_kv_heads=2, layout="grouped-query", says=(
        "2 key/value heads, each shared by a group of 2 query heads (grouped-query attention), read from the values",
        "what breaks it: a complex product with a fixed tensor that follows the positions (e.g. rotary positions)",
        "the module computes in float32 inside its forward")),
    "neox_rotary": Expected(SDPA, True, **NOT_BILINEAR, says=(
        "what breaks it: a product with a fixed tensor that follows the positions (e.g. rotary positions)",)),
    "nanogpt_config": Expected(F_SOFTMAX, True),
    "head_modules": Expected(F_SOFTMAX, True, attention_calls=4, says=(
        "the 4 heads are computed by 4 attention calls in one forward",)),
    "head_loop": Expected(SOFTMAX, False, attention_calls=4, says=(
        "the 4 heads are computed by 4 attention calls in one forward",
        "a query whose keys are all masked still attends")),
    "prenorm": Expected(SDPA, False, **NOT_BILINEAR, linear=False, says=(
        "not a bilinear form of the inputs (residual", "what breaks it: layer_norm. Head size",
        "not linear in the values at fixed attention weights")),
    "qk_norm": Expected(SOFTMAX, False, **NOT_BILINEAR, says=(
        "what breaks it: an element-wise product of two input-dependent tensors; pow; rsqrt",)),
    "wide_heads": Expected(SOFTMAX, False, kv_sharing="cannot be told", says=(
        "key/value sharing cannot be told apart: every head's keys and values read all 16 input dimensions",)),
    "unseeded_init": Expected(SOFTMAX, False, says=(
        "warning: two constructions with the same seed compute different outputs",)),
    "alibi": Expected(SOFTMAX, True, **NOT_BILINEAR, says=(
        "what breaks it: a sum with a fixed tensor that follows the positions (e.g. a position embedding or bias)",)),
    "causal_flag": Expected(SDPA, False, says=(
        "is_causal=True is ignored when weights are requested: with need_weights=True earlier outputs change",)),
    "padding_safe": Expected(F_SOFTMAX, False, says=("a batch item whose keys are all masked gets no attention",)),
    "gpt2_conv1d": Expected(F_SOFTMAX, True),
    "fairseq_bmm": Expected(F_SOFTMAX, False, call="qkv", batch_first=False, says=(
        "a batch item whose keys are all masked gets NaN (mask: key_padding_mask (batch, key_pos), bool, "
        "True = not allowed)",)),
    "residual_inside": Expected("Tensor.softmax", False, standard=False, verified=False, says=(
        "warning: part of the output goes around the attention",)),
}
