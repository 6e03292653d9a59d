"""Streaming heads, simulated exactly: which heads could keep only the first few "sink" tokens and a
window of recent ones, and what the model would save (StreamingLLM, Xiao et al. 2023; DuoAttention,
Xiao et al. 2024; RazorAttention, Tang et al. 2024).

For each window W (swept) and each selected head h (``heads``: a ``headlab.heads.selection``; every
head without one), the head is run as a streaming head inside the model
(``headlab.heads.windowed``: the attention function computes it under the sink + window mask) and two
changes are measured against the unrestricted model on corpus text:

    z change     ‖z_h(W) − z_h‖ / ‖z_h‖ over every real position: the head's own output. Heads of one
                 layer do not see each other's windows, so one forward per selected layer gives all of
                 its selected heads.
    loss change  causal LMs: next-token cross-entropy (nats per predicted token) minus the model's;
                 encoders: 1 − cosine of each text's mean-pooled embedding to the model's own
                 (``importance.fidelity_metric``'s recipe), averaged over texts.

The loss change with every selected head streaming at once is measured too (``all_heads``). A head
*tolerates* W when its loss change is at most the budget. The tolerant heads, cheapest first,
are then converted all at once and the combined loss change measured; when it exceeds the budget the
prefix is cut (binary search over how many, every candidate measured), so the reported conversion is
one that was run. Memory: causal models keep a key/value cache, and a key/value head shrinks to
``sinks + W`` entries only when every query head reading it (grouped-query attention) is streaming;
encoders keep no cache, so what a window saves there is attention-score memory (score entries per
query head), which is what is reported for them.

Axis legend:
    input_ids  (batch, pos)
    z          (batch, head, pos, d_head_v): ``head`` runs over a layer's selected heads
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from headlab import display
from headlab.capture.corpus import ShortCorpus
from headlab.heads import HeadSelection, HeadTable, windowed
from headlab.models import HeadedModel, headed
from headlab.models.stream import has_logits

__all__ = [
    "BUDGETS", "Conversion", "StreamingChanges", "StreamingResult", "StreamingStats", "corpus_batches",
    "streaming_simulation",
]

BUDGETS = {"causal": 0.02, "bidirectional": 0.001}  # default loss budgets: nats per token; 1 − cosine


@dataclass
class Conversion:
    """The heads converted to streaming at one window, all at once, and what that costs and saves.

    Attributes:
        window: W.
        tolerant: heads whose own loss change is within the budget.
        heads: heads converted together (the cheapest ``len(heads)`` of the tolerant ones).
        loss_change: measured loss change with all of ``heads`` streaming.
        evaluations: combined conversions measured to find ``heads``.
        freed: key/value heads whose every query head streams (causal), or query heads (encoders).
        unsaved: converted query heads that save nothing: a query head that does not stream still
            reads their key/value head (grouped-query attention; 0 for encoders).
        units: key/value heads (causal) or query heads (encoders) in the model.
        saved_bytes, total_bytes: cache (causal) or score (encoders) memory of one sequence of the
            evaluated length, saved and in all, at the model's dtype.
        limit_share: the share saved as the sequence grows without end.
    """

    window: int
    tolerant: list[tuple[int, int]]
    heads: list[tuple[int, int]]
    loss_change: float
    evaluations: int
    freed: int
    unsaved: int
    units: int
    saved_bytes: int
    total_bytes: int
    limit_share: float

    @property
    def saved_share(self) -> float:
        return self.saved_bytes / self.total_bytes if self.total_bytes else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"window": self.window, "tolerant": [list(h) for h in self.tolerant],
                "heads": [list(h) for h in self.heads], "loss_change": self.loss_change,
                "evaluations": self.evaluations, "freed": self.freed, "unsaved": self.unsaved, "units": self.units,
                "saved_bytes": self.saved_bytes, "total_bytes": self.total_bytes, "saved_share": self.saved_share,
                "limit_share": self.limit_share}


@dataclass(repr=False)
class StreamingResult(display.Shown):
    """Per head and window: z change, loss change and whether the conversion made it streaming.

    Attributes:
        table: a row per selected head; columns ``z_change_w{W}``, ``loss_change_w{W}``, ``streaming_w{W}`` (1 or 0).
        kind: "causal" or "bidirectional".
        windows, sinks, budget: the simulation's settings.
        memory: "key/value cache" (causal) or "attention scores" (encoders).
        loss: what the loss is, in words.
        base_loss: the unrestricted model's loss (0 for encoders: the embedding against itself).
        all_heads: loss change with every head of the table streaming at once (the selected heads; every head of
            the model without a selection), per window.
        conversions: one per window.
        texts, length: texts run and their length in tokens.
        seconds: wall time.
    """

    table: HeadTable
    kind: str
    windows: list[int]
    sinks: int
    budget: float
    memory: str
    loss: str
    base_loss: float
    all_heads: list[float]
    conversions: list[Conversion]
    texts: int
    length: int
    seconds: float = 0.0

    def tolerant(self, window: int) -> list[tuple[int, int]]:
        """Heads whose own loss change at ``window`` is within the budget, cheapest first."""
        return self.conversion(window).tolerant

    def conversion(self, window: int) -> Conversion:
        for c in self.conversions:
            if c.window == window:
                return c
        raise KeyError(f"window {window} was not simulated; windows: {self.windows}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "windows": self.windows, "sinks": self.sinks, "budget": self.budget,
                "memory": self.memory, "loss": self.loss, "base_loss": self.base_loss, "all_heads": self.all_heads,
                "conversions": [c.to_dict() for c in self.conversions], "texts": self.texts, "length": self.length,
                "seconds": self.seconds, **self.table.to_dict()}

    def _parts(self) -> list[str]:
        grids = [f"loss_change_w{w}" for w in self.windows if f"loss_change_w{w}" in self.table.columns][:3]
        return [display.Html(self.table.html(grids))]

    def _title(self) -> str:
        return (f"StreamingResult: {len(self.table)} heads of a {self.kind} model restricted to {self.sinks} sinks "
                f"+ a window, {self.texts} texts of {self.length} tokens")

    def _facts(self) -> list[tuple[str, object]]:
        facts: list[tuple[str, object]] = [("loss", f"{self.loss}; unrestricted {display.short(self.base_loss)}")]
        facts += [(f"W = {c.window}", f"{len(c.tolerant)} heads within {display.short(self.budget)}, {len(c.heads)} "
                   f"converted together; {c.saved_share:.0%} of the {self.memory} saved") for c in self.conversions]
        return facts


class StreamingChanges(NamedTuple):
    """What ``StreamingStats`` measured over its batches (``StreamingStats.result``)."""

    z_change: np.ndarray  # (windows, selected heads): ‖z_h(W) − z_h‖ / ‖z_h‖
    loss_change: np.ndarray  # (windows, selected heads): the loss with head h streaming minus the model's
    base_loss: float  # the model's loss per unit (predicted token, or text)
    all_heads: np.ndarray  # (windows,): the loss change with every selected head streaming at once


class StreamingStats:
    """Sums of z and loss changes per window and selected head over batches; mergeable.

    A ``Mergeable[StreamingChanges]`` (``headlab.analysis.accumulator``) fed tokenised batches with
    ``measure``, not a capture consumer: each batch runs its own forwards, per window one per selected
    layer (z), one per selected head (loss) and one with every selected head streaming.

    Args:
        model: a ``HeadedModel`` (or attached model) the batches run on.
        windows: the windows W to sweep, each ``>= 1``.
        sinks: first keys every streaming head keeps, ``>= 0``.
        heads: the heads to simulate (``headlab.heads.selection``); None for every head.

    Attributes:
        selection: ``{layer: sorted heads}`` simulated.

    Raises:
        ValueError: an empty or bad window list, a bad sink count, or a bad selection.
    """

    def __init__(self, model: HeadedModel | nn.Module, *, windows: Sequence[int], sinks: int = 4,
                 heads: HeadSelection = None) -> None:
        windows = list(windows)
        if not windows or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in windows):
            raise ValueError(f"windows={windows!r}: expected a non-empty list of ints >= 1")
        if isinstance(sinks, bool) or not isinstance(sinks, int) or sinks < 0:
            raise ValueError(f"sinks={sinks!r}: expected an int >= 0")
        self.model, self.windows, self.sinks = headed(model), sorted(set(windows)), sinks
        sites = self.model.sites
        self.n_heads = [site.n_heads for site in sites]
        self.causal = all(site.causal for site in sites)
        self.selection = self.model.heads(heads)
        shape = (len(self.windows), len(self.heads))
        self.dz2, self.z2 = np.zeros(shape), np.zeros(shape)  # Σ‖Δz‖², Σ‖z‖² per window and head
        self.loss = np.zeros(shape)  # Σ per-unit loss with the head streaming
        self.all_loss = np.zeros(len(self.windows))  # Σ per-unit loss with every selected head streaming
        self.base = 0.0  # Σ per-unit loss of the model
        self.units = 0  # predicted tokens (causal) or texts (encoders)

    @property
    def heads(self) -> list[tuple[int, int]]:
        """The selected heads, layer by layer: the order of the sums' head axis."""
        return [(layer, h) for layer, hs in self.selection.items() for h in hs]

    def loss_sum(self, batch: dict[str, Tensor], reference: Tensor | None) -> tuple[float, Tensor | None, int]:
        """``(Σ loss, embeddings or None, units)`` of one forward on ``batch``; encoders compare with ``reference``."""
        net = self.model.model
        with torch.no_grad():
            if self.causal:
                logits = net(**batch).logits  # (batch, pos, vocab)
                targets = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100)
                loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).double(), targets.flatten(), ignore_index=-100,
                                       reduction="sum")
                return float(loss), None, int((targets != -100).sum())
            from headlab.analysis.importance import _mean_pool

            pooled = _mean_pool(net, batch["input_ids"], batch["attention_mask"]).double()  # (batch, d_model)
            if reference is None:
                return 0.0, pooled, len(pooled)
            return float((1 - (pooled * reference).sum(-1)).sum()), pooled, len(pooled)

    def measure(self, batch: dict[str, Tensor]) -> None:
        """Run one tokenised batch (``input_ids``, ``attention_mask``) with every selected head and window."""
        from headlab.capture import run_with_cache

        def selected_z(cache: Any, layer: int, hs: list[int]) -> Tensor:  # (batch, head, pos, d_head_v)
            return torch.stack([cache["z", layer, h] for h in hs], 1)

        base, reference, units = self.loss_sum(batch, None)
        z = run_with_cache(self.model, batch, take="z", heads=self.selection)
        real = batch["attention_mask"].bool()  # (batch, pos)
        offsets = dict(zip(self.selection, np.cumsum([0, *map(len, self.selection.values())]).tolist()))
        for w, window in enumerate(self.windows):
            for layer, hs in self.selection.items():  # a layer's heads do not see each other's windows
                with windowed(self.model, {layer: hs}, window=window, sinks=self.sinks):
                    zw = selected_z(run_with_cache(self.model, batch, take="z", heads={layer: hs}), layer, hs)
                z0 = selected_z(z, layer, hs)
                rows = slice(offsets[layer], offsets[layer] + len(hs))
                self.dz2[w, rows] += ((zw - z0).double() ** 2).sum(-1).transpose(1, 2)[real].sum(0).cpu().numpy()
                self.z2[w, rows] += (z0.double() ** 2).sum(-1).transpose(1, 2)[real].sum(0).cpu().numpy()
            for i, head in enumerate(self.heads):
                with windowed(self.model, [head], window=window, sinks=self.sinks):
                    self.loss[w, i] += self.loss_sum(batch, reference)[0]
            with windowed(self.model, self.selection, window=window, sinks=self.sinks):
                self.all_loss[w] += self.loss_sum(batch, reference)[0]
        self.base += base
        self.units += units

    def update(self, batch: dict[str, Tensor]) -> None:
        """Deprecated name of ``measure`` (``update`` means one capture batch); removed in the next release."""
        warnings.warn("StreamingStats.update is deprecated: use StreamingStats.measure (update takes one capture "
                      "batch, headlab.analysis.accumulator)", DeprecationWarning, stacklevel=2)
        self.measure(batch)

    def merge(self, other: StreamingStats) -> StreamingStats:
        """Add ``other``'s sums (same heads, windows, sinks and selection); returns self.

        Raises:
            ValueError: another geometry, other settings or another selection.
        """
        if (other.n_heads, other.windows, other.sinks, other.causal) != (self.n_heads, self.windows, self.sinks,
                                                                         self.causal):
            raise ValueError(f"cannot merge streaming sums of heads {other.n_heads}, windows {other.windows}, sinks "
                             f"{other.sinks} into heads {self.n_heads}, windows {self.windows}, sinks {self.sinks}")
        if other.selection != self.selection:
            raise ValueError(f"cannot merge streaming sums of the heads {other.selection} into sums of the heads "
                             f"{self.selection}: the selections differ")
        for name in ("dz2", "z2", "loss", "all_loss"):
            getattr(self, name).__iadd__(getattr(other, name))
        self.base += other.base
        self.units += other.units
        return self

    def result(self) -> StreamingChanges:
        """The z and loss changes per window and selected head, the base loss and the every-selected-head loss change.

        Raises:
            ValueError: no batch was run.
        """
        if not self.units:
            raise ValueError("no batch was run: call measure first")
        z_change = np.sqrt(self.dz2 / np.maximum(self.z2, 1e-300))
        base = self.base / self.units
        return StreamingChanges(z_change, self.loss / self.units - base, base, self.all_loss / self.units - base)

    def changes(self) -> StreamingChanges:
        """Deprecated name of ``result``; removed in the next release."""
        warnings.warn("StreamingStats.changes is deprecated: use StreamingStats.result", DeprecationWarning,
                      stacklevel=2)
        return self.result()


