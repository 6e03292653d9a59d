"""Pruning: the default model with every other head of every layer removed, against the full model.

Contenders run the same batches of the bundled corpus (items sorted by length, batches of
``plan.hf_batch_size``): transformers' own model (sdpa), the model with headlab's attention
attached, the same with half the heads masked (masked heads are still computed) and with the
same heads physically pruned (``headlab.heads.prune``: the model's own projections sliced).
Pruned outputs are checked equal to masked outputs in the run.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import time_interleaved

__all__ = ["bench_pruning"]


def bench_pruning(plan: Plan, loaded: Any, *, tick: Callable[[str], None] = lambda _: None) -> Area:
    """Throughput of the pruned model against the full, masked and plain ones.

    Args:
        plan: device, dtype, corpus slice, batch size and rounds.
        loaded: ``headlab.load()``'s result on the plan's device and dtype.
        tick: progress.

    Returns:
        The "pruning" area.

    Raises:
        RuntimeError: the pruned model's outputs differ from the masked model's.
    """
    from transformers import AutoModel

    from headlab import heads
    from headlab.capture import load_corpus
    from headlab.models import headed

    sites = headed(loaded).sites
    half = {site.layer: list(range(0, site.n_heads, 2)) for site in sites}  # every other head
    masked, pruned = copy.deepcopy(loaded.model), copy.deepcopy(loaded.model)
    heads.mask(masked, half)
    heads.prune(pruned, half)
    plain = AutoModel.from_pretrained(loaded.source, attn_implementation="sdpa", dtype=plan.torch_dtype,
                                      use_safetensors=True).to(plan.device).eval()
    texts = sorted(list(load_corpus().texts)[: plan.corpus_items], key=len)
    size = plan.hf_batch_size
    batches = [loaded.tokenizer(texts[i : i + size], padding=True, truncation=True, max_length=256,
                                return_tensors="pt").to(plan.device) for i in range(0, len(texts), size)]
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    tol = 1e-4 if plan.torch_dtype == torch.float32 else 3e-2
    tick(f"pruning: {len(texts)} items")
    with torch.inference_mode():
        for b in batches:
            try:
                torch.testing.assert_close(pruned(**b).last_hidden_state, masked(**b).last_hidden_state,
                                           atol=tol, rtol=tol)
            except AssertionError as err:
                raise RuntimeError(f"pruned and masked models disagree: {err}") from None

        def run(model: torch.nn.Module) -> Callable[[], object]:
            return lambda: [model(**b) for b in batches]

        t = time_interleaved({"plain": run(plain), "full": run(loaded.model), "masked": run(masked),
                              "pruned": run(pruned)}, rounds=plan.capture_rounds, min_block_s=1e-6, warmup=0,
                             device=plan.device)
    n_heads = sum(site.n_heads for site in sites)
    removed = sum(len(h) for h in half.values())
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in (("full", loaded.model), ("pruned", pruned))}
    case = f"{len(texts)} items · {tokens} tokens · {removed} of {n_heads} heads pruned"
    area = Area("pruning", "Pruning: half the heads removed", (
        f"Every other head of every layer removed ({removed} of {n_heads}); {plan.dtype} on {plan.device}; the bundled "
        f"corpus sorted by length in batches of {size}; {plan.capture_rounds} interleaved rounds, median. Pruned "
        f"outputs equal masked outputs (checked in the run). Parameters: {params['full']:,} full, "
        f"{params['pruned']:,} pruned."))
    area.rows = [
        Comparison(case, "headlab, half the heads pruned", "headlab, all heads", t["pruned"], t["full"], tokens=tokens),
        Comparison(case, "headlab, half the heads masked", "headlab, all heads", t["masked"], t["full"], tokens=tokens),
        Comparison(case, "headlab, half the heads pruned", "plain transformers (sdpa)", t["pruned"], t["plain"],
                   tokens=tokens),
        Comparison(case, "headlab, all heads", "plain transformers (sdpa)", t["full"], t["plain"], tokens=tokens),
    ]
    return area
