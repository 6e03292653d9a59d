"""``capture``: run a model over a corpus in batches and hand the selected heads to consumers.

Each batch's tensors live only while the consumers' ``update`` calls run: memory grows with
the batch, never with the corpus. Consumers that need corpus order use
``CaptureBatch.corpus_indices``.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, cast, runtime_checkable

import torch
from torch import nn

from headlab import display
from headlab.capture.batch import CaptureBatch, LayerCapture, collate
from headlab.capture.batching import padding_stats, plan_batches
from headlab.capture.blocks import (
    check_block_readers,
    over_budget,
    pattern_budget,
    whole_pattern_bytes,
)
from headlab.capture.corpus import Corpus, load_corpus
from headlab.capture.encoding import TokenizedCorpus, backend_tokenizer, tokenize_corpus
from headlab.capture.taps import renamed_take, tapped
from headlab.layer.pattern_rows import counting_rows
from headlab.layer.selection import HeadSelection
from headlab.layer.taps import Tap
from headlab.models import HeadedModel, TapOutput, model_max_length
from headlab.models.handle import TruncationWarning, given_tokenizer, headed, truncation_message
from headlab.models.interface import reuse_pattern_memory
from headlab.models.seq2seq import SOURCE, site_sides, start_token, takes_decoder_ids

__all__ = ["CaptureResult", "Consumer", "TruncationWarning", "blocks_needed", "capture", "check_pairs", "feed",
           "model_max_length"]


@runtime_checkable
class Consumer(Protocol):
    """Anything with ``update(batch)``: what capture hands each batch to. Accumulators (``headlab.analysis.accumulator
    .Accumulator``) add ``merge`` and ``result``, so that a corpus can be split and their results joined. A consumer
    may add ``prepare(batch)``, called with each batch before any consumer's update: there it says what it will read
    of what consumers share (``headlab.analysis.reductions.BatchReductions.announce``), so that it is computed in one
    pass with the rest."""

    def update(self, batch: CaptureBatch) -> None: ...


@dataclass(repr=False)
class CaptureResult(display.Shown):
    """What a capture did (its data went to the consumers).

    Attributes:
        items: items in the corpus.
        tokens: real tokens run, special tokens included, after truncation (pairs: source and target).
        padded_tokens: tokens computed on, padding included (``Σ batch × pos``; pairs: both sides).
        batches: forward passes.
        truncated: corpus indices of the items cut to ``max_length`` (pairs: on either side).
        max_length: the truncation length in pieces, or None.
        layers: ``{layer: heads}`` captured.
        take: what was captured of each head.
        seconds: wall time, tokenization included.
        pattern_memory: the most bytes of whole patterns a batch could hold (``max_pattern_memory``, or the
            automatic choice from free memory); None where no pattern was taken.
        blocked: batches whose patterns were over it, kept as ``PatternRows`` and read in row blocks
            (``headlab.capture.blocks``).
    """

    items: int
    tokens: int
    padded_tokens: int
    batches: int
    truncated: list[int]
    max_length: int | None
    layers: dict[int, list[int]]
    take: tuple[str, ...]
    seconds: float
    corpus: dict[str, Any] = field(default_factory=dict)
    pattern_memory: int | None = None
    blocked: int = 0

    @property
    def what(self) -> tuple[str, ...]:
        """Deprecated: ``take``."""
        warnings.warn("CaptureResult.what is deprecated: it is CaptureResult.take", DeprecationWarning, stacklevel=2)
        return self.take

    @property
    def n_truncated(self) -> int:
        return len(self.truncated)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "items": self.items, "tokens": self.tokens, "padded_tokens": self.padded_tokens,
            "batches": self.batches, "truncated_items": self.n_truncated, "truncated": list(self.truncated),
            "max_length": self.max_length, "layers": {str(k): v for k, v in self.layers.items()},
            "take": list(self.take), "seconds": self.seconds, "tokens_per_second": self.tokens_per_second,
            "corpus": dict(self.corpus), "pattern_memory": self.pattern_memory, "blocked": self.blocked,
        }

    def _title(self) -> str:
        return f"CaptureResult: {self.items:,} items, {self.tokens:,} tokens in {self.batches:,} batches"

    def _facts(self) -> list[tuple[str, object]]:
        heads = sum(len(hs) for hs in self.layers.values())
        padding = f" ({self.padded_tokens / self.tokens:.2f}× the real ones)" if self.tokens else ""
        limit = f" to {self.max_length} pieces" if self.max_length else ""
        rate = f", {self.tokens / self.seconds:,.0f} tokens/s" if self.seconds > 0 else ""
        return [("taken", f"{', '.join(self.take)} of {heads} heads in layers {display.runs(self.layers) or 'none'}"),
                ("computed", f"{self.padded_tokens:,} tokens with padding{padding}"),
                ("truncated", f"{self.n_truncated} items{limit}"), *self._patterns(),
                ("time", f"{self.seconds:.2f} s{rate}")]

    def _patterns(self) -> list[tuple[str, object]]:
        """How the patterns were held: whole, or (over the budget) read in row blocks."""
        if self.pattern_memory is None:
            return []
        budget = display.format_bytes(self.pattern_memory)
        if not self.blocked:
            return [("patterns", f"whole (every batch within {budget})")]
        return [("patterns", f"{self.blocked:,} of {self.batches:,} batches over {budget} whole, read in row blocks")]


def capture(
    model: HeadedModel | nn.Module,
    tokenizer: Any = None,
    corpus: str | os.PathLike[str] | Sequence[str] | Sequence[tuple[str, str]] | Corpus | None = None,
    *,
    heads: HeadSelection = None,
    take: str | Sequence[str] = ("pattern",),
    consumers: Iterable[Consumer] = (),
    batch_tokens: int | None = 4096,
    max_batch_size: int | None = 64,
    max_length: int | None = None,
    progress: bool = True,
    max_pattern_memory: int | None = None,
    what: str | Sequence[str] | None = None,
) -> CaptureResult:
    """Run ``model`` over ``corpus`` and give every consumer each batch's selected heads.

    The corpus is tokenized once, grouped into length-bucketed batches (``plan_batches``),
    and run under ``torch.inference_mode`` with the model in eval mode (its mode is restored
    afterwards). Taps on the selected layers take only the selected heads; they are removed
    when the capture ends, on error too.

    Args:
        model: a ``HeadedModel`` with a fast tokenizer (offsets and word ids come from it), or an
            attached model whose handle has one; batches go to its device.
        tokenizer: deprecated: the handle holds the tokenizer (``headlab.attach(model, tokenizer=...)``).
        corpus: see ``load_corpus``: None for the bundled corpus, a path, or a list of strings; for an
            encoder-decoder also (source, target) pairs (a list of tuples, or ``load_corpus(path, pairs=True)``):
            the encoder reads each source, the decoder its target shifted behind the start token, and each batch
            carries both sides (``CaptureBatch.target``, ``LayerCapture.sides``).
        heads: the heads to take (``headlab.heads.selection``); None for every head.
        take: any of ``headlab.layer.taps.TAKE``: "pattern", "z", "result", "q", "k", "v".
        consumers: objects with ``update(batch: CaptureBatch)``, called in order per batch (a list, or a
            structure that iterates over its accumulators: ``PassAccumulators``).
        batch_tokens: most padded tokens (``batch × pos``) per batch, or None.
        max_batch_size: most items per batch, or None.
        max_length: most pieces per item (longer items are cut, with a ``TruncationWarning``
            and listed in the result; pairs: each side); None for the model's limit (``model_max_length``).
        progress: show a progress bar over batches with tokens per second.
        max_pattern_memory: the most bytes of whole patterns a batch may hold; a batch whose whole patterns would
            take more has them kept as ``PatternRows``, read in row blocks (``headlab.capture.blocks``; every
            consumer must read blocks). None: a share of the device's free memory (``PATTERN_MEMORY_SHARE``).
        what: deprecated name of ``take``.

    Returns:
        Counts, truncated items and throughput.

    Raises:
        ValueError / TypeError: a bad corpus, selection, ``take``, batch bound or tokenizer, a model
            without headlab attention, or pairs for a model that is not an encoder-decoder.
        RuntimeError: the model is already being captured.
    """
    start = time.perf_counter()
    take = renamed_take(take, what, "what", "capture")
    handle = given_tokenizer(model, tokenizer, "capture")
    if handle.tokenizer is None:
        raise TypeError(f"capture needs the model's tokenizer, and this {handle.architecture} has none: "
                        "headlab.attach(model, tokenizer=...) gives it one")
    corpus = load_corpus(corpus)
    if corpus.targets is not None:
        check_pairs(handle)
    consumers = checked_consumers(consumers)
    selection = handle.heads(heads, inputs={"input_ids": None})  # text alone
    max_length = handle.max_length if max_length is None else max_length
    tokenized = tokenize_corpus(handle.tokenizer, corpus.texts, max_length=max_length)
    targets = None if corpus.targets is None else tokenize_corpus(handle.tokenizer, corpus.targets,
                                                                  max_length=max_length)
    truncated = tokenized.truncated if targets is None else sorted({*tokenized.truncated, *targets.truncated})
    warn_truncated(truncated, len(tokenized), max_length)
    lengths = tokenized.lengths if targets is None else [max(s, t) for s, t in zip(tokenized.lengths, targets.lengths)]
    batches = plan_batches(lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size)
    device = handle.device
    step, sides = _text_steps(handle, tokenized, device), None
    if targets is not None:  # each layer reads its own sides of the pairs
        step = _pair_steps(handle, tokenized, targets, device)
        sides = {layer: site_sides(handle.sites[layer]) for layer in selection}
    budget = pattern_budget(max_pattern_memory, device) if "pattern" in take else None
    why = None if budget is None else over_budget([[lengths[i] for i in b] for b in batches], selection,
                                                  handle.dtype.itemsize, budget)
    if why is not None and targets is not None:
        raise ValueError(f"{why}; row blocks are for texts, not (source, target) pairs: raise max_pattern_memory or "
                         "lower max_length or batch_tokens")
    if why is not None:
        check_block_readers(consumers, why=why)

    # a generator expression keeps no batch once it is handed over: each is freed when its turn ends
    blocked = feed(handle, selection, take, consumers, (step(indices) for indices in batches), total=len(batches),
                   progress=progress, start=start, sides=sides, pattern_memory=budget)
    both = [tokenized] if targets is None else [tokenized, targets]
    padded = sum(padding_stats(side.lengths, batches).padded_tokens for side in both)
    return CaptureResult(
        items=len(tokenized), tokens=sum(side.n_tokens for side in both),
        padded_tokens=padded, batches=len(batches),
        truncated=truncated, max_length=max_length, layers=selection, take=take,
        seconds=time.perf_counter() - start, corpus=corpus.to_dict(), pattern_memory=budget, blocked=blocked,
    )


def blocks_needed(model: HeadedModel | nn.Module, corpus: Any = None, *, heads: HeadSelection = None,
                  max_length: int | None = None, max_pattern_memory: int | None = None,
                  batch_tokens: int | None = 4096, max_batch_size: int | None = 64) -> str | None:
    """Why a capture of ``corpus`` with these options would hand its patterns in row blocks (its largest batch's
    whole patterns over the budget, in words), or None where every batch's fit: what ``capture`` works out before
    its first forward, for a caller that chooses its consumers by it (``headlab.analysis.analyze``).

    Arguments as ``capture`` takes them (texts only).
    """
    handle = headed(model)
    if handle.tokenizer is None:
        return None
    texts = load_corpus(corpus).texts
    selection = handle.heads(heads, inputs={"input_ids": None})
    max_length = handle.max_length if max_length is None else max_length
    lengths = tokenize_corpus(handle.tokenizer, texts, max_length=max_length).lengths
    batches = plan_batches(lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size)
    return over_budget([[lengths[i] for i in b] for b in batches], selection, handle.dtype.itemsize,
                       pattern_budget(max_pattern_memory, handle.device))


def check_pairs(handle: HeadedModel) -> None:
    """Refuse (source, target) pairs for a model that is not a text encoder-decoder, before any forward.

    Raises:
        ValueError: the model's forward takes no ``decoder_input_ids``, or reads no token ids (Whisper's features).
    """
    model = handle.model
    if not takes_decoder_ids(model) or getattr(model, "main_input_name", "") != "input_ids":
        raise ValueError(f"(source, target) pairs are for a text encoder-decoder (BART, Marian, T5), whose encoder "
                         f"reads the source and decoder the target; {handle.architecture} is not one: give texts")
    start_token(model)  # a config without a decoder start token is refused here, not at the first forward


Step = Callable[[list[int]], tuple[CaptureBatch, dict[str, Any], int]]  # corpus indices → what ``feed`` reads


def _text_steps(handle: HeadedModel, tokenized: TokenizedCorpus, device: torch.device) -> Step:
    """``step(indices)`` of a capture over texts: the batch, the forward's arguments, its real tokens."""

    def step(indices: list[int]) -> tuple[CaptureBatch, dict[str, Any], int]:
        batch = collate(tokenized, indices, device=device)
        return batch, handle.token_batch(batch.input_ids, batch.attention_mask), sum(tokenized.lengths[i]
                                                                                     for i in indices)

    return step


