"""``capture``: run a model over a corpus in batches and hand the selected heads to consumers.

Each batch's tensors live only while the consumers' ``update`` calls run: memory grows with
the batch, never with the corpus. Consumers that need corpus order use
``CaptureBatch.corpus_indices``.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from headlab import display
from headlab.capture.batch import CaptureBatch, LayerCapture, collate
from headlab.capture.batching import padding_stats, plan_batches
from headlab.capture.corpus import Corpus, load_corpus
from headlab.capture.encoding import tokenize_corpus
from headlab.capture.taps import check_what, tapped
from headlab.heads.selection import HeadSelection, resolve
from headlab.models import LoadedModel, TapOutput, attention_sites
from headlab.models.interface import reuse_pattern_memory

__all__ = ["CaptureResult", "Consumer", "TruncationWarning", "capture", "model_max_length"]


@runtime_checkable
class Consumer(Protocol):
    """Anything with ``update(batch)``; the analysis accumulators add ``merge`` and ``result``."""

    def update(self, batch: CaptureBatch) -> None: ...


class TruncationWarning(UserWarning):
    """Items were cut to ``max_length``; ``CaptureResult.truncated`` lists them."""


@dataclass
class CaptureResult:
    """What a capture did (its data went to the consumers).

    Attributes:
        items: items in the corpus.
        tokens: real tokens run, special tokens included, after truncation.
        padded_tokens: tokens computed on, padding included (``Σ batch × pos``).
        batches: forward passes.
        truncated: corpus indices of the items cut to ``max_length``.
        max_length: the truncation length in pieces, or None.
        layers: ``{layer: heads}`` captured.
        what: what was captured of each head.
        seconds: wall time, tokenization included.
    """

    items: int
    tokens: int
    padded_tokens: int
    batches: int
    truncated: list[int]
    max_length: int | None
    layers: dict[int, list[int]]
    what: tuple[str, ...]
    seconds: float
    corpus: dict[str, Any] = field(default_factory=dict)

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
            "what": list(self.what), "seconds": self.seconds, "tokens_per_second": self.tokens_per_second,
            "corpus": dict(self.corpus),
        }

    def __repr__(self) -> str:
        return display.summary(self._title(), self._facts())

    def _repr_html_(self) -> str:
        return display.card(self._title(), self._facts())

    def _title(self) -> str:
        return f"CaptureResult: {self.items:,} items, {self.tokens:,} tokens in {self.batches:,} batches"

    def _facts(self) -> list[tuple[str, object]]:
        heads = sum(len(hs) for hs in self.layers.values())
        padding = f" ({self.padded_tokens / self.tokens:.2f}× the real ones)" if self.tokens else ""
        limit = f" to {self.max_length} pieces" if self.max_length else ""
        rate = f", {self.tokens / self.seconds:,.0f} tokens/s" if self.seconds > 0 else ""
        return [("taken", f"{', '.join(self.what)} of {heads} heads in layers {display.runs(self.layers) or 'none'}"),
                ("computed", f"{self.padded_tokens:,} tokens with padding{padding}"),
                ("truncated", f"{self.n_truncated} items{limit}"), ("time", f"{self.seconds:.2f} s{rate}")]


def model_max_length(model: nn.Module, tokenizer: Any = None) -> int | None:
    """The longest input the model takes, in pieces, special tokens included; None when nothing says.

    The smallest of: ``config.max_position_embeddings``; the tokenizer's ``model_max_length``
    (Hugging Face's "no limit", about 1e30, does not count); and, for every learned table of
    absolute positions in the model, the rows a position can use. A position table is an
    ``nn.Embedding`` whose attribute name holds "position" (``position_embeddings``,
    ``embed_positions``). When it has a ``padding_idx``, positions are counted from just after it
    (RoBERTa and its kin number tokens ``padding_idx + 1, padding_idx + 2, …``), so only
    ``num_embeddings − padding_idx − 1`` rows are usable: 514 − 1 − 1 = 512 for roberta-base,
    where ``max_position_embeddings`` says 514. For a table whose positions start at 0 in spite of
    a ``padding_idx`` the rule gives up ``padding_idx + 1`` positions it could have used; it never
    gives more than the model takes.

    Args:
        model: the transformers model (``LoadedModel.model``).
        tokenizer: its tokenizer, or None.

    Returns:
        The limit, or None.
    """
    limits = [getattr(getattr(model, "config", None), "max_position_embeddings", None),
              getattr(tokenizer, "model_max_length", None)]
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and "position" in name.rpartition(".")[2]:
            first = 0 if module.padding_idx is None else module.padding_idx + 1  # padding_idx is stored ≥ 0
            limits.append(module.num_embeddings - first)
    limits = [n for n in limits if isinstance(n, int) and 0 < n < 1_000_000]  # HF's "no limit" is ~1e30
    return min(limits) if limits else None


def capture(
    model: nn.Module | LoadedModel,
    tokenizer: Any = None,
    corpus: str | os.PathLike[str] | Sequence[str] | Corpus | None = None,
    *,
    heads: HeadSelection = None,
    what: str | Sequence[str] = ("pattern",),
    consumers: Sequence[Consumer] = (),
    batch_tokens: int | None = 4096,
    max_batch_size: int | None = 64,
    max_length: int | None = None,
    progress: bool = True,
) -> CaptureResult:
    """Run ``model`` over ``corpus`` and give every consumer each batch's selected heads.

    The corpus is tokenized once, grouped into length-bucketed batches (``plan_batches``),
    and run under ``torch.inference_mode`` with the model in eval mode (its mode is restored
    afterwards). Taps on the selected layers take only the selected heads; they are removed
    when the capture ends, on error too.

    Args:
        model: a transformers model with headlab's attention attached (``headlab.attach``), or
            the ``LoadedModel`` of ``headlab.load``; batches go to its parameters' device.
        tokenizer: its fast tokenizer (offsets and word ids come from it); None takes the
            ``LoadedModel``'s.
        corpus: see ``load_corpus``: None for the bundled corpus, a path, or a list of strings.
        heads: the heads to take (``headlab.heads.selection``); None for every head.
        what: any of ``headlab.models.site.TAPPED``: "pattern", "z", "result", "q", "k", "v".
        consumers: objects with ``update(batch: CaptureBatch)``, called in order per batch.
        batch_tokens: most padded tokens (``batch × pos``) per batch, or None.
        max_batch_size: most items per batch, or None.
        max_length: most pieces per item (longer items are cut, with a ``TruncationWarning``
            and listed in the result); None for the model's limit (``model_max_length``).
        progress: show a progress bar over batches with tokens per second.

    Returns:
        Counts, truncated items and throughput.

    Raises:
        ValueError / TypeError: a bad corpus, selection, ``what``, batch bound or tokenizer, or
            a model without headlab attention.
        RuntimeError: the model is already being captured.
    """
    start = time.perf_counter()
    if isinstance(model, LoadedModel):
        model, tokenizer = model.model, model.tokenizer if tokenizer is None else tokenizer
    if tokenizer is None:
        raise TypeError("capture needs the model's tokenizer (or a LoadedModel that has one)")
    corpus = load_corpus(corpus)
    what = check_what(what)
    for consumer in consumers:
        if not callable(getattr(consumer, "update", None)):
            raise TypeError(f"consumer {consumer!r} has no update(batch) method")
    sites = attention_sites(model)
    selection = resolve(heads, [site.n_heads for site in sites])
    max_length = model_max_length(model, tokenizer) if max_length is None else max_length
    tokenized = tokenize_corpus(tokenizer, corpus.texts, max_length=max_length)
    truncated = tokenized.truncated
    warn_truncated(truncated, len(tokenized), max_length)
    batches = plan_batches(tokenized.lengths, batch_tokens=batch_tokens, max_batch_size=max_batch_size)
    parameter = next(model.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")

    taken: dict[int, LayerCapture] = {}

    def sink(layer: int, out: TapOutput) -> None:
        if layer in taken:
            raise RuntimeError(f"layer {layer} ran twice in one forward")
        taken[layer] = LayerCapture(layer=layer, heads=tuple(selection[layer]),
                                    **{name: getattr(out, name) for name in what})

    was_training = model.training
    model.eval()
    try:
        # Patterns in buffers reused from batch to batch (a batch's tensors are dropped before the next forward).
        with tapped(sites, selection, what, sink), torch.inference_mode(), reuse_pattern_memory(), \
                RateProgress(progress, len(batches)) as bar:
            done_tokens = 0
            for indices in batches:
                batch = collate(tokenized, indices, device=device)
                taken.clear()
                model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
                if len(taken) != len(selection):
                    raise RuntimeError(f"layers {sorted(set(selection) - set(taken))} did not run headlab's attention "
                                       "in this forward")
                batch.layers = dict(sorted(taken.items()))
                taken.clear()
                for consumer in consumers:
                    consumer.update(batch)
                done_tokens += sum(tokenized.lengths[i] for i in indices)  # counted on the host: no wait for the GPU
                batch.release_shared()  # what consumers derived may hold the batch: freed now, not at the next GC
                del batch  # nothing of a batch outlives its turn
                bar.advance(done_tokens / max(time.perf_counter() - start, 1e-9))
    finally:
        taken.clear()
        model.train(was_training)
    return CaptureResult(
        items=len(tokenized), tokens=tokenized.n_tokens,
        padded_tokens=padding_stats(tokenized.lengths, batches).padded_tokens, batches=len(batches),
        truncated=truncated, max_length=max_length, layers=selection, what=what,
        seconds=time.perf_counter() - start, corpus=corpus.to_dict(),
    )


def warn_truncated(truncated: Sequence[int], items: int, max_length: int | None) -> None:
    """A ``TruncationWarning`` naming the first truncated items, attributed to the caller's caller
    (the user's call of ``capture`` or of the Ray engine); nothing when none was truncated."""
    if truncated:
        shown = ", ".join(map(str, truncated[:10])) + (" …" if len(truncated) > 10 else "")
        warnings.warn(f"{len(truncated)} of {items} items are longer than max_length={max_length} pieces and were "
                      f"truncated (corpus indices {shown}); CaptureResult.truncated lists them all",
                      TruncationWarning, stacklevel=3)


class RateProgress:
    """A rich progress bar over ``total`` steps showing tokens per second, or nothing when not ``enabled``.

    Args:
        enabled: show it.
        total: steps.
        label, unit: the words before and after the count (``capture … batches``, ``ray … shards``).
    """

    def __init__(self, enabled: bool, total: int, *, label: str = "capture", unit: str = "batches") -> None:
        self.enabled, self.total, self.label, self.unit = enabled, total, label, unit

    def __enter__(self) -> RateProgress:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TextColumn(self.unit),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
            )
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=self.total, rate="")
        return self

    def advance(self, tokens_per_second: float) -> None:
        if self.enabled:
            self.bar.update(self.task, advance=1, rate=f"{tokens_per_second:,.0f} tokens/s")

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)
