"""Tiny random transformers models, built from their configs in memory (no download).

- ``build(name)`` / ``built(name)``: a model of any architecture of ``ARCHITECTURES`` (each with the
  config that exercises what makes it different: grouped- and multi-query heads, sliding windows
  shorter than the test sequences, soft-capped logits, fused projections, partial rotary, q/k norms,
  biases), ``LIMITS`` or ``UNSUPPORTED`` (architectures that compute attention outside transformers'
  AttentionInterface, with the word their refusal must contain); ``batch`` gives padded inputs.
- ``pruned_bert``: a 3-layer BERT attached with heads (4, 4, 2) that counts its forwards (capture).
- ``tiny(kind)``: a ``HeadedModel`` of a BERT, GPT-2 or grouped-query LLaMA with the word-piece tokenizer
  (viewer, report).
- ``save_causal_checkpoint``: a GPT-2 and its tokenizer saved as a user's checkpoint folder (CLI).

Every weight is random (biases and norms included) and larger than transformers' init, so that
patterns are far from uniform.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.text import fake_tokenizer, word_piece_tokenizer

VOCAB = 100
PAD = 0
LENGTH = 9  # test sequences: longer than every sliding window below


@dataclass(frozen=True)
class Architecture:
    """One architecture as the tests build it.

    Attributes:
        name: the test id (the transformers model_type).
        causal: a causal LM (``AutoModelForCausalLM``) or an encoder (``AutoModel``).
        config: overrides of the shared small sizes, passed to ``AutoConfig.for_model``.
        features: what this config exercises, for people (docs/models.md).
    """

    name: str
    causal: bool
    config: dict[str, Any] = field(default_factory=dict)
    features: tuple[str, ...] = ()


_GQA = dict(num_key_value_heads=2, head_dim=8)
_IDS = dict(pad_token_id=PAD, bos_token_id=1, eos_token_id=2)
ARCHITECTURES = {a.name: a for a in (
    Architecture("gpt2", True, dict(n_embd=32, n_layer=2, n_head=4, n_positions=64), ("fused qkv (Conv1D)",)),
    Architecture("gpt_neox", True, dict(rotary_pct=0.5), ("fused qkv, per head interleaved", "partial rotary")),
    Architecture("opt", True, dict(ffn_dim=64, word_embed_proj_dim=32), ("query scaled before the call",)),
    Architecture("llama", True, _GQA | dict(attention_bias=True), ("grouped-query", "biases")),
    Architecture("mistral", True, _GQA | dict(num_key_value_heads=1, sliding_window=4),
                 ("multi-query", "sliding window")),
    Architecture("qwen2", True, _GQA | dict(use_sliding_window=True, sliding_window=4, max_window_layers=1),
                 ("grouped-query", "sliding window on some layers", "q/k/v biases")),
    Architecture("qwen3", True, _GQA, ("grouped-query", "q/k norms")),
    Architecture("gemma", True, _GQA, ("grouped-query",)),
    Architecture("gemma2", True, _GQA | dict(sliding_window=4, attn_logit_softcapping=5.0),
                 ("grouped-query", "logit soft-capping", "sliding window on alternate layers")),
    Architecture("gemma3_text", True, _GQA | dict(sliding_window=4, layer_types=["sliding_attention",
                                                                                 "full_attention"]),
                 ("grouped-query", "q/k norms", "sliding and global layers")),
    Architecture("phi", True, dict(partial_rotary_factor=0.5, qk_layernorm=True),
                 ("partial rotary", "q/k layer norms")),
    Architecture("phi3", True, _GQA, ("fused qkv with grouped-query",)),
    Architecture("stablelm", True, _GQA | dict(partial_rotary_factor=0.5), ("grouped-query", "partial rotary")),
    Architecture("gpt_bigcode", True, dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=True),
                 ("multi-query", "fused qkv")),
    Architecture("bert", False, {}, ("bidirectional",)),
    Architecture("roberta", False, {}, ("bidirectional", "positions after the padding index")),
    Architecture("distilbert", False, dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64), ("bidirectional",)),
    Architecture("xlm-roberta", False, {}, ("bidirectional",)),
)}

UNSUPPORTED = {  # model_type: (config overrides, a word the refusal names)
    "bloom": (dict(n_layer=2, n_head=4), "AttentionInterface"),
    "deberta-v2": ({}, "AttentionInterface"),
    "falcon": ({}, "AttentionInterface"),
}

# Served, but kept out of the per-architecture matrix: each shows one limit (tests/models/test_attach.py).
LIMITS = {a.name: a for a in (
    Architecture("olmo2", True, {}, ("a norm over every head's queries: pruning refused",)),
    Architecture("deepseek_v3", True, dict(num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8,
                                           qk_rope_head_dim=4, v_head_dim=6, first_k_dense_replace=2,
                                           n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                                           n_group=1, topk_group=1),
                 ("low-rank (MLA) q/k/v projections: layout not recognised", "d_head_v != d_head")),
)}

_SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=64)


def _transformers() -> Any:
    """transformers, or the calling test skipped without it."""
    return pytest.importorskip("transformers")


def tiny_config(name: str, **overrides: Any) -> Any:
    """The small config of ``name`` (an ``ARCHITECTURES``, ``LIMITS`` or ``UNSUPPORTED`` key); ``overrides`` win."""
    sizes = (ARCHITECTURES | LIMITS)[name].config if name in ARCHITECTURES or name in LIMITS else UNSUPPORTED[name][0]
    base = _SMALL if "n_embd" not in sizes and "dim" not in sizes else {}
    return _transformers().AutoConfig.for_model(name, **(base | dict(vocab_size=VOCAB) | _IDS | sizes | overrides))


def auto_class(name: str) -> Any:
    known = ARCHITECTURES | LIMITS
    causal = known[name].causal if name in known else name not in ("deberta-v2", "t5", "bart")
    return _transformers().AutoModelForCausalLM if causal else _transformers().AutoModel


def build(name: str, *, attn_implementation: str = "eager", seed: int = 0, std: float = 0.2,
          **overrides: Any) -> torch.nn.Module:
    """A model of ``name`` with every weight drawn from N(0, ``std``) (norm weights around 1), in eval mode.

    ``overrides`` are config fields (``tiny_config``)."""
    torch.manual_seed(seed)
    config = tiny_config(name, **overrides)
    model = auto_class(name).from_config(config, attn_implementation=attn_implementation)
    with torch.no_grad():
        for parameter_name, p in model.named_parameters():
            p.normal_(0.0, std)
            if "norm" in parameter_name.lower() and parameter_name.endswith("weight"):
                p.add_(1.0)
    return model.eval()


@functools.cache
def _built(name: str, attn_implementation: str) -> torch.nn.Module:
    return build(name, attn_implementation=attn_implementation)


def built(name: str, *, attn_implementation: str = "eager") -> torch.nn.Module:
    """A deep copy of a cached ``build(name)``: the same weights every time, cheap to ask for again."""
    return copy.deepcopy(_built(name, attn_implementation))


def batch(*, padding: str, batch_size: int = 3, length: int = LENGTH,
          seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` with ragged padding on the ``padding`` side ("left" / "right" / "none")."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch_size, length), generator=generator)
    mask = torch.ones(batch_size, length, dtype=torch.long)
    for row in range(1, batch_size):
        pad = min(2 * row + 1, length - 2)
        if padding == "left":
            mask[row, :pad] = 0
        elif padding == "right":
            mask[row, length - pad:] = 0
    return ids.masked_fill(mask == 0, PAD), mask


def first_output(output: Any) -> torch.Tensor:
    return output.logits if getattr(output, "logits", None) is not None else output.last_hidden_state


def max_diff_on_tokens(a: torch.nn.Module, b: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> float:
    """max |b − a| of the first outputs over the positions that are not padding."""
    with torch.no_grad():
        x = first_output(a(input_ids=ids, attention_mask=mask))
        y = first_output(b(input_ids=ids, attention_mask=mask))
    keep = mask.bool()
    return float((x[keep] - y[keep]).abs().max())


# --- a BERT with pruned heads, counting its forwards (capture) -------------------------------------------------------

HEADS = (4, 4, 2)  # heads per layer: layer 2 is pruned, so that per-layer selections are exercised
D_MODEL = 16


def pruned_bert(vocab_size: int, *, max_positions: int = 64, seed: int = 0) -> torch.nn.Module:
    """A random 3-layer BERT (d_model 16, 4 heads), attached, layer 2 pruned to 2 heads; ``forward_calls``
    counts its forwards."""
    import headlab
    from headlab import heads

    model = build("bert", seed=seed, std=0.3, vocab_size=vocab_size, hidden_size=D_MODEL,
                  num_hidden_layers=len(HEADS), num_attention_heads=max(HEADS), intermediate_size=32,
                  max_position_embeddings=max_positions)
    headlab.attach(model)
    heads.prune(model, {layer: list(range(n, max(HEADS))) for layer, n in enumerate(HEADS) if n < max(HEADS)})
    model.forward_calls = 0

    def count(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        module.forward_calls += 1

    model.register_forward_pre_hook(count, with_kwargs=True)
    return model


# --- loaded models with a tokenizer (viewer, report, CLI) ------------------------------------------------------------

POSITIONS = 2100  # room for the viewer's 2,000-token check


@functools.cache
def tiny(kind: str, *, layers: int = 2, heads: int = 4):
    """A ``HeadedModel`` of a random ``kind`` ("bert": bidirectional, "gpt2": causal, "llama": causal with
    grouped-query heads) with the word-piece tokenizer, attached, on SDPA; one per arguments and session."""
    import headlab
    from headlab.models import HeadedModel

    tok = word_piece_tokenizer()
    ids = dict(vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    if kind == "bert":
        model = build("bert", num_hidden_layers=layers, num_attention_heads=heads, max_position_embeddings=POSITIONS,
                      attn_implementation="sdpa", **ids)
    elif kind == "gpt2":
        model = build("gpt2", n_layer=layers, n_head=heads, n_positions=POSITIONS, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, attn_implementation="sdpa", **ids)
    elif kind == "llama":  # grouped-query: every two query heads share a key/value head
        model = build("llama", num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
                      max_position_embeddings=POSITIONS, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      attn_implementation="sdpa", **ids)
    else:
        raise ValueError(kind)
    return HeadedModel(model=headlab.attach(model).model, tokenizer=tok, source=f"tiny random {kind}")


def save_causal_checkpoint(folder: Path, **overrides: Any) -> Path:
    """Save a random 2-layer GPT-2 (``overrides`` of its config) with the word-piece tokenizer beside it,
    as a user's checkpoint directory."""
    tok = _transformers().PreTrainedTokenizerFast(tokenizer_object=fake_tokenizer(), pad_token="[PAD]",
                                                  eos_token="[SEP]", bos_token="[CLS]")
    build("gpt2", vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
          pad_token_id=tok.pad_token_id, **overrides).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