def corpus_batches(tokenizer: Any, texts: Sequence[str], *, length: int, count: int, batch_size: int = 8,
                   device: str | torch.device = "cpu") -> list[dict[str, Tensor]]:
    """``count`` corpus chunks of ``length`` tokens (special tokens included), as tokenised batches.

    Consecutive corpus items are joined (with a space) until a chunk holds at least ``length`` tokens,
    then cut to ``length``; windows only matter on texts longer than themselves.

    Raises:
        ValueError: sizes out of range.
        ShortCorpus: a corpus with fewer than ``count`` such chunks (a ``ValueError``).
    """
    for name, value in (("length", length), ("count", count), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r}: expected an int >= 1")
    if tokenizer.pad_token is None:  # GPT-2-style tokenizers have none; every chunk is full anyway
        tokenizer.pad_token = tokenizer.eos_token
    chunks, current, tokens = [], [], 0
    for text in texts:
        current.append(text)
        tokens += len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if tokens >= length:
            chunks.append(" ".join(current))
            current, tokens = [], 0
            if len(chunks) == count:
                break
    if len(chunks) < count:
        raise ShortCorpus(f"the corpus holds {len(chunks)} chunks of {length} tokens; {count} were asked for")
    batches = []
    for start in range(0, count, batch_size):
        encoded = tokenizer(chunks[start:start + batch_size], padding=True, truncation=True, max_length=length,
                            return_tensors="pt")
        batches.append({k: encoded[k].to(device) for k in ("input_ids", "attention_mask")})
    return batches