def _pair_steps(handle: HeadedModel, sources: TokenizedCorpus, targets: TokenizedCorpus,
                device: torch.device) -> Step:
    """``step(indices)`` of a capture over pairs: the batch with both sides, the forward's arguments (the decoder
    reading the batch's target side), its real tokens."""
    start = start_token(handle.model)
    label = backend_tokenizer(handle.tokenizer).id_to_token(start) or f"tok {start}"

    def step(indices: list[int]) -> tuple[CaptureBatch, dict[str, Any], int]:
        batch = collate(sources, indices, device=device, target=targets, start=(start, label))
        target = cast(CaptureBatch, batch.target)
        kwargs = handle.token_batch(batch.input_ids, batch.attention_mask) | {
            "decoder_input_ids": target.input_ids, "decoder_attention_mask": target.attention_mask}
        return batch, kwargs, sum(sources.lengths[i] + targets.lengths[i] for i in indices)

    return step


def checked_consumers(consumers: Iterable[Consumer]) -> tuple[Consumer, ...]:
    """``consumers`` as a tuple, each checked to have ``update(batch)``.

    Raises:
        TypeError: one has no ``update``.
    """
    consumers = tuple(consumers)
    for consumer in consumers:
        if not callable(getattr(consumer, "update", None)):
            raise TypeError(f"consumer {consumer!r} has no update(batch) method")
    return consumers


