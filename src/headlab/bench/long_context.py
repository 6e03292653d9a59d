"""Long context: every head's statistics of one long text, in memory linear in its length.

Axis legend: input_ids ``(batch, pos)``; q ``(batch, head, query_pos, d_head)``, k ``(batch, kv_head, key_pos,
d_head)``; patterns ``(batch, head, query_pos, key_pos)``, formed in row blocks ``[start, stop)`` of query_pos.

The model needs no download: a random ``LlamaModel`` of ``LONG_CONFIG`` (4 layers × 8 query heads sharing 2
key/value heads, d_model 256, rotary positions up to ``POSITIONS`` at least, a vocabulary of ``VOCAB``), saved
with the packaged MiniLM's tokenizer beside it (its ``model_max_length`` raised to the model's positions, so that
a long text is no warning) and loaded with ``headlab.load``. The text of each length is MiniLM's word pieces of ids
below ``VOCAB`` (``text_of_length``): exactly that many pieces, special tokens included.

At each of ``plan.long_context_lengths``, batch 1, the contenders (one call each per round, in interleaved rounds
that rotate their order, each call timed and its peak memory measured at once: ``headlab.bench.memory``):

- plain: the model's forward under transformers' sdpa, nothing inspected;
- statistics: one ``capture`` pass over the one-item corpus with ``take=("pattern", "v")`` and three accumulators
  (``SurfaceStats``, ``SinkShare``, ``ValueWeighted``) of every head, ``max_pattern_memory`` =
  ``plan.long_context_pattern_memory``: where a batch's whole patterns would take more, the taps keep q, k and the
  kernel's log-sum-exp and the accumulators read row blocks (``headlab.capture.blocks``);
- bound: the plain forward, and in every layer one recomputation of ``exp(q·kᵀ × scaling)`` in the same row blocks
  (``block_rows``), each block dropped at once: no statistics, the floor of the statistics' extra work;
- eager, the peer: transformers' eager attention with ``output_attentions=True``, run only where its size
  (``eager_bytes``, plus the plain forward's measured peak) is within ``EAGER_SHARE`` of the memory available;
  elsewhere reported "out of memory", predicted before anything is tried.

Goals: the statistics' time ≤ ``STATS_TIME_GOAL`` × the plain forward's at every length but the shortest (16k and
32k in the full run); their peak memory above the plain forward's ≤ ``MEMORY_ABOVE_GOAL`` at the longest length,
and growing linearly with the length (between two lengths, at most ``LINEAR_SLACK`` × the lengths' ratio; whole
patterns would grow with its square).
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from headlab.bench.memory import PAGE, peak_memory, peak_memory_available
from headlab.bench.models import CAUSAL_CONFIG, running
from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.results import format_bytes
from headlab.bench.timing import Timing, synchronize

__all__ = ["ABOVE_LABEL", "BOUND", "BOUND_LABEL", "BOUND_MEMORY", "EAGER_LABEL", "EAGER_MEMORY", "EAGER_SHARE",
           "LINEAR_SLACK", "LONG_CONFIG", "MEMORY_ABOVE_GOAL", "PLAIN_LABEL", "PLAIN_MEMORY", "POSITIONS",
           "STATS_LABEL", "STATS_MEMORY", "STATS_TIME_GOAL", "VOCAB", "bench_long_context", "block_rows", "eager_bytes",
           "save_long_context_model", "text_of_length"]

STATS_TIME_GOAL = 2.0  # statistics of every head / the plain sdpa forward, at every length but the shortest
MEMORY_ABOVE_GOAL = 2**30  # bytes of peak memory above the plain forward's, at the longest length
LINEAR_SLACK = 1.25  # growth of that memory between two lengths / the lengths' ratio (whole patterns: its square)
EAGER_SHARE = 0.8  # the eager peer runs where its predicted bytes are within this share of the memory available
POSITIONS = 32768  # the rotary table's length, at least
VOCAB = 4096  # MiniLM's word pieces below this id make the text
LONG_CONFIG = {**CAUSAL_CONFIG, "vocab_size": VOCAB}  # 4 layers × 8 heads (2 kv heads), d_model 256
BOUND = "headlab_bench_bound"  # the bound's attention implementation, registered in transformers' interface

# the contenders, as the rows name them
PLAIN_LABEL, STATS_LABEL, BOUND_LABEL, EAGER_LABEL = (
    "plain transformers forward (sdpa)",
    "headlab statistics of every head (surface, sink share, value-weighted)",
    "bound: sdpa forward + exp(q·kᵀ) per layer in the same row blocks, no statistics",
    "transformers eager, output_attentions=True")
STATS_MEMORY, PLAIN_MEMORY, BOUND_MEMORY, EAGER_MEMORY = (
    "peak memory of the headlab statistics of every head", f"peak memory of the {PLAIN_LABEL}",
    "peak memory of the bound", f"peak memory of {EAGER_LABEL}")
ABOVE_LABEL = "peak memory of the statistics above the plain forward's"  # the growth rows'


def save_long_context_model(folder: str | Path, *, positions: int = POSITIONS, seed: int = 0) -> Path:
    """A random ``LlamaModel`` of ``LONG_CONFIG`` with ``positions`` rotary positions, saved into ``folder`` with
    the packaged MiniLM's tokenizer beside it (``model_max_length`` = ``positions``).

    Returns:
        The folder, for ``headlab.load``.

    Raises:
        ModuleNotFoundError: the packaged MiniLM is not installed (``headlab[models]``).
    """
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    from headlab.models import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    tokenizer.model_max_length = positions
    config = LlamaConfig(**LONG_CONFIG, max_position_embeddings=positions, use_cache=False)
    with torch.random.fork_rng():  # seeded weights, the caller's generator left as it was
        torch.manual_seed(seed)
        model = LlamaModel(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return Path(folder)


def text_of_length(tokenizer: Any, length: int, *, vocab: int = VOCAB) -> str:
    """A text that ``tokenizer`` makes exactly ``length`` pieces of, special tokens included, every id below
    ``vocab``: the tokenizer's whole-word pieces of ids below ``vocab``, in turn, separated by spaces.

    Raises:
        ValueError: ``length`` leaves no room besides the special tokens, or no piece fits ``vocab``.
    """
    specials = tokenizer.num_special_tokens_to_add()
    if length <= specials:
        raise ValueError(f"length={length!r}; expected more than the {specials} special tokens")
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(vocab, len(tokenizer)))))
    words = [piece for piece in pieces if piece.isascii() and piece.isalpha()]
    single = [w for w, ids in zip(words, tokenizer(words, add_special_tokens=False)["input_ids"]) if len(ids) == 1]
    if not single:
        raise ValueError(f"no piece of the tokenizer below id {vocab} is a word of its own")
    return " ".join(single[i % len(single)] for i in range(length - specials))


def block_rows(budget: int, *, layers: int, heads: int, keys: int, itemsize: int) -> int:
    """Query rows per block when a row of every layer's ``heads`` against ``keys`` keys costs ``layers × heads ×
    keys × itemsize`` bytes and a block may hold ``budget`` and ``BLOCK_BYTES`` (capture's rule,
    ``headlab.capture.blocks``): one at least."""
    from headlab.capture.blocks import BLOCK_BYTES

    return max(1, min(budget, BLOCK_BYTES) // max(layers * heads * keys * itemsize, 1))


def eager_bytes(*, layers: int, heads: int, positions: int, itemsize: int) -> int:
    """Bytes eager attention with ``output_attentions=True`` holds beyond the plain forward, batch 1: every layer's
    patterns (``layers × heads × positions² × itemsize``), returned at the end; while a layer computes, its scores
    twice more in float32 (the product and its scaled, masked copy before the softmax); the causal mask."""
    square = positions * positions
    return layers * heads * square * itemsize + 2 * heads * square * 4 + square * itemsize


def recompute(query: Tensor, key: Tensor, *, scaling: float, rows: int) -> None:
    """``exp(q·kᵀ × scaling)`` of every head in row blocks of ``rows`` queries against the keys up to the block's
    end (causal), each block dropped at once: what forming the patterns costs, without the statistics.

    Args:
        query: ``(batch, head, query_pos, d_head)``.
        key: ``(batch, kv_head, key_pos, d_head)``; query head h reads key/value head h // (head / kv_head).
        scaling: the model's score scale.
        rows: queries per block.
    """
    batch, n_heads, n_queries, d_head = query.shape
    n_kv = key.shape[1]
    grouped = query.reshape(batch, n_kv, n_heads // n_kv, n_queries, d_head)
    for start in range(0, n_queries, rows):
        stop = min(n_queries, start + rows)
        # the group's rows stacked: one matrix product per key/value head (a key broadcast over the group's heads
        # instead runs about 10× slower on CPU)
        stacked = (grouped[:, :, :, start:stop] * scaling).reshape(batch, n_kv, -1, d_head)
        block = torch.matmul(stacked, key[:, :, :stop].transpose(-1, -2))
        block.exp_()  # (batch, kv_head, group × rows, stop)
        del block


def bound_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                    *args: Any, budget: int, layers: int, **kwargs: Any) -> tuple[Tensor, Any]:
    """transformers' sdpa attention, then ``recompute`` in capture's row blocks (an ``AttentionInterface``
    function; ``budget`` and ``layers`` bound by ``partial``)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out = sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    rows = block_rows(budget, layers=layers, heads=query.shape[1], keys=key.shape[2], itemsize=query.element_size())
    recompute(query, key, scaling=scaling, rows=rows)
    return out