def streaming_simulation(model: HeadedModel | nn.Module, *, corpus: Any = None, heads: HeadSelection = None,
                         windows: Sequence[int] = (8, 16, 32, 64), sinks: int = 4, budget: float | None = None,
                         length: int = 128, texts: int = 8, batch_size: int = 8) -> StreamingResult:
    """Sweep W over the selected heads, then convert the tolerant ones at each W and measure the conversion.

    The forwards scale with the selection: per window and batch one per selected layer, one per selected head
    and one with every selected head streaming (``StreamingStats``), plus the conversion's.

    Args:
        model: a ``HeadedModel`` with a tokenizer (causal LM with logits, or an encoder).
        corpus: anything ``headlab.capture.load_corpus`` reads; None for the bundled corpus.
        heads: the heads to simulate (``headlab.heads.selection``); None for every head.
        windows: the windows W, each ``>= 1``.
        sinks: first keys a streaming head keeps.
        budget: the largest loss change a conversion may cost; None for ``BUDGETS[kind]``.
        length: tokens per text (longer than the windows, or they change nothing).
        texts: corpus chunks to run.
        batch_size: chunks per forward.

    Returns:
        The table, a row per selected head, and one conversion per window.

    Raises:
        ValueError: bad settings, a bad selection, a model without a tokenizer, a causal model without logits, or a
            length longer than the model takes.
    """
    from headlab.capture import load_corpus

    start = time.perf_counter()
    model = headed(model)
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 0):
        raise ValueError(f"budget={budget!r}: expected a number >= 0")
    if model.tokenizer is None:
        raise ValueError(f"{model.source} has no tokenizer; the simulation runs on corpus text")
    limit = model.max_length
    if limit is not None and isinstance(length, int) and length > limit:
        raise ValueError(f"length={length}: {model.source} takes at most {limit} tokens")
    stats = StreamingStats(model, windows=windows, sinks=sinks, heads=heads)
    kind = "causal" if stats.causal else "bidirectional"
    budget = BUDGETS[kind] if budget is None else float(budget)
    batches = corpus_batches(model.tokenizer, load_corpus(corpus).texts, length=length, count=texts,
                             batch_size=batch_size, device=model.device)
    if stats.causal and not has_logits(model):
        raise ValueError(f"{model.source} is causal but its output has no logits: no next-token loss to measure")
    for batch in batches:
        stats.measure(batch)
    z_change, loss_change, base, all_heads = stats.result()
    heads, columns, conversions = stats.heads, {}, []
    # an encoder's loss compares with the unrestricted model's embeddings: one forward per batch for every window
    references = [None if stats.causal else stats.loss_sum(b, None)[1] for b in batches]
    for w, window in enumerate(stats.windows):
        conversion = _convert(stats, batches, references, window, loss_change[w], budget)
        conversions.append(conversion)
        chosen = set(conversion.heads)
        columns[f"z_change_w{window}"] = z_change[w]
        columns[f"loss_change_w{window}"] = loss_change[w]
        columns[f"streaming_w{window}"] = [float(h in chosen) for h in heads]
    loss = ("next-token cross-entropy, nats per predicted token" if stats.causal else
            "1 − cosine of each text's mean-pooled embedding to the unrestricted model's")
    return StreamingResult(HeadTable(heads, columns), kind, stats.windows, sinks, budget,
                           "key/value cache" if stats.causal else "attention scores", loss, base,
                           [float(x) for x in all_heads], conversions, texts, length, time.perf_counter() - start)


