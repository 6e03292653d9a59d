"""Attention sinks per head, as a function of query position (Xiao et al. 2023, "Efficient Streaming
Language Models with Attention Sinks").

Axis legend:
    pattern    (layer, batch, head, query_pos, key_pos)   a stack of captured layers' selected heads
    rows       (layer, batch, head, query_pos)            each query's share on the first ``n_sink`` positions
    bins       (n_bins,)                                  query positions [edges[b], edges[b + 1]); the last is open
    result     SinkResult                                 a HeadTable (a row per captured head) and per-bin shares

Xiao et al. found that causal language models send much of every query's attention to the first few
tokens whatever they say, and keep 4 of them in a streaming key/value cache. The sink share of a query
is its attention on the first ``n_sink`` positions (4 for a causal model; 1 for an encoder, its [CLS]).
``SinkShare`` accumulates it per head and per bin of query position, raw and — given the heads' W_O and
captured v — value-weighted (``headlab.analysis.norms``: each row's α_ij‖f_h(x_j)‖, renormalised).

Per head, over the queries at positions ≥ ``n_sink`` (a causal query before that sees only sink tokens):
the mean share, and its growth — the least-squares slope of the share against log₂(position), i.e. the
share gained per doubling of the position. A head whose mean raw share is at least ``SINK_HEAD_SHARE`` is
a sink head. Sums are float64 per (layer, head, bin): memory grows with layers × heads × bins only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from headlab import display
from headlab.analysis.norms import ValueProjections, out_projections, value_reductions
from headlab.analysis.per_head import HeadSums
from headlab.analysis.reductions import StackReductions, reductions
from headlab.analysis.roles import SINK
from headlab.capture.batch import CaptureBatch
from headlab.heads import HeadTable, head_label
from headlab.models import HeadedModel

__all__ = [
    "CAUSAL_SINK_TOKENS", "DEFAULT_EDGES", "ENCODER_SINK_TOKENS", "SINK_HEAD_SHARE", "SinkResult", "SinkShare",
    "plot_sink_share", "sink_sentences", "sink_share",
]

_FIX = "capture with take=('pattern', 'v') or pass W_O=None"
CAUSAL_SINK_TOKENS = 4  # Xiao et al. 2023 keep the first 4 tokens as sinks
ENCODER_SINK_TOKENS = 1  # an encoder's first token is [CLS]
SINK_HEAD_SHARE = SINK  # a sink head sends at least half of a query's attention to the sink tokens (the one rule)
DEFAULT_EDGES = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)  # bins double in width


@dataclass(frozen=True, repr=False)
class SinkResult(display.Shown):
    """Sink share per head, overall and by query position.

    Attributes:
        table: a row per captured head: ``n_queries`` (queries at positions ≥ n_sink), ``raw_share``,
            ``raw_growth`` (share per doubling of the position), ``sink_head`` (1 or 0) and, when weighted,
            ``weighted_share`` and ``weighted_growth``.
        n_sink: sink positions.
        edges: the bins' lower edges (the last bin is open).
        raw: ``(head, bin)`` mean raw share of the queries in each bin, NaN where none fell.
        weighted: the same, value-weighted, or None.
        counts: ``(head, bin)`` queries per bin.
    """

    table: HeadTable
    n_sink: int
    edges: tuple[int, ...]
    raw: np.ndarray
    weighted: np.ndarray | None
    counts: np.ndarray

    @property
    def heads(self) -> list[tuple[int, int]]:
        return self.table.heads

    def sink_heads(self) -> list[tuple[int, int]]:
        """The heads with ``sink_head`` set, largest raw share first."""
        return [h for h in self.table.top("raw_share") if self.table.value("sink_head", *h) == 1]

    def bin_labels(self) -> list[str]:
        """``"0"``, ``"2–3"``, …, ``"4096+"``: the positions of each bin."""
        out = []
        for b, low in enumerate(self.edges):
            high = self.edges[b + 1] - 1 if b + 1 < len(self.edges) else None
            out.append(f"{low}+" if high is None else str(low) if high == low else f"{low}–{high}")
        return out

    def filled_bins(self) -> list[int]:
        """The bins that at least one query fell in."""
        return [b for b in range(len(self.edges)) if self.counts[:, b].max() > 0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the table, the bins that were filled with their labels, and per head the shares by bin."""
        filled = self.filled_bins()
        labels = self.bin_labels()

        def rows(values: np.ndarray | None) -> list[list[float | None]] | None:
            if values is None:
                return None
            return [[None if math.isnan(v) else float(v) for v in row[filled]] for row in values]

        return {"n_sink": self.n_sink, "threshold": SINK_HEAD_SHARE, "table": self.table.to_dict(),
                "bins": [labels[b] for b in filled], "counts": self.counts[:, filled].tolist(),
                "raw": rows(self.raw), "weighted": rows(self.weighted)}

    def _parts(self) -> list[str]:
        shares = ["raw_share"] + (["weighted_share"] if "weighted_share" in self.table.columns else [])
        return [display.Html(self.table.html(shares))]

    def _title(self) -> str:
        return f"SinkResult: attention on the first {self.n_sink} tokens, {len(self.heads)} heads"

    def _facts(self) -> list[tuple[str, object]]:
        sinks = self.sink_heads()
        named = ", ".join(f"{head_label(*h)} {display.short(self.table.value('raw_share', *h))}" for h in sinks[:4])
        return [(f"sink heads (share ≥ {SINK_HEAD_SHARE})", f"{len(sinks)}" + (f": {named}" if named else "")
                 + (" …" if len(sinks) > 4 else "")),
                ("query positions", ", ".join(self.bin_labels()[b] for b in self.filled_bins()))]