def _register_bound(budget: int, layers: int) -> None:
    """Register ``bound_attention`` with this budget under ``BOUND`` (sdpa's masks: none where causal suffices)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(BOUND, partial(bound_attention, budget=budget, layers=layers))
    AttentionMaskInterface.register(BOUND, sdpa_mask)


def _measure(fns: Mapping[str, Callable[[], object]], *, rounds: int,
             device: str) -> tuple[dict[str, Timing], dict[str, Timing]]:
    """Each function's time and peak memory from the same calls: ``rounds`` interleaved rounds (each starts one
    function later), every call timed inside ``peak_memory``; no memory where it cannot be measured."""
    names = list(fns)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    peaks: dict[str, list[float]] = {name: [] for name in names}
    measured = peak_memory_available(device) is None
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]

            def timed(fn: Callable[[], object] = fns[name], name: str = name) -> None:
                synchronize(device)
                start = time.perf_counter()
                fn()
                synchronize(device)
                seconds[name].append(time.perf_counter() - start)

            if measured:
                peaks[name].append(float(peak_memory(timed, device=device)))
            else:
                gc.collect()
                timed()
    times = {name: Timing(samples=tuple(seconds[name])) for name in names}
    return times, ({name: Timing(samples=tuple(peaks[name])) for name in names} if measured else {})


def _above(memory: Mapping[str, Timing]) -> Timing:
    """The statistics' peak above the plain forward's, round by round (at least ``PAGE``)."""
    stats, plain = memory[STATS_LABEL].samples, memory[PLAIN_LABEL].samples
    return Timing(samples=tuple(max(s - p, PAGE) for s, p in zip(stats, plain)))


def _length_rows(length: int, times: Mapping[str, Timing], memory: Mapping[str, Timing], *, goal: float | None,
                 details: dict[str, Any], eager_need: int) -> list[Comparison]:
    """One length's rows: times against the plain forward, the bound and eager (where it ran), then peak memory."""
    case, stats, plain, bound, eager = f"batch 1 · pos {length}", STATS_LABEL, PLAIN_LABEL, BOUND_LABEL, EAGER_LABEL
    rows = [Comparison(case, stats, plain, times[stats], times[plain], goal=goal, tokens=length, details=details),
            Comparison(case, bound, plain, times[bound], times[plain], tokens=length),
            Comparison(case, stats, bound, times[stats], times[bound], tokens=length)]
    if eager in times:
        rows.append(Comparison(case, stats, eager, times[stats], times[eager], tokens=length))
    if memory:
        above = format_bytes(_above(memory).median)
        rows += [Comparison(case, STATS_MEMORY, PLAIN_MEMORY, memory[stats], memory[plain], unit="bytes",
                            details={"above the plain forward": above}),
                 Comparison(case, BOUND_MEMORY, PLAIN_MEMORY, memory[bound], memory[plain], unit="bytes")]
        if eager in memory:
            rows.append(Comparison(case, STATS_MEMORY, EAGER_MEMORY, memory[stats], memory[eager], unit="bytes",
                                   details={"eager predicted": format_bytes(eager_need)}))
    return rows