def _convert(stats: StreamingStats, batches: list[dict[str, Tensor]], references: list[Tensor | None], window: int,
             loss_change: np.ndarray, budget: float) -> Conversion:
    """The largest cheapest-first prefix of the tolerant heads whose combined loss change is within ``budget``
    (``references``: each batch's unrestricted embeddings for an encoder, None for a causal model)."""
    heads = stats.heads
    order = [heads[i] for i in np.argsort(loss_change, kind="stable") if loss_change[i] <= budget]
    measured: dict[int, float] = {0: 0.0}

    def combined(k: int) -> float:
        if k not in measured:
            with windowed(stats.model, order[:k], window=window, sinks=stats.sinks):
                total = sum(stats.loss_sum(b, r)[0] for b, r in zip(batches, references))
            measured[k] = total / stats.units - stats.base / stats.units
        return measured[k]

    best = len(order)
    if order and combined(best) > budget:
        low, high = 0, best  # combined(low) within budget, combined(high) not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if combined(middle) <= budget else (low, middle)
        best = low
    chosen = order[:best]
    return Conversion(window, order, chosen, combined(best), len(measured) - 1,
                      *_memory(stats, chosen, window, int(batches[0]["input_ids"].shape[1])))


def _memory(stats: StreamingStats, chosen: list[tuple[int, int]], window: int,
            length: int) -> tuple[int, int, int, int, int, float]:
    """``(freed, unsaved, units, saved bytes, total bytes, limit share)`` of converting ``chosen`` at one
    sequence of ``length``."""
    from headlab.layer.masks import sink_window_blocked

    sites = stats.model.sites
    itemsize = next(stats.model.model.parameters()).element_size()
    streaming = set(chosen)
    freed = unsaved = units = saved = total = 0
    freed_width = all_width = 0
    for site in sites:
        if stats.causal:  # a key/value head: d_head + d_head_v numbers per cached token
            width, kept = site.d_head + site.d_head_v, min(length, stats.sinks + window)
            for kv in sorted(set(site.kv_head_of)):
                readers = [h for h in range(site.n_heads) if site.kv_head_of[h] == kv]
                units += 1
                total += length * width
                all_width += width
                if all((site.layer, h) in streaming for h in readers):
                    freed += 1
                    saved += (length - kept) * width
                    freed_width += width
                else:
                    unsaved += sum((site.layer, h) in streaming for h in readers)
        else:  # a query head's score entries
            allowed = int((~sink_window_blocked(length, length, window=window, sinks=stats.sinks, causal=False,
                                                offset=0)).sum())
            for h in range(site.n_heads):
                units += 1
                total += length * length
                all_width += 1
                if (site.layer, h) in streaming:
                    freed += 1
                    saved += length * length - allowed
                    freed_width += 1
    return freed, unsaved, units, saved * itemsize, total * itemsize, freed_width / all_width if all_width else 0.0

