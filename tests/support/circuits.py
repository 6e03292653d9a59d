"""Circuits with a known answer: planted in tiny random transformers, and the induction experiment's.

- ``random_pair(name)``: a tiny random model in float64, a clean and a corrupted input, a logit metric.
- ``planted(name)``: a tiny GPT-2 or grouped-query LLaMA whose only working heads are A = L0 H0 and
  B = L1 H1, with A feeding B through B's query: token embeddings live in dims 0..15; A attends
  uniformly (zero q, k) and writes its values of the tokens into dims 16..23; B's query reads dims
  16..23 only, its key and value read the tokens, and it writes back into the tokens' dims, which the
  unembedding reads. A writes +u into dims 16..23 and −u into 24..31, so that a LayerNorm's mean does not
  carry it into the tokens' dims, and small, so that the norms' scales hardly move. The MLPs write
  nothing. Corrupting an early token changes A's output, hence B's query: the one head → head edge that
  matters is A → B.q.
- ``induction()``: the induction experiment's trained 2-layer model (quick) on its circuit pair
  (``headlab.experiments.induction.induction_pair``).
- ``tiny_edges(kind)``: EAP scores of ``tiny(kind)`` (a model with a tokenizer: the viewer's circuit panel)
  on two texts one word apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

import headlab
from headlab.circuits.graph import EdgeScores
from headlab.models import HeadedModel
from tests.support.tiny import build, tiny

A, B = (0, 0), (1, 1)  # the planted sender and receiver heads
# how strongly A writes and B's query reads: a LayerNorm's scale moves with everything written, so in GPT-2
# A writes small and B reads it with a large gain
GAINS = {"gpt2": (0.3, 12.0), "llama": (3.0, 3.0)}
TOKENS, WRITTEN, MIRROR = slice(0, 16), slice(16, 24), slice(24, 32)  # the tokens' dims, and the dims A writes


def random_pair(name: str = "gpt2", *, std: float = 0.2) -> tuple[HeadedModel, torch.Tensor, torch.Tensor,
                                                                   Callable[[Any], torch.Tensor]]:
    """A tiny random ``name`` in float64, two items of 8 tokens and the same with token 2 changed, and a logit
    difference at the last position."""
    handle = headlab.attach(build(name, std=std).double())
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(3, 100, (2, 8), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(3, 100, (2,), generator=generator)

    def metric(output: Any) -> torch.Tensor:
        return (output.logits[:, -1, 5] - output.logits[:, -1, 7]).mean()

    return handle, clean, corrupted, metric


def planted(name: str) -> tuple[HeadedModel, torch.Tensor, torch.Tensor, Callable[[Any], torch.Tensor]]:
    """``(handle, clean ids, corrupted ids, metric)`` of the planted circuit in a tiny ``name`` ("gpt2" or
    "llama"), in float64."""
    generator = torch.Generator().manual_seed(3)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale

    write, read = GAINS[name]
    model = build(name, seed=3).double()
    with torch.no_grad():
        for parameter_name, p in model.named_parameters():
            is_norm_weight = "norm" in parameter_name or ".ln_" in parameter_name or "ln_f" in parameter_name
            p.fill_(1.0 if is_norm_weight and parameter_name.endswith("weight") else 0.0)
        d_head = 8
        eye = torch.eye(d_head, dtype=torch.float64) * write
        if name == "gpt2":
            blocks = model.transformer.h
            model.transformer.wte.weight[:, TOKENS] = rand(model.config.vocab_size, 16)
            a_attn, b_attn = blocks[A[0]].attn, blocks[B[0]].attn
            v_a = slice(64 + A[1] * d_head, 64 + (A[1] + 1) * d_head)
            a_attn.c_attn.weight[TOKENS, v_a] = rand(16, d_head)
            a_attn.c_proj.weight[A[1] * d_head:(A[1] + 1) * d_head, WRITTEN] = eye
            a_attn.c_proj.weight[A[1] * d_head:(A[1] + 1) * d_head, MIRROR] = -eye
            head = slice(B[1] * d_head, (B[1] + 1) * d_head)
            b_attn.c_attn.weight[WRITTEN, head] = rand(d_head, d_head, scale=read)  # query
            b_attn.c_attn.weight[TOKENS, 32 + B[1] * d_head: 32 + (B[1] + 1) * d_head] = rand(16, d_head)  # key
            b_attn.c_attn.weight[TOKENS, 64 + B[1] * d_head: 64 + (B[1] + 1) * d_head] = rand(16, d_head)  # value
            b_attn.c_proj.weight[head, TOKENS] = rand(d_head, 16)
        else:  # llama: query head h reads key/value head h // 2
            layers = model.model.layers
            model.model.embed_tokens.weight[:, TOKENS] = rand(model.config.vocab_size, 16)
            model.lm_head.weight[:, TOKENS] = rand(model.config.vocab_size, 16)
            a_attn, b_attn = layers[A[0]].self_attn, layers[B[0]].self_attn
            kv_a, kv_b = A[1] // 2, B[1] // 2
            a_attn.v_proj.weight[kv_a * d_head:(kv_a + 1) * d_head, TOKENS] = rand(d_head, 16)
            a_attn.o_proj.weight[WRITTEN, A[1] * d_head:(A[1] + 1) * d_head] = eye
            a_attn.o_proj.weight[MIRROR, A[1] * d_head:(A[1] + 1) * d_head] = -eye
            head = slice(B[1] * d_head, (B[1] + 1) * d_head)
            b_attn.q_proj.weight[head, WRITTEN] = rand(d_head, d_head, scale=read)
            b_attn.k_proj.weight[kv_b * d_head:(kv_b + 1) * d_head, TOKENS] = rand(d_head, 16)
            b_attn.v_proj.weight[kv_b * d_head:(kv_b + 1) * d_head, TOKENS] = rand(d_head, 16)
            b_attn.o_proj.weight[TOKENS, head] = rand(16, d_head)
    handle = headlab.attach(model)
    clean = torch.randint(3, model.config.vocab_size, (4, 8), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 1] = torch.randint(3, model.config.vocab_size, (4,), generator=generator)

    def metric(output: Any) -> torch.Tensor:
        logits = output.logits[:, -3:]  # (batch, 3, vocab): the last positions read B's output
        return (logits[..., 5] - logits[..., 7]).mean()

    return handle, clean, corrupted, metric


@functools.cache
def _trained() -> Any:
    from headlab.experiments.induction import run_induction

    return run_induction(quick=True)


def induction() -> tuple[HeadedModel, torch.Tensor, torch.Tensor, Callable[[Any], torch.Tensor],
                         set[tuple[int, int]], set[tuple[int, int]]]:
    """``(handle, clean, corrupted, metric, previous-token heads, induction heads)`` of the induction experiment's
    trained model (trained once per test session) on its circuit pair (``induction_pair``); the heads are those
    headlab's detectors find (``InductionResult.previous_token_heads``, ``induction_heads``)."""
    from headlab.experiments.induction import induction_pair

    result = _trained()
    pair = induction_pair(result)
    previous = {(layer, head) for layer, head in result.previous_token_heads}
    inducing = {(layer, head) for layer, head in result.induction_heads}
    return headlab.attach(result.model), pair.clean, pair.corrupted, pair.metric, previous, inducing


CLEAN, CORRUPTED = "the big red dog ran on the mat", "the big red cat ran on the mat"  # one word apart, as many pieces


@functools.cache
def tiny_edges(kind: str) -> EdgeScores:
    """EAP scores of ``tiny(kind)`` on ``CLEAN`` against ``CORRUPTED``, the metric a logit difference at the
    changed word; once per session."""
    from headlab.circuits import edge_attribution

    def metric(output: Any) -> torch.Tensor:
        return (output.logits[:, 4, 5] - output.logits[:, 4, 7]).mean()  # position 4: "dog" / "cat"

    return edge_attribution(tiny(kind), CLEAN, CORRUPTED, metric)