def _same_statistics(whole: Sequence[Any], blocks: Sequence[Any]) -> None:
    """Raise RuntimeError unless the accumulators' results from row blocks are those of whole patterns (1e-6)."""
    for a, b in zip(whole, blocks):
        table_a, table_b = getattr(a, "table", a), getattr(b, "table", b)
        for name, column in table_a.columns.items():
            if not np.allclose(table_b.columns[name], column, rtol=1e-6, atol=1e-12, equal_nan=True):
                raise RuntimeError(f"long context: {type(a).__name__} column {name!r} differs between whole patterns "
                                   f"and row blocks ({column[:3]} vs {table_b.columns[name][:3]}), so the statistics "
                                   "timed are not the whole-pattern path's")


def bench_long_context(plan: Plan, *, tick: Callable[[str], None] = lambda _: None,
                       available: int | None = None) -> Area:
    """Statistics of every head of a tiny LLaMA-shaped model at long lengths, against its plain forward, a bound
    and transformers' eager ``output_attentions=True``.

    Args:
        plan: device, dtype, ``long_context_lengths``, ``long_context_pattern_memory`` and ``long_context_rounds``.
        tick: progress.
        available: bytes the eager peer may use; None for what the device has free at each length
            (``headlab.capture.blocks.available_memory``). Its prediction is made before it is tried.

    Returns:
        The "long-context" area ("Not run." with a note where the packaged MiniLM, whose tokenizer it uses, is
        missing).

    Raises:
        RuntimeError: the statistics from row blocks differ from those of whole patterns (checked at the shortest
            length).
    """
    import headlab

    title = "Long context: every head's statistics of one long text, memory linear in its length"
    with tempfile.TemporaryDirectory(prefix="headlab-long-") as work:
        try:
            folder = save_long_context_model(Path(work) / "model", positions=max(POSITIONS, *plan.long_context_lengths))
        except ModuleNotFoundError as err:
            return Area("long-context", title, "Not run.", notes=[f"skipped: {err}"])
        area = Area("long-context", title, "")
        _run(area, plan, headlab.load(folder, dtype=plan.torch_dtype, device=plan.device), tick, available)
        gc.collect()  # an attached model and its handle refer to each other: freed by a collection
    return area