def check_batch_size(batch_size: object, what: str) -> int:
    """``batch_size`` if it is a positive int.

    Raises:
        ValueError: it is not; the message says what is batched (``what``: "images per forward").
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}; expected a positive int ({what})")
    return batch_size


def feed(handle: HeadedModel, selection: dict[int, list[int]], take: tuple[str, ...], consumers: Sequence[Consumer],
         steps: Iterable[tuple[CaptureBatch, dict[str, Any], int]], *, total: int, progress: bool,
         start: float, sides: dict[int, tuple[str, str]] | None = None, pattern_memory: int | None = None) -> int:
    """Run each step's forward with taps on the selected heads, put what they took in its batch, and hand the batch
    to every consumer in order: the loop of ``capture`` and of ``headlab.capture.images.capture_images``.

    Under ``torch.inference_mode`` with the model in eval mode (restored afterwards); the taps are removed when it
    ends, on error too, and nothing of a batch outlives its turn.

    Args:
        handle: the model's handle.
        selection: ``{layer: heads}`` to take (``HeadedModel.heads``).
        take: what to take of each head (``headlab.layer.taps.TAKE``).
        consumers: objects with ``update(batch)``.
        steps: ``(batch with no layer taken yet, the forward's keyword arguments, real tokens in it)`` per batch.
        total: how many steps, for the progress bar.
        progress: show a progress bar with tokens per second.
        start: ``time.perf_counter()`` when the capture began (the rate counts from it).
        sides: a batch of pairs: ``{layer: (query side, key side)}`` (``LayerCapture.sides``); None: one side.
        pattern_memory: the most bytes of patterns a batch may hold at once: a batch whose whole patterns would
            take more has its taps keep them as ``PatternRows`` (``headlab.capture.blocks``); None: whole.

    Returns:
        How many batches kept their patterns as ``PatternRows``.

    Raises:
        RuntimeError: a selected layer did not run headlab's attention in a forward, or ran twice.
    """
    taken: dict[int, LayerCapture] = {}

    def sink(layer: int, out: TapOutput) -> None:
        if layer in taken:
            raise RuntimeError(f"layer {layer} ran twice in one forward")
        taken[layer] = LayerCapture(layer=layer, heads=tuple(selection[layer]),
                                    sides=(SOURCE, SOURCE) if sides is None else sides[layer],
                                    pattern_rows=out.pattern_rows, **{name: getattr(out, name) for name in take})

    try:
        # Patterns in buffers reused from batch to batch (a batch's tensors are dropped before the next forward).
        with tapped(handle.sites, selection, take, sink), handle.running() as net, torch.inference_mode(), \
                reuse_pattern_memory(), RateProgress(progress, total) as bar:
            done_tokens = blocked = 0
            for batch, kwargs, tokens in steps:
                taken.clear()
                items, positions = batch.input_ids.shape
                blocks = pattern_memory is not None and "pattern" in take and whole_pattern_bytes(
                    items, positions, selection, handle.dtype.itemsize) > pattern_memory
                for layer in selection:  # the taps keep what makes the patterns instead of forming them
                    cast(Tap, handle.sites[layer].tap).blocks = blocks
                net(**kwargs)
                if len(taken) != len(selection):
                    raise RuntimeError(f"layers {sorted(set(selection) - set(taken))} did not run headlab's attention "
                                       "in this forward")
                batch.layers = dict(sorted(taken.items()))
                taken.clear()
                for consumer in consumers:  # what each will read, announced before any reads it
                    prepare = getattr(consumer, "prepare", None)
                    if prepare is not None:
                        prepare(batch)
                with counting_rows(bar.formed) if blocks else nullcontext():  # a long text's rows, as they form
                    for consumer in consumers:
                        consumer.update(batch)
                blocked += blocks
                done_tokens += tokens  # counted on the host: no wait for the GPU
                batch.release_shared()  # what consumers derived may hold the batch: freed now, not at the next GC
                del batch, kwargs  # nothing of a batch outlives its turn
                bar.advance(done_tokens / max(time.perf_counter() - start, 1e-9))
    finally:
        taken.clear()
    return blocked


def warn_truncated(truncated: Sequence[int], items: int, max_length: int | None, *, stacklevel: int = 3) -> None:
    """A ``TruncationWarning`` (``truncation_message``), attributed to the caller's caller (the user's call of
    ``capture`` or of the Ray engine by default); nothing when none was truncated."""
    if truncated:
        warnings.warn(truncation_message(truncated, items, max_length), TruncationWarning, stacklevel=stacklevel)


class RateProgress:
    """A rich progress bar over ``total`` steps showing tokens per second, or nothing when not ``enabled``; below
    it, once ``formed`` is first called, the query rows of patterns formed from ``PatternRows`` and their rate (a
    long text is one step whose patterns are read a block at a time).

    Args:
        enabled: show it.
        total: steps.
        label, unit: the words before and after the count (``capture … batches``, ``ray … shards``).
    """

    def __init__(self, enabled: bool, total: int, *, label: str = "capture", unit: str = "batches") -> None:
        self.enabled, self.total, self.label, self.unit = enabled, total, label, unit
        self.rows_task: Any = None
        self.rows_start, self.rows_done = 0.0, 0

    def __enter__(self) -> RateProgress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[unit]}"),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=self.total, rate="", unit=self.unit)
        return self

    def advance(self, tokens_per_second: float) -> None:
        if self.enabled:
            self.bar.update(self.task, advance=1, rate=f"{tokens_per_second:,.0f} tokens/s")

    def formed(self, rows: int) -> None:
        """Count ``rows`` query rows of patterns formed from ``PatternRows`` (``headlab.layer.pattern_rows
        .counting_rows``), on a line of their own."""
        if not self.enabled:
            return
        if self.rows_task is None:
            self.rows_task = self.bar.add_task("  rows formed", total=None, rate="", unit="rows")
            self.rows_start = time.perf_counter()
        self.rows_done += rows
        rate = self.rows_done / max(time.perf_counter() - self.rows_start, 1e-9)
        self.bar.update(self.rows_task, advance=rows, rate=f"{rate:,.0f} rows/s")

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.enabled:
            self.bar.__exit__(kind, error, traceback)
