"""Circuits: edge attribution (EAP, EAP-IG) and exact edge patching against one forward + backward.

Axis legend: input_ids ``(batch, pos)``.

On the loaded model (the default MiniLM) at ``plan.circuit_tokens`` tokens: the clean input is the
bundled corpus read in order, truncated to that many tokens (the tokenizer's special tokens
included); the corrupted input is the same ids with ``CORRUPTED_SHARE`` of the word pieces (never a
special token; seeded) replaced by the different ones at the same positions of the corpus read backwards. The
metric is the cosine similarity of the mean-pooled output to the clean run's
(``embedding_similarity``). Every method scores every edge of the graph
(``headlab.circuits.graph_edges``: 6,769 edges in MiniLM's 6 layers × 12 heads).

The peer is one forward and backward of the model on the corrupted input: the metric's gradient
carried back through every layer to the input embeddings (``torch.autograd.grad``; no parameter's
gradient is kept), the pass EAP is built on. In one interleaved group: the peer, EAP, EAP-IG with
``EAP_IG_STEPS`` steps, and exact edge patching of a seeded sample of ``plan.circuit_edges`` edges (one
forward per edge; its time over every edge is extrapolated from the sample's, per forward). Goals: EAP
(two forwards and one backward whatever the edge count, so about 1.3 × the peer's passes, and the
products) at most ``EAP_GOAL`` × the peer; EAP-IG (two forwards, then a forward and backward per step)
at most ``EAP_IG_GOAL`` ×. Their rank agreement (Spearman) with exact edge patching on the sampled edges is
reported, from the last timed run of each, without a goal. Peak memory (``headlab.bench.memory``) of
EAP and EAP-IG, each at most ``MEMORY_GOAL`` × the peer's, measured after the timings in
``plan.memory_rounds`` interleaved rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from headlab.bench.memory import peak_memory_available, peak_memory_interleaved
from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import Timing, time_interleaved

__all__ = ["CORRUPTED_SHARE", "EAP_GOAL", "EAP_IG_GOAL", "EAP_IG_STEPS", "MEMORY_GOAL", "PEER", "SEED",
           "bench_circuits", "circuit_inputs"]

EAP_GOAL = 3.0  # EAP / one forward + backward, whatever the edge count
EAP_IG_STEPS = 5
EAP_IG_GOAL = 12.0  # EAP-IG with EAP_IG_STEPS steps / one forward + backward
MEMORY_GOAL = 2.0  # peak memory of EAP (and of EAP-IG) / the forward + backward's
CORRUPTED_SHARE = 1 / 8  # of the clean input's word pieces, replaced in the corrupted one
SEED = 0  # the corrupted positions and the sampled edges
PEER = "forward + backward (the metric's gradient to the embeddings)"


def circuit_inputs(tokenizer: Any, tokens: int, *, seed: int = SEED) -> tuple[Tensor, Tensor, int]:
    """The area's clean and corrupted input ids from the bundled corpus (see the module docstring).

    Args:
        tokenizer: the model's tokenizer (a transformers tokenizer).
        tokens: the inputs' length, special tokens included.
        seed: which word pieces are replaced.

    Returns:
        ``(clean, corrupted, replaced)``: ids ``(1, tokens)`` each, and how many positions differ.

    Raises:
        ValueError: the corpus is shorter than ``tokens`` for this tokenizer.
    """
    from headlab.capture import load_corpus

    texts = list(load_corpus().texts)
    clean = tokenizer(" ".join(texts), truncation=True, max_length=tokens, return_special_tokens_mask=True,
                      return_tensors="pt")
    other = tokenizer(" ".join(reversed(texts)), truncation=True, max_length=tokens, return_tensors="pt")["input_ids"]
    ids = clean["input_ids"]
    if ids.shape[1] != tokens or other.shape[1] != tokens:
        raise ValueError(f"the bundled corpus is {min(ids.shape[1], other.shape[1])} tokens for this tokenizer; "
                         f"the circuits area needs {tokens}")
    pieces = int((~clean["special_tokens_mask"][0].bool()).sum())
    # word pieces whose backward counterpart differs (never a special token): each one chosen changes
    differ = torch.nonzero(~clean["special_tokens_mask"][0].bool() & (ids[0] != other[0])).flatten()
    order = torch.randperm(len(differ), generator=torch.Generator().manual_seed(seed))
    replaced = differ[order[: max(1, round(pieces * CORRUPTED_SHARE))]]
    corrupted = ids.clone()
    corrupted[0, replaced] = other[0, replaced]
    return ids, corrupted, int((corrupted != ids).sum())


def bench_circuits(plan: Plan, loaded: Any, *, tick: Callable[[str], None] = lambda _: None) -> Area:
    """EAP and EAP-IG against one forward + backward, exact edge patching on a sample, and peak memory.

    Args:
        plan: device, rounds, ``circuit_tokens``, ``circuit_edges`` and ``memory_rounds``.
        loaded: ``headlab.load()``'s result on the plan's device and dtype.
        tick: progress.

    Returns:
        The "circuits" area: EAP, EAP-IG and exact edge patching (extrapolated) against the peer; EAP's and
        EAP-IG's peak memory against the peer's (left out with a note where it cannot be measured).
    """
    from headlab.analysis.importance import spearman
    from headlab.analysis.patching import embedding_similarity
    from headlab.bench.capture import model_name
    from headlab.circuits.edges import edge_attribution, edge_patching
    from headlab.circuits.graph import graph_edges

    clean, corrupted, replaced = circuit_inputs(loaded.tokenizer, plan.circuit_tokens)
    clean, corrupted = clean.to(plan.device), corrupted.to(plan.device)
    with loaded.running(grad=False) as net:
        reference = net(input_ids=clean).last_hidden_state.mean(dim=1)  # (batch, d_model)
    metric = embedding_similarity(reference)
    edges = graph_edges(loaded)
    generator = np.random.default_rng(SEED)
    count = len(edges) if plan.circuit_edges is None else min(plan.circuit_edges, len(edges))
    sampled = np.sort(generator.choice(len(edges), size=count, replace=False))
    sample = [edges[i] for i in sampled]
    every = count == len(edges)

    tokens = clean.shape[1]
    area = Area("circuits", "Circuits: edge attribution (EAP, EAP-IG) and edge patching vs one forward + backward", (
        f"{model_name(loaded)}, {plan.dtype} on {plan.device}, one input of {tokens} tokens: the bundled corpus in "
        f"order; corrupted: {replaced} of its word pieces (seed {SEED}) replaced by the different ones at the same "
        "positions of the corpus read backwards. Metric: cosine similarity of the mean-pooled output to the clean "
        f"run's. Every method scores every edge of the graph ({len(edges):,} edges). Peer: one forward + backward on "
        "the corrupted input, the metric's gradient carried back to the input embeddings (no parameter gradient kept). "
        f"One interleaved group ({plan.rounds} rounds, median); one call is a whole run of a method. Exact edge "
        f"patching runs one forward per edge: {'every edge' if every else f'a seeded sample of {count} edges'} is "
        f"timed{'' if every else ' and its time per forward multiplied by the forwards of every edge'}. Spearman: rank "
        f"correlation of each estimate with exact edge patching on the {count} sampled edges (of the scores' "
        "magnitudes and signed), from the last timed run of each. Peak memory: the growth of the process's peak "
        f"resident memory (CUDA: of the allocator's peak) during one call, {plan.memory_rounds} interleaved "
        "round(s), median."))

    last: dict[str, Any] = {}

    def method(name: str, run: Callable[[], Any]) -> Callable[[], None]:
        def once() -> None:
            last[name] = run()
        return once

    contenders = {
        PEER: _forward_backward(loaded, corrupted, metric),
        "EAP": method("EAP", lambda: edge_attribution(loaded, clean, corrupted, metric, method="eap")),
        "EAP-IG": method("EAP-IG", lambda: edge_attribution(loaded, clean, corrupted, metric, method="eap-ig",
                                                            steps=EAP_IG_STEPS)),
        "edge patching": method("edge patching", lambda: edge_patching(loaded, clean, corrupted, metric,
                                                                       edges=sample)),
    }
    case = f"{model_name(loaded)} · {tokens} tokens · {len(edges):,} edges"
    tick(f"circuits: {case}")
    t = time_interleaved(contenders, rounds=plan.rounds, min_block_s=plan.min_block_s, warmup=0, device=plan.device)

    exact = last["edge patching"]
    forwards = len(edges) + exact.forwards - count  # every edge's forward and the two unpatched runs
    scale = forwards / exact.forwards  # the sample's time per forward, times every edge's forwards
    extrapolated = Timing(tuple(s * scale for s in t["edge patching"].samples), t["edge patching"].calls_per_round)
    agreement: dict[str, tuple[float, float]] = {}
    for name in ("EAP", "EAP-IG"):
        estimate = last[name].scores[sampled]
        agreement[name] = (spearman(np.abs(estimate), np.abs(exact.scores)), spearman(estimate, exact.scores))

    def details(name: str) -> dict[str, Any]:
        scores = last[name]
        magnitude, signed = agreement[name]
        return {"edges": len(scores), "forwards": scores.forwards, "backwards": scores.backwards,
                f"spearman |score| vs edge patching ({count} edges)": magnitude,
                "spearman signed vs edge patching": signed}

    patched = f"exact edge patching, every edge ({'all timed' if every else f'extrapolated from {count} sampled'})"
    area.rows += [
        Comparison(case, "EAP, every edge", PEER, t["EAP"], t[PEER], goal=EAP_GOAL, details=details("EAP")),
        Comparison(case, f"EAP-IG ({EAP_IG_STEPS} steps), every edge", PEER, t["EAP-IG"], t[PEER], goal=EAP_IG_GOAL,
                   details=details("EAP-IG")),
        Comparison(case, patched, PEER, extrapolated, t[PEER], details={
            "edges": len(edges), "sampled edges": count, "sample seed": SEED,
            "seconds for the sample": t["edge patching"].median, "forwards for the sample": exact.forwards,
            "forwards for every edge": forwards}),
    ]
    area.notes.append(
        f"Rank agreement with exact edge patching on {count} sampled edges (Spearman of |score|, signed): EAP "
        f"{agreement['EAP'][0]:.3f}, {agreement['EAP'][1]:.3f}; EAP-IG ({EAP_IG_STEPS} steps) "
        f"{agreement['EAP-IG'][0]:.3f}, {agreement['EAP-IG'][1]:.3f}.")
    if not every:
        area.notes.append(
            f"Exact edge patching over every edge is extrapolated, not timed: {count} of the {len(edges):,} edges "
            f"(seed {SEED}) were patched in {t['edge patching'].median:.3g} s ({exact.forwards} forwards: one per "
            f"edge and the two unpatched runs), and that time per forward is multiplied by the {forwards:,} forwards "
            "of every edge.")
    for row, name in zip(area.rows[:2], ("EAP", "EAP-IG")):
        if row.met() is False:
            scores = last[name]
            passes = (scores.forwards + 2 * scores.backwards) / 3  # a backward ≈ two forwards
            area.notes.append(
                f"{name} ran {scores.forwards} forwards and {scores.backwards} "
                f"backward{'' if scores.backwards == 1 else 's'}, about {passes:.1f}× the "
                f"peer's passes, and took {row.ratio:.1f}× its time (goal ≤ {row.goal:g}): the rest is {name}'s own "
                "work beside the passes.")
    _memory_rows(plan, area, case, contenders)
    return area


def _forward_backward(loaded: Any, inputs: Tensor, metric: Callable[[Any], Tensor]) -> Callable[[], None]:
    """The peer: one forward of ``inputs`` with autograd and the metric's gradient back to the input
    embeddings' output (a leaf of the graph, so every layer's backward runs; no parameter's ``.grad`` is set)."""
    embeddings = loaded.model.get_input_embeddings()

    def once() -> None:
        leaves: list[Tensor] = []

        def leaf(module: torch.nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
            leaves.append(output.detach().requires_grad_(True))
            return leaves[-1]

        hook = embeddings.register_forward_hook(leaf)
        try:
            with loaded.running(grad=True) as net:
                value = metric(net(input_ids=inputs))
        finally:
            hook.remove()
        torch.autograd.grad(value, leaves)

    return once


def _memory_rows(plan: Plan, area: Area, case: str, contenders: dict[str, Callable[[], None]]) -> None:
    """Peak memory of EAP and EAP-IG against the peer's, or a note saying why it is not measured."""
    why = peak_memory_available(plan.device)
    if why is not None:
        area.notes.append(f"Peak memory not measured: {why}.")
        return
    measured = peak_memory_interleaved({name: contenders[name] for name in (PEER, "EAP", "EAP-IG")},
                                       rounds=plan.memory_rounds, device=plan.device)
    peer = f"peak memory of the {PEER}"
    area.rows += [
        Comparison(case, "peak memory of EAP", peer, measured["EAP"], measured[PEER], goal=MEMORY_GOAL, unit="bytes"),
        Comparison(case, f"peak memory of EAP-IG ({EAP_IG_STEPS} steps)", peer, measured["EAP-IG"], measured[PEER],
                   goal=MEMORY_GOAL, unit="bytes"),
    ]
