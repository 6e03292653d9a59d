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
  kernel's log-sum-exp (``headlab.capture.blocks``) and every row reduction comes from one sweep of small row blocks
  (``headlab.analysis.sweep``);
- bound: the forward as the taps run it (the fused kernel with its log-sum-exp), and in every layer the patterns
  formed as the sweep forms them, in its row blocks (``recompute``), each block dropped at once: no statistics, the
  floor of the statistics' extra work;
- eager, the peer: transformers' eager attention with ``output_attentions=True``, run only where its size
  (``eager_bytes``, plus the plain forward's measured peak) is within ``EAGER_SHARE`` of the memory available;
  elsewhere reported "out of memory", predicted before anything is tried.

Goals: the statistics' time ≤ ``STATS_TIME_GOAL`` × the plain forward's at every length but the shortest (16k and
32k in the full run); their peak memory above the plain forward's ≤ ``MEMORY_ABOVE_GOAL`` at the longest length,
and growing linearly with the length: the bytes it adds per position from one length to the next at most
``LINEAR_SLACK`` × those it added from the length before (``_growth_rows``; whole patterns' would add in proportion
to the lengths).
"""

from __future__ import annotations

import gc
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
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
           "SLOPE_LABEL", "STATS_LABEL", "STATS_MEMORY", "STATS_TIME_GOAL", "VOCAB", "bench_long_context",
           "eager_bytes", "recompute", "save_long_context_model", "text_of_length"]

STATS_TIME_GOAL = 2.0  # statistics of every head / the plain sdpa forward, at every length but the shortest
MEMORY_ABOVE_GOAL = 2**30  # bytes of peak memory above the plain forward's, at the longest length
LINEAR_SLACK = 1.25  # bytes that memory adds per position from one length to the next / from the one before
EAGER_SHARE = 0.8  # the eager peer runs where its predicted bytes are within this share of the memory available
POSITIONS = 32768  # the rotary table's length, at least
VOCAB = 4096  # MiniLM's word pieces below this id make the text
LONG_CONFIG = {**CAUSAL_CONFIG, "vocab_size": VOCAB}  # 4 layers × 8 heads (2 kv heads), d_model 256
BOUND = "headlab_bench_bound"  # the bound's attention implementation, registered in transformers' interface

# the contenders, as the rows name them
PLAIN_LABEL, STATS_LABEL, BOUND_LABEL, EAGER_LABEL = (
    "plain transformers forward (sdpa)",
    "headlab statistics of every head (surface, sink share, value-weighted)",
    "bound: forward + every layer's patterns formed in the sweep's row blocks, no statistics",
    "transformers eager, output_attentions=True")
STATS_MEMORY, PLAIN_MEMORY, BOUND_MEMORY, EAGER_MEMORY = (
    "peak memory of the headlab statistics of every head", f"peak memory of the {PLAIN_LABEL}",
    "peak memory of the bound", f"peak memory of {EAGER_LABEL}")
ABOVE_LABEL = "peak memory of the statistics above the plain forward's"
SLOPE_LABEL = f"{ABOVE_LABEL}, added per position"  # the growth rows'


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


def eager_bytes(*, layers: int, heads: int, positions: int, itemsize: int) -> int:
    """Bytes eager attention with ``output_attentions=True`` holds beyond the plain forward, batch 1: every layer's
    patterns (``layers × heads × positions² × itemsize``), returned at the end; while a layer computes, its scores
    twice more in float32 (the product and its scaled, masked copy before the softmax); the causal mask."""
    square = positions * positions
    return layers * heads * square * itemsize + 2 * heads * square * 4 + square * itemsize


def recompute(query: Tensor, key: Tensor, *, scaling: float, lse: Tensor | None) -> None:
    """Every head's patterns formed as the statistics' sweep forms them, in its row blocks (``headlab.analysis
    .sweep.sweep_blocks``: causal, each block's rows against the keys up to its end) from q, k and ``lse``
    (``PatternRows.log_rows`` and its exp), each block dropped at once: what forming the patterns costs, without
    the statistics.

    Args:
        query: ``(batch, head, query_pos, d_head)``.
        key: ``(batch, kv_head, key_pos, d_head)``; query head h reads key/value head h // (head / kv_head).
        scaling: the model's score scale.
        lse: ``(batch, head, query_pos)``, each row's log-sum-exp from the fused kernel; None: each block's own.
    """
    from headlab.analysis.sweep import sweep_blocks
    from headlab.layer.pattern_rows import PatternRows

    rows = PatternRows(query, key, scale=scaling, causal=True, lse=lse)
    for start, stop in sweep_blocks(rows):
        rows.log_rows(start, stop).exp_()


def bound_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                    *args: Any, **kwargs: Any) -> tuple[Tensor, Any]:
    """The attention as a capture's taps run it (the fused kernel with each row's log-sum-exp, where there is one;
    else transformers' sdpa), then ``recompute`` (an ``AttentionInterface`` function)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from headlab.layer.functional import fused_attention_with_lse

    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    fused = None
    if attention_mask is None:  # causal, as the kernel applies it
        fused = fused_attention_with_lse(query, key, value, bias=None, is_causal=True, scale=scaling)
    if fused is None:
        out = sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
        recompute(query, key, scaling=scaling, lse=None)
        return out
    z, lse = fused
    recompute(query, key, scaling=scaling, lse=lse)
    return z.transpose(1, 2).contiguous(), None


def _register_bound() -> None:
    """Register ``bound_attention`` under ``BOUND`` (sdpa's masks: none where causal suffices)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(BOUND, bound_attention)
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
    from headlab.analysis.sweep import SWEEP_BYTES, SWEEP_ROWS
    from headlab.capture.blocks import available_memory
    from headlab.capture.run import capture

    lengths, budget, rounds = plan.long_context_lengths, plan.long_context_pattern_memory, plan.long_context_rounds
    model, tokenizer, config = loaded.model, loaded.tokenizer, loaded.model.config
    layers, heads, itemsize = config.num_hidden_layers, config.num_attention_heads, plan.torch_dtype.itemsize
    _register_bound()

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
        blocks = layers * heads * length * length * itemsize > budget
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
        patterns = (f"kept as PatternRows, read in row blocks of at most {format_bytes(SWEEP_BYTES)} (at least "
                    f"{SWEEP_ROWS} rows)") if blocks else "whole"
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
    """How the statistics' memory above the plain forward grows, and at the longest length against
    ``MEMORY_ABOVE_GOAL``.

    Its growth is told by the bytes it adds per position between consecutive lengths (``SLOPE_LABEL``): memory
    linear in the length adds the same per position at every length; whole patterns' would add in proportion to
    the lengths (between three lengths a < b < c, (b + c) / (a + b) × as much from b to c as from a to b). So for
    each two consecutive spans, goal: the later adds at most ``LINEAR_SLACK`` × what the earlier added. (The ratio
    of the memory itself between two lengths would mislead: some of what the statistics hold at a short length lies
    under the plain forward's own peak, so it reads as less than its share.)"""
    lengths = sorted(above)
    slopes = {(a, b): Timing(samples=tuple(max(y - x, PAGE) / (b - a) for x, y in
                                           zip(above[a].samples, above[b].samples))) for a, b in pairwise(lengths)}
    rows = []
    for (a, b), (_, c) in pairwise(slopes):
        rows.append(Comparison(f"batch 1 · pos {a} → {b} → {c}", f"{SLOPE_LABEL}, pos {b} → {c}",
                               f"{SLOPE_LABEL}, pos {a} → {b}", slopes[b, c], slopes[a, b], goal=LINEAR_SLACK,
                               unit="bytes", details={"linear growth": 1.0, "quadratic growth": (b + c) / (a + b)}))
    if lengths:
        rows.append(Comparison(f"batch 1 · pos {lengths[-1]}", ABOVE_LABEL,
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
        "take more, the taps keep q, k and the kernel's log-sum-exp, and every row reduction comes from one sweep "
        "of row blocks formed from them; at the shortest length their results are first checked equal to whole "
        "patterns' (1e-6). The bound is the forward as the taps run it (the fused kernel with its log-sum-exp) plus, "
        "in every layer, the patterns formed in the sweep's row blocks (q·kᵀ against the keys up to each block's "
        "end, minus the log-sum-exp, exp) and dropped. "
        f"The peer, transformers' eager attention with output_attentions=True, runs where its patterns, scores and "
        f"mask plus the plain forward's peak fit in {EAGER_SHARE:.0%} of the memory available, predicted before it "
        f"is tried. Each call is timed and its peak memory measured at once, {plan.long_context_rounds} interleaved "
        f"round{'s' if plan.long_context_rounds != 1 else ''}, median; before them the statistics (the check) and "
        "the bound ran at the shortest length, and the plain forward once at each length where eager's patterns "
        "could fit (its peak, for eager's prediction). Memory goals: the "
        f"statistics' peak above the plain forward's ≤ {format_bytes(MEMORY_ABOVE_GOAL)} at the longest length, and "
        f"linear growth: the bytes it adds per position from one length to the next ≤ {LINEAR_SLACK} × those it "
        "added from the length before (whole patterns' would add in proportion to the lengths).")