class SinkShare(HeadSums):
    """Accumulates each head's sink share by query position (patterns needed; v too when weighted).

    Args:
        n_sink: positions counted as sinks (``CAUSAL_SINK_TOKENS`` for a causal model, ``ENCODER_SINK_TOKENS``
            for an encoder: ``from_model`` picks).
        edges: the bins' lower edges, increasing from 0.
        W_O: ``{layer: (n_heads, d_head_v, d_model)}`` (or their ``ValueProjections``) to add the
            value-weighted share, or None.

    Raises:
        ValueError: ``n_sink`` < 1, or edges that do not start at 0 and increase.
    """

    READS_ROW_BLOCKS = True  # row reductions only: the masses on the first keys (announced in prepare)

    def __init__(self, *, n_sink: int = CAUSAL_SINK_TOKENS, edges: Sequence[int] = DEFAULT_EDGES,
                 W_O: Mapping[int, Tensor] | ValueProjections | None = None) -> None:
        super().__init__()
        if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 1:
            raise ValueError(f"n_sink={n_sink!r}; expected an int >= 1 (the sink positions)")
        edges = tuple(int(e) for e in edges)
        if not edges or edges[0] != 0 or any(b <= a for a, b in pairwise(edges)):
            raise ValueError(f"edges={edges}; expected increasing positions starting at 0")
        self.n_sink, self.edges = n_sink, edges
        self.projections = None if W_O is None else ValueProjections.of(W_O)

    @classmethod
    def from_model(cls, model: HeadedModel | nn.Module, *, n_sink: int | None = None, weighted: bool = True,
                   edges: Sequence[int] = DEFAULT_EDGES) -> SinkShare:
        """An accumulator for ``model``: ``n_sink`` by its kind when None, W_O read from it when ``weighted``."""
        from headlab.analysis.surface import is_causal

        if n_sink is None:
            n_sink = CAUSAL_SINK_TOKENS if is_causal(model) else ENCODER_SINK_TOKENS
        return cls(n_sink=n_sink, edges=edges, W_O=out_projections(model) if weighted else None)

    @property
    def weighted(self) -> bool:
        return self.projections is not None

    def _settings(self) -> tuple[Any, ...]:
        return (self.n_sink, self.edges, self.weighted)

    def prepare(self, batch: CaptureBatch) -> None:
        """Before any consumer's update: announce the key columns ``update`` reads the masses on (the sinks, and
        their value-weighted masses and totals), for patterns kept as ``PatternRows``."""
        for view in batch.views():
            reductions(view).announce(self._sink_columns_name(view), partial(self._sink_columns, view))
            if self.projections is not None:
                value_reductions(view, self.projections).announce(fix=_FIX)

    def _sinks(self, batch: CaptureBatch) -> int:
        """How many first keys are the sinks of this view: ``n_sink``, or every key of a shorter key side."""
        return min(self.n_sink, (batch if batch.keys is None else batch.keys).input_ids.shape[1])

    def _sink_columns_name(self, batch: CaptureBatch) -> tuple[Any, ...]:
        return ("sinks", self._sinks(batch), None if self.projections is None else self.projections.key)

    def _sink_columns(self, batch: CaptureBatch, rows: StackReductions) -> Tensor:
        """``(layer, batch, head | 1, key_pos, 1 | 2)``: the first keys, and (weighted) their value norms there."""
        s = self._sinks(batch)
        n_keys = rows.shape[-1]
        first = torch.zeros(1, 1, 1, n_keys, 1, dtype=rows.dtype, device=rows.device)
        first[..., :s, :] = 1.0
        if self.projections is None:
            return first.expand(len(rows.layers), -1, -1, -1, -1)
        norms = value_reductions(batch, self.projections).norms(rows, fix=_FIX).to(rows.dtype)[..., None]
        return torch.cat([first.expand_as(norms), norms * first], -1)

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch (its layers must carry patterns, and v when weighted), view by view
        (``CaptureBatch.views``): the sinks are the first keys of each layer's key side, the bins its query
        positions."""
        for view in batch.views():
            self._update(view)

    def _update(self, batch: CaptureBatch) -> None:
        real = batch.attention_mask.bool()  # (batch, query_pos)
        n_q = real.shape[1]
        s = self._sinks(batch)  # the first keys
        position = torch.arange(n_q, device=real.device)
        bins = torch.bucketize(position, torch.tensor(self.edges, device=real.device), right=True) - 1
        n_bins = len(self.edges)
        one_hot = torch.nn.functional.one_hot(bins, n_bins).double()  # (query, bin)
        past = ((position >= self.n_sink)[None, :] & real).double()  # (batch, query): the queries of the per-head means
        x = position.double().clamp_min(1).log2()  # (query,)
        # Per (item, query), what each row adds up: its bin, and for the past queries 1, x, x².
        features = torch.cat([one_hot.expand(len(real), -1, -1),
                              torch.stack([past, past * x, past * x * x], -1)], -1)  # (batch, query, n_bins + 3)
        # The raw rows are every real query's, the same for every head of every layer: counted once per batch.
        raw_held = torch.einsum("bq,bqf->f", real.double(), features)  # (n_bins + 3,)
        for rows in reductions(batch).stacks:
            # kind → (valid rows (batch, 1, query) or (layer, batch, head, query), share (layer, batch, head, query),
            # what the valid rows hold (layer, head, n_bins + 3))
            # (layer, batch, head, query, 1 | 2): each row's mass on the sinks, and (weighted) its weighted mass
            sinks = rows.masses_on(self._sink_columns_name(batch), partial(self._sink_columns, batch), first_keys=s)
            raw = sinks[..., 0].double()
            shares = {"raw": (real[:, None, :], raw,
                              raw_held.expand(len(rows.layers), len(rows.heads), -1))}
            if self.projections is not None:
                valid, share = self._weighted(batch, rows, self.projections, sinks[..., 1].double())
                shares["weighted"] = (valid, share, torch.einsum("lbhq,bqf->lhf", valid.double(), features))
            totals = {}
            for kind, (valid, share, held) in shares.items():
                share = torch.where(valid, share, 0.0)  # (layer, batch, head, query)
                totals[kind] = (held, torch.einsum("lbhq,bqf->lhf", share, features[..., : n_bins + 2]))
            for i, layer in enumerate(rows.layers):
                sums, counts = {}, {}
                for kind, (held, added) in totals.items():  # (head, n_bins + 3), (head, n_bins + 2) of this layer
                    held, added = held[i], added[i]
                    counts[f"{kind}_bins"], counts[kind] = held[:, :n_bins], held[:, n_bins]
                    sums[f"{kind}_x"], sums[f"{kind}_xx"] = held[:, n_bins + 1], held[:, n_bins + 2]
                    sums[f"{kind}_bins"], sums[kind], sums[f"{kind}_xy"] = (
                        added[:, :n_bins], added[:, n_bins], added[:, n_bins + 1])
                self._add(layer, rows.heads, sums, counts)

    def _weighted(self, batch: CaptureBatch, rows: StackReductions, projections: ValueProjections,
                  sink: Tensor) -> tuple[Tensor, Tensor]:
        """``(valid, share)`` of the value-weighted rows, ``(layer, batch, head, query)``: valid where the row's
        weighted total is > 0; ``sink``: each row's weighted mass on the sinks ``Σ_{j < s} α_ij n_j`` (float64)."""
        shared = value_reductions(batch, projections)  # the norms and totals ValueWeighted reads too
        total = shared.total(rows, fix=_FIX)  # (layer, batch, head, query) float64: Σ_j α_ij n_j
        valid = shared.real[:, None, :] & (total > 0)
        return valid, sink / total.clamp_min(torch.finfo(torch.float64).tiny)

    def result(self, *, threshold: float = SINK_HEAD_SHARE) -> SinkResult:
        """Means per head and per bin.

        Args:
            threshold: the raw share from which a head is a sink head.

        Raises:
            ValueError: nothing was accumulated.
        """
        order = self._order()
        kinds = ("raw", "weighted") if self.weighted else ("raw",)
        columns: dict[str, list[float]] = {"n_queries": []}
        bins: dict[str, list[np.ndarray]] = {kind: [] for kind in kinds}
        counts = []
        for kind in kinds:
            columns[f"{kind}_share"], columns[f"{kind}_growth"] = [], []
        for layer, _, i in order:
            sums, held = self.sums[layer], self.counts[layer]
            columns["n_queries"].append(float(held["raw"][i]))
            counts.append(held["raw_bins"][i].numpy())
            for kind in kinds:
                n = float(held[kind][i])
                sx, sxx, sy, sxy = (float(sums[f"{kind}{k}"][i]) for k in ("_x", "_xx", "", "_xy"))
                columns[f"{kind}_share"].append(sy / n if n else math.nan)
                spread = n * sxx - sx * sx
                columns[f"{kind}_growth"].append((n * sxy - sx * sy) / spread if n and spread > 1e-9 * n * n
                                                 else math.nan)
                c = held[f"{kind}_bins"][i]
                bins[kind].append(torch.where(c > 0, sums[f"{kind}_bins"][i] / c.clamp_min(1.0), math.nan).numpy())
        columns["sink_head"] = [float(v >= threshold) for v in columns["raw_share"]]
        table = HeadTable([(layer, head) for layer, head, _ in order], columns)
        return SinkResult(table=table, n_sink=self.n_sink, edges=self.edges, raw=np.stack(bins["raw"]),
                          weighted=np.stack(bins["weighted"]) if self.weighted else None, counts=np.stack(counts))


