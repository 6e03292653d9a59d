"""Surface statistics of each head's attention (Clark et al. 2019, "What Does BERT Look At?").

Axis legend:
    patterns      (layer, batch, head, query_pos, key_pos)   a stack of layers' selected heads
    masks         (batch, pos)                               per key position
    row stats     (layer, batch, head, query_pos)            one number per attention row
    result        HeadTable                                  a row per captured (layer, head)

``SurfaceStats`` is an accumulator (``update`` / ``merge`` / ``result``) over capture batches:
it keeps float64 sums and counts per (layer, head), so memory grows with layers × heads only,
and merging two halves of a corpus gives the whole corpus's sums (up to float64 rounding).
Every statistic is a mean over real (non-padding) query tokens; see docs/analysis.md. The row
reductions come from ``headlab.analysis.reductions``, shared with the other accumulators of a batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from headlab.analysis.per_head import PerHeadMeans, real_row_sums
from headlab.analysis.reductions import reductions
from headlab.capture.batch import CaptureBatch
from headlab.capture.run import capture
from headlab.heads import HeadTable
from headlab.models import HeadedModel, headed

__all__ = [
    "FIXED_WHEN_CAUSAL", "STATISTICS", "SurfaceStats", "head_statistics", "is_causal", "surface_stats",
]

# Statistic → the count it is averaged over ("queries": every real query; "prev"/"next": the
# queries that have a previous / next real token).
STATISTICS: dict[str, str] = {
    "to_cls": "queries",  # mass on the first position when it is a special token ([CLS], BOS)
    "to_sep": "queries",  # mass on every other special token ([SEP], EOS, ...)
    "to_punct": "queries",  # mass on punctuation pieces
    "to_self": "queries",  # p_ii
    "to_prev": "prev",  # p_i,i-1 where i-1 exists
    "to_next": "next",  # p_i,i+1 where i+1 exists
    "entropy": "queries",  # -Σ_j p_ij log p_ij, nats
    "uniform_entropy": "queries",  # log(allowed keys): the entropy of uniform attention over the row
    "distance": "queries",  # Σ_j p_ij |i - j|
    "confidence": "queries",  # max_j p_ij (Voita et al. 2019)
}
FIXED_WHEN_CAUSAL = ("to_next",)  # a causal query never sees the next token: 0 for every head


def head_statistics(*, causal: bool) -> tuple[str, ...]:
    """The statistics that can tell one head from another in a model of this kind: ``STATISTICS``
    less ``uniform_entropy`` (the same for every head: it depends on positions only) and, for a
    causal model, less ``FIXED_WHEN_CAUSAL``."""
    fixed = {"uniform_entropy", *(FIXED_WHEN_CAUSAL if causal else ())}
    return tuple(name for name in STATISTICS if name not in fixed)


class SurfaceStats(PerHeadMeans):
    """Accumulates ``STATISTICS`` per (layer, head) over capture batches (patterns needed).

    Args:
        causal: the model is causal (query i sees keys 0..i): sets the uniform entropy to
            log(i + 1) instead of log(length). Every other statistic reads the patterns as they are.
    """

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch (its layers must carry patterns)."""
        shared = reductions(batch)
        real = shared.real  # (batch, pos)
        has_prev = torch.zeros_like(real)
        has_prev[:, 1:] = real[:, :-1] & real[:, 1:]
        has_next = torch.zeros_like(real)
        has_next[:, :-1] = real[:, 1:] & real[:, :-1]
        weights = {"queries": real, "prev": has_prev, "next": has_next}
        counts = {name: w.sum() for name, w in weights.items()}  # left on the device until the sums are folded
        # The same for every head: the log of the keys each real query may see, summed once per batch.
        uniform_entropy = torch.where(real, self._uniform_entropy(real), 0.0).sum()
        # the rows each statistic is summed over, (batch, 1, q)
        kept = {name: weights[count][:, None] for name, count in STATISTICS.items() if name != "uniform_entropy"}
        for rows in shared.stacks:
            stats = {  # (layer, batch, head, q) each, in the patterns' dtype
                "to_cls": rows.mass("first_special"), "to_sep": rows.mass("other_special"),
                "to_punct": rows.mass("punctuation"), "to_self": rows.diagonal(0), "to_prev": rows.diagonal(-1),
                "to_next": rows.diagonal(1), "entropy": rows.entropy, "distance": rows.distance,
                "confidence": rows.confidence,
            }
            totals = real_row_sums(stats, kept)  # (layer, head) each
            for i, layer in enumerate(rows.layers):
                sums = {name: total[i] for name, total in totals.items()}
                sums["uniform_entropy"] = uniform_entropy.expand(len(rows.heads))
                self._add(layer, rows.heads, sums, counts)

    def _uniform_entropy(self, real: Tensor) -> Tensor:
        """``(batch, query_pos)`` float64: log of the keys each query may see (``i + 1`` when causal)."""
        lengths = real.sum(-1).double()  # (batch,)
        n_queries = real.shape[1]
        if self.causal:
            queries = torch.arange(n_queries, device=real.device)
            allowed = (queries.double() + 1)[None, :].minimum(lengths[:, None])  # (batch, q)
        else:
            allowed = lengths[:, None].expand(len(real), n_queries)
        return allowed.clamp(min=1).log()

    def result(self) -> HeadTable:
        """The means: a row per captured head, the columns ``n_queries`` (real query tokens averaged
        over) and every name in ``STATISTICS`` (float64; NaN where a statistic's count stayed 0).

        Raises:
            ValueError: nothing was accumulated.
        """
        return self._table(STATISTICS, count_columns={"n_queries": "queries"})


def is_causal(model: HeadedModel | nn.Module) -> bool:
    """Whether the model's attention is causal (any layer), for ``causal=`` of the accumulators."""
    return any(site.causal for site in headed(model).sites)


def surface_stats(model: HeadedModel | nn.Module, corpus: Any = None, *, causal: bool | None = None,
                  **capture_options: Any) -> HeadTable:
    """Run a capture with a ``SurfaceStats`` and return its result (``SurfaceStats.result``).

    Args:
        model: a ``HeadedModel`` with a tokenizer (or an attached model whose handle has one).
        corpus: as ``capture`` takes it; None for the bundled corpus.
        causal: None reads it from the model's attention layers.
        capture_options: passed to ``capture`` (heads, batch_tokens, progress, ...).
    """
    accumulator = SurfaceStats(causal=is_causal(model) if causal is None else causal)
    capture(model, corpus=corpus, take=("pattern",), consumers=[accumulator], **capture_options)
    return accumulator.result()
