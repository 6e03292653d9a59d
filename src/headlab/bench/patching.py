"""Patching: attribution patching (AtP; Kramár et al. 2024) against exact activation patching.

Axis legend: input_ids ``(batch, pos)``.

Per model, both methods patch every head of one clean/corrupted pair in one interleaved group;
one call is a whole run of a method (the clean run, the corrupted baseline and, for the exact
method, one forward per head). The row's details hold how far AtP's estimates agree with the
exact effects (Spearman rank correlation of their magnitudes and of their signed values, from
the last timed run of each) and the passes each ran.

Models: the loaded default model (MiniLM) on ``CLEAN`` → ``CORRUPTED`` with the similarity
metric (cosine similarity of the mean-pooled output to the clean text's), and
``tiny_causal_model`` (a random Llama, seed 0) on random token ids at ``plan.causal_shape`` whose
corrupted copy differs in ``CHANGED`` positions, with the logit difference of ``ANSWER`` and
``WRONG`` at the last position. That model has no language-model head (see
``headlab.bench.models``), so its logits are read through the tied unembedding: the input
embedding matrix, as a language model with tied embeddings (GPT-2, many small Llamas) reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from headlab.bench.models import CAUSAL_CONFIG, tiny_causal_model
from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import time_interleaved

__all__ = ["ANSWER", "ATP_GOAL", "CHANGED", "CLEAN", "CORRUPTED", "WRONG", "bench_patching", "tied_logit_difference"]

# AtP runs two forwards and one backward (about two forwards more) whatever the number of heads; exact
# patching runs one forward per head plus two. Both models have at least 32 heads (34 forwards against
# about 4), so AtP should take well under 0.2 of the time; the bound leaves room for AtP's gradient
# bookkeeping on every z.
ATP_GOAL = 0.2
CLEAN, CORRUPTED = "The cat sat on the mat.", "The dog sat on the mat."
CHANGED = 4  # positions of the tiny causal model's input that the corruption redraws
ANSWER, WRONG = 7, 11  # token ids of the tiny causal model's logit difference


def tied_logit_difference(model: nn.Module, answer: int, wrong: int) -> Callable[[Any], Tensor]:
    """A metric for a base causal model: ``logit[answer] − logit[wrong]`` at the last position,
    the logits read through the input embeddings (a tied unembedding); mean over the batch.

    Args:
        model: a transformers base model (``get_input_embeddings()``; output ``last_hidden_state``).
        answer, wrong: token ids.

    Returns:
        ``metric(output) -> scalar``, differentiable.
    """
    weight = cast(Any, model).get_input_embeddings().weight  # a transformers model
    direction = (weight[answer] - weight[wrong]).detach()  # (d_model,)

    def metric(output: Any) -> Tensor:
        return (output.last_hidden_state[:, -1] @ direction).mean()

    return metric


def bench_patching(plan: Plan, loaded: Any, *, tick: Callable[[str], None] = lambda _: None) -> Area:
    """AtP against exact activation patching on the default model and a tiny causal model.

    Args:
        plan: device, dtype, rounds and ``causal_shape``.
        loaded: ``headlab.load()``'s result on the plan's device and dtype.
        tick: progress.

    Returns:
        The "patching" area: one row per model, its details the rank correlations and passes.
    """
    import headlab
    from headlab.analysis.patching import text_metric
    from headlab.bench.capture import model_name

    area = Area("patching", "Patching: attribution patching (AtP) vs exact activation patching", (
        f"{plan.dtype} on {plan.device}. Per model, both methods patch every head's z from the clean run into the "
        f"corrupted one, in one interleaved group ({plan.rounds} rounds, median); one call is a whole run of a method. "
        f"The default model: {CLEAN!r} → {CORRUPTED!r}, cosine similarity of the mean-pooled output to the clean "
        f"text's. The tiny random Llama (seed 0): random token ids, {CHANGED} positions redrawn in the corrupted copy, "
        f"logit({ANSWER}) − logit({WRONG}) at the last position through the tied unembedding (its input embeddings). "
        "Details: Spearman rank correlation of the two methods' per-head effects (of their magnitudes and signed), "
        "from the last timed run of each, and the passes each method runs."))

    tokenizer = loaded.tokenizer
    clean, corrupted = (dict(tokenizer(text, return_tensors="pt").to(plan.device)) for text in (CLEAN, CORRUPTED))
    metric, _ = text_metric(loaded, CLEAN, name="similarity")
    case = f"{model_name(loaded)} · {clean['input_ids'].shape[1]} tokens"
    tick(f"patching: {case}")
    area.rows.append(_compare(plan, loaded, clean, corrupted, metric, case))

    batch, pos = plan.causal_shape
    model = headlab.attach(tiny_causal_model(positions=pos, device=plan.device, dtype=plan.torch_dtype))
    generator = torch.Generator().manual_seed(0)
    vocab = CAUSAL_CONFIG["vocab_size"]
    ids = torch.randint(0, vocab, (batch, pos), generator=generator)
    changed = torch.randperm(pos - 1, generator=generator)[:CHANGED]  # the last position stays: it is read
    redrawn = ids.clone()
    shift = torch.randint(1, vocab, (batch, len(changed)), generator=generator)  # never 0: every redrawn id changes
    redrawn[:, changed] = (ids[:, changed] + shift) % vocab
    c = CAUSAL_CONFIG
    case = (f"tiny random Llama, {c['num_hidden_layers']} layers × {c['num_attention_heads']} heads "
            f"({c['num_key_value_heads']} kv heads), causal · batch {batch} · pos {pos} · {len(changed)} positions "
            "corrupted")
    tick(f"patching: {case}")
    area.rows.append(_compare(plan, model, ids.to(plan.device), redrawn.to(plan.device),
                              tied_logit_difference(model.model, ANSWER, WRONG), case))
    for row in area.rows:
        if row.met() is False:
            area.notes.append(f"{row.case}: AtP took {row.ratio:.3f}× the exact method's time (goal ≤ {ATP_GOAL}).")
    return area


def _compare(plan: Plan, model: Any, clean: Any, corrupted: Any, metric: Callable[[Any], Tensor],
             case: str) -> Comparison:
    """Time both methods on one pair in one group; the row's details from their last runs."""
    from headlab.analysis.importance import spearman
    from headlab.analysis.patching import activation_patching, attribution_patching

    last: dict[str, Any] = {}

    def run(name: str, method: Callable[..., Any]) -> Callable[[], None]:
        def once() -> None:
            last[name] = method(model, clean, corrupted, metric)
        return once

    t = time_interleaved({"exact": run("exact", activation_patching), "AtP": run("AtP", attribution_patching)},
                         rounds=plan.rounds, min_block_s=1e-6, warmup=0, device=plan.device)
    exact, atp = last["exact"], last["AtP"]
    e, a = exact.table["effect"], atp.table["effect"]
    return Comparison(case, "attribution patching (AtP), every head", "exact activation patching, every head",
                      t["AtP"], t["exact"], goal=ATP_GOAL, details={
                          "heads": len(e), "spearman |effect|": spearman(np.abs(e), np.abs(a)),
                          "spearman signed effect": spearman(e, a), "exact forwards": exact.forwards,
                          "AtP forwards": atp.forwards, "AtP backwards": atp.backwards})