def _run(area: Area, plan: Plan, loaded: Any, tick: Callable[[str], None], available: int | None) -> None:
    """``bench_long_context``'s measurements on the loaded model, into ``area``."""
    from headlab.analysis.norms import ValueWeighted
    from headlab.analysis.sinks import SinkShare
    from headlab.analysis.surface import SurfaceStats
    from headlab.capture.blocks import available_memory
    from headlab.capture.run import capture

    lengths, budget, rounds = plan.long_context_lengths, plan.long_context_pattern_memory, plan.long_context_rounds
    model, tokenizer, config = loaded.model, loaded.tokenizer, loaded.model.config
    layers, heads, itemsize = config.num_hidden_layers, config.num_attention_heads, plan.torch_dtype.itemsize
    _register_bound(budget, layers)

    def statistics(text: str, length: int, pattern_memory: int) -> Callable[[], list[Any]]:
        def once() -> list[Any]:
            consumers: list[Any] = [SurfaceStats(causal=True), SinkShare.from_model(loaded),
                                    ValueWeighted.from_model(loaded)]
            capture(loaded, corpus=[text], take=("pattern", "v"), consumers=consumers, batch_tokens=None,
                    max_batch_size=1, max_length=length, progress=False, max_pattern_memory=pattern_memory)
            return [c.result() for c in consumers]
        return once

    def forward(implementation: str, ids: Tensor, **kwargs: Any) -> Callable[[], None]:
        def once() -> None:
            with torch.inference_mode(), running(model, implementation):
                model(input_ids=ids, **kwargs)
        return once

    shapes = (f"random LlamaModel, {layers} layers × {heads} heads ({config.num_key_value_heads} kv heads), d_model "
              f"{config.hidden_size}, {config.max_position_embeddings:,} rotary positions, vocabulary {VOCAB}")
    above: dict[int, Timing] = {}
    for n, length in enumerate(lengths):
        tick(f"long context: {length:,} positions")
        text = text_of_length(tokenizer, length)
        ids = tokenizer(text, return_tensors="pt")["input_ids"].to(plan.device)
        if ids.shape[1] != length or int(ids.max()) >= VOCAB:
            raise RuntimeError(f"long context: the text of {length} pieces tokenized to {ids.shape[1]} pieces, ids up "
                               f"to {int(ids.max())} (expected exactly {length}, below {VOCAB})")
        rows = block_rows(budget, layers=layers, heads=heads, keys=length, itemsize=itemsize)
        blocks = -(-length // rows) if layers * heads * length * length * itemsize > budget else 0
        if n == 0:  # first: the blocks' results against whole patterns', and every contender once (warm-up)
            whole = layers * heads * length * length * itemsize
            _same_statistics(statistics(text, length, whole)(), statistics(text, length, budget)())
            forward(BOUND, ids)()
        # eager's prediction: its patterns, scores and mask, and (where those fit) the plain forward's peak, measured
        # once more before the rounds
        free = available_memory(torch.device(plan.device)) if available is None else available
        need = eager_bytes(layers=layers, heads=heads, positions=length, itemsize=itemsize)
        forward_peak = peak_memory(forward("sdpa", ids), device=plan.device) if need <= EAGER_SHARE * free and \
            peak_memory_available(plan.device) is None else 0
        gc.collect()
        need += forward_peak
        fits = need <= EAGER_SHARE * free
        contenders = {PLAIN_LABEL: forward("sdpa", ids), STATS_LABEL: statistics(text, length, budget),
                      BOUND_LABEL: forward(BOUND, ids)}
        if fits:
            contenders[EAGER_LABEL] = forward("eager", ids, output_attentions=True)
        times, memory = _measure(contenders, rounds=rounds, device=plan.device)
        eager = (f"{'fits' if fits else 'out of memory'}: predicted {format_bytes(need)}, "
                 f"{format_bytes(free)} available{'' if fits else '; not run'}")
        if not fits:
            beside = f" and the plain forward's peak ({format_bytes(forward_peak)})" if forward_peak else ""
            area.notes.append(f"{EAGER_LABEL} at {length:,} positions: out of memory, predicted before it was tried: "
                              f"its patterns, scores and mask ({format_bytes(need - forward_peak)}){beside} exceed "
                              f"{EAGER_SHARE:.0%} of the {format_bytes(free)} available; not run.")
        patterns = f"{blocks} row blocks of {rows} queries" if blocks else "whole"
        area.rows += _length_rows(length, times, memory, goal=STATS_TIME_GOAL if n > 0 else None,
                                  details={"patterns": patterns, "eager peer": eager}, eager_need=need)
        if memory:
            above[length] = _above(memory)
        del ids, contenders
        gc.collect()
    area.rows += _growth_rows(above)
    area.description = _description(plan, shapes, budget)
    unmeasured = peak_memory_available(plan.device)
    if unmeasured is not None:
        area.notes.append(f"Peak memory not measured: {unmeasured}.")
    for row in area.rows:
        if row.met() is False:
            area.notes.append(f"{row.case}: {row.contender} vs {row.peer} took {row.ratio:.3f}× (goal ≤ "
                              f"{row.goal:.2f}).")


def _growth_rows(above: Mapping[int, Timing]) -> list[Comparison]:
    """The statistics' memory above the plain forward between consecutive lengths (goal: linear), and at the
    longest length against ``MEMORY_ABOVE_GOAL``."""
    what = ABOVE_LABEL
    lengths = sorted(above)
    rows = []
    for short, long in pairwise(lengths):
        factor = long / short
        rows.append(Comparison(f"batch 1 · pos {short} → {long}", f"{what}, pos {long}", f"{what}, pos {short}",
                               above[long], above[short], goal=LINEAR_SLACK * factor, unit="bytes",
                               details={"linear growth": factor, "quadratic growth": factor * factor}))
    if lengths:
        rows.append(Comparison(f"batch 1 · pos {lengths[-1]}", what,
                               f"the issue's bound, {format_bytes(MEMORY_ABOVE_GOAL)}", above[lengths[-1]],
                               Timing(samples=(float(MEMORY_ABOVE_GOAL),)), goal=1.0, unit="bytes"))
    return rows


def _description(plan: Plan, shapes: str, budget: int) -> str:
    lengths = ", ".join(f"{n:,}" for n in plan.long_context_lengths)
    return (
        f"A {shapes}: random weights (seeded), saved on the fly with the packaged MiniLM's tokenizer and loaded with "
        f"headlab.load (not timed); {plan.dtype} on {plan.device}. At {lengths} positions, batch 1, one text of "
        f"exactly that many pieces (MiniLM's word pieces of ids below {VOCAB}). The statistics are one capture pass "
        "over the one-item corpus, take=('pattern', 'v'), with SurfaceStats(causal=True), SinkShare and "
        f"ValueWeighted of every head, max_pattern_memory {format_bytes(budget)}: where a batch's whole patterns "
        "take more, the accumulators read row blocks formed from q, k and the kernel's log-sum-exp; at the shortest "
        "length their results are first checked equal to whole patterns' (1e-6). The bound is the sdpa forward plus, "
        "in every layer, exp(q·kᵀ) recomputed in the same row blocks (the keys up to each block's end) and dropped. "
        f"The peer, transformers' eager attention with output_attentions=True, runs where its patterns, scores and "
        f"mask plus the plain forward's peak fit in {EAGER_SHARE:.0%} of the memory available, predicted before it "
        f"is tried. Each call is timed and its peak memory measured at once, {plan.long_context_rounds} interleaved "
        f"round{'s' if plan.long_context_rounds != 1 else ''}, median; before them the statistics (the check) and "
        "the bound ran at the shortest length, and the plain forward once at each length where eager's patterns "
        "could fit (its peak, for eager's prediction). Memory goals: the "
        f"statistics' peak above the plain forward's ≤ {format_bytes(MEMORY_ABOVE_GOAL)} at the longest length, and "
        f"its growth between two lengths ≤ {LINEAR_SLACK} × their ratio (linear; whole patterns grow with its "
        "square).")