def sink_share(model: HeadedModel | nn.Module, corpus: Any = None, *, n_sink: int | None = None, weighted: bool = True,
               **capture_options: Any) -> SinkResult:
    """Run a capture with a ``SinkShare.from_model`` and return its result.

    Args:
        model: a ``HeadedModel``.
        corpus: as ``capture`` takes it; None for the bundled corpus.
        n_sink: sink positions; None picks by the model's kind.
        weighted: add the value-weighted share (captures v too).
        capture_options: passed to ``capture``.
    """
    from headlab.capture import capture

    accumulator = SinkShare.from_model(model, n_sink=n_sink, weighted=weighted)
    capture(model, corpus=corpus, take=("pattern", "v") if weighted else ("pattern",), consumers=[accumulator],
            **capture_options)
    return accumulator.result()


def plot_sink_share(result: SinkResult, path: str | os.PathLike[str], *, top: int = 4) -> None:
    """Share on the sink positions against query position: the mean over heads and the ``top`` heads by raw
    share, raw solid and value-weighted dashed, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    filled = result.filled_bins()
    labels = [result.bin_labels()[b] for b in filled]
    xs = np.arange(len(filled))
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    lines: list[tuple[str, int | None, Any]] = [("mean of all heads", None, "black")]  # name, row, colour
    colours = plt.get_cmap("tab10")
    lines += [(f"{head_label(*h)}", result.heads.index(h), colours(k))
              for k, h in enumerate(result.table.top("raw_share", top))]
    for name, row, colour in lines:
        for values, style, kind in ((result.raw, "-", "raw"), (result.weighted, "--", "value-weighted")):
            if values is None:
                continue
            y = np.nanmean(values[:, filled], 0) if row is None else values[row, filled]
            ax.plot(xs, y, style, color=colour, marker="o", markersize=3,
                    label=f"{name}, {kind}" if row is None or kind == "raw" else None)
    ax.set_xticks(xs, labels, rotation=45, fontsize="small")
    ax.set_xlabel("query position")
    ax.set_ylabel("share on the first position" if result.n_sink == 1
                  else f"share on the first {result.n_sink} positions")
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", ncols=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pct(x: float) -> str:
    return f"{x:.0%}"


def sink_sentences(vw: HeadTable, sinks: SinkResult, *, causal: bool) -> list[str]:
    """Sentences on where attention lands and what it carries, every number read from the results.

    Args:
        vw: ``ValueWeighted.result()``.
        sinks: ``SinkShare.result()`` over the same heads.
        causal: the model's attention is causal (how its first token is named).
    """
    mean = {name: float(np.nanmean(vw[name])) for name in vw.columns}
    first = "the first token (BOS or whatever comes first)" if causal else "the first token ([CLS])"
    out = [f"Averaged over the {len(vw)} heads, {_pct(mean['raw_first'])} of a query's attention weight lands on "
           f"{first} and {_pct(mean['raw_special'])} on the other special tokens; weighted by the norm of what each "
           f"token sends, ‖α f(x)‖ (Kobayashi et al. 2020), those shares are {_pct(mean['weighted_first'])} and "
           f"{_pct(mean['weighted_special'])}."]
    ratio = mean["norm_first"] / mean["norm_other"]
    if np.isfinite(ratio):
        size = f"{1 / ratio:.1f}× shorter" if ratio < 1 else f"{ratio:.1f}× longer"
        out.append(f"The difference is in the values: through each head's W_O, the first token's value vectors have "
                   f"a mean norm of {mean['norm_first']:.2f} against {mean['norm_other']:.2f} for ordinary tokens, "
                   f"{size}.")
    gap = vw["raw_sink"] - vw["weighted_sink"]
    row = int(np.nanargmax(gap)) if np.isfinite(gap).any() else None
    if row is not None:
        layer, head = vw.heads[row]
        out.append(f"Head {head_label(layer, head)} shows it most: {_pct(vw['raw_sink'][row])} of its attention goes "
                   f"to the first and special tokens, but they make up {_pct(vw['weighted_sink'][row])} of its "
                   "value-weighted attention.")
    table_ = sinks.table
    s = sinks.n_sink
    where = f"the first {s} positions" if s > 1 else "the first position"
    found = sinks.sink_heads()
    named = ", ".join(f"{head_label(*h)} ({_pct(table_.value('raw_share', *h))})" for h in found[:3])
    out.append(f"Counting {where} as sinks, {len(found)} of the {len(table_)} heads are sink heads, sending at least "
               f"half of each later query's attention there" + (f": most of all {named}." if found else "."))
    filled = [b for b in sinks.filled_bins() if sinks.edges[b] >= s]
    if len(filled) >= 2:
        labels = sinks.bin_labels()
        lo, hi = filled[0], filled[-1]
        raw = np.full(len(sinks.edges), np.nan)
        raw[filled] = np.nanmean(sinks.raw[:, filled], 0)
        sentence = (f"Averaged over heads, the raw share on the sinks is {_pct(raw[lo])} for queries at positions "
                    f"{labels[lo]} and {_pct(raw[hi])} at positions {labels[hi]}")
        if sinks.weighted is not None:
            weighted = np.full(len(sinks.edges), np.nan)
            weighted[filled] = np.nanmean(sinks.weighted[:, filled], 0)
            sentence += f" (value-weighted: {_pct(weighted[lo])} and {_pct(weighted[hi])})"
        growth = float(np.nanmean(table_["raw_growth"]))
        trend = "gains" if growth >= 0 else "loses"
        out.append(sentence + f"; the mean head {trend} {abs(growth) * 100:.1f} percentage points of it each time the "
                   "query's position doubles.")
    return out
