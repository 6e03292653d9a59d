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

A batch of (source, target) pairs is read view by view (``CaptureBatch.views``), each layer on its own
sides; the statistics that compare a query's and a key's positions in one text (``POSITIONAL``) are NaN
for cross-attention layers, whose queries and keys are positions of two texts.
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
    "FIXED_WHEN_CAUSAL", "POSITIONAL", "STATISTICS", "SurfaceStats", "head_statistics", "is_causal", "surface_stats",
]

# Statistic → the count it is averaged over ("queries": every real query; "positions": every real query of a layer
# whose keys are of the query's text; "prev"/"next": the queries that have a previous / next real token).
STATISTICS: dict[str, str] = {
    "to_cls": "queries",  # mass on the first position when it is a special token ([CLS], BOS)
    "to_sep": "queries",  # mass on every other special token ([SEP], EOS, ...)
    "to_punct": "queries",  # mass on punctuation pieces
    "to_self": "positions",  # p_ii
    "to_prev": "prev",  # p_i,i-1 where i-1 exists
    "to_next": "next",  # p_i,i+1 where i+1 exists
    "entropy": "queries",  # -Σ_j p_ij log p_ij, nats
    "uniform_entropy": "queries",  # log(allowed keys): the entropy of uniform attention over the row
    "distance": "positions",  # Σ_j p_ij |i - j|
    "confidence": "queries",  # max_j p_ij (Voita et al. 2019)
}
FIXED_WHEN_CAUSAL = ("to_next",)  # a causal query never sees the next token: 0 for every head
# The statistics that compare a query's and a key's positions in one text: NaN for cross-attention layers.
POSITIONAL = ("to_self", "to_prev", "to_next", "distance")


def head_statistics(*, causal: bool) -> tuple[str, ...]:
    """The statistics that can tell one head from another in a model of this kind: ``STATISTICS``
    less ``uniform_entropy`` (the same for every head: it depends on positions only) and, for a
    causal model, less ``FIXED_WHEN_CAUSAL``."""
    fixed = {"uniform_entropy", *(FIXED_WHEN_CAUSAL if causal else ())}
    return tuple(name for name in STATISTICS if name not in fixed)


class SurfaceStats(PerHeadMeans):
    """Accumulates ``STATISTICS`` per (layer, head) over capture batches (patterns needed, whole or as
    ``PatternRows``: ``headlab.capture.blocks``).

    Args:
        causal: the model is causal (query i sees keys 0..i): sets the uniform entropy to
            log(i + 1) instead of log(length). Every other statistic reads the patterns as they are.
    """

    READS_ROW_BLOCKS = True  # every statistic is a sum of row reductions over query rows

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch (its layers must carry patterns), view by view (``CaptureBatch.views``)."""
        for view in batch.views():
            self._update(view)

    def _update(self, batch: CaptureBatch) -> None:
        """Add one view: queries and keys of one text, or (``batch.cross``) cross-attention."""
        shared = reductions(batch)
        real = shared.real  # (batch, query_pos)
        one_text = not batch.cross
        has_prev = torch.zeros_like(real)
        has_next = torch.zeros_like(real)
        if one_text:  # the query's previous and next positions are real tokens of its text
            has_prev[:, 1:] = real[:, :-1] & real[:, 1:]
            has_next[:, :-1] = real[:, 1:] & real[:, :-1]
        weights = {"queries": real, "positions": real if one_text else torch.zeros_like(real), "prev": has_prev,
                   "next": has_next}
        counts = {name: w.sum() for name, w in weights.items()}  # left on the device until the sums are folded
        # The same for every head: the log of the keys each real query may see, summed once per batch.
        uniform_entropy = torch.where(real, self._uniform_entropy(real, shared.key_real, causal=self.causal
                                                                  and one_text), 0.0).sum()
        # the rows each statistic is summed over, (batch, 1, q)
        computed = [name for name in STATISTICS if name != "uniform_entropy" and (one_text or name not in POSITIONAL)]
        kept = {name: weights[STATISTICS[name]][:, None] for name in computed}
        for rows in shared.stacks:
            stats = {  # (layer, batch, head, q) each, in the patterns' dtype
                "to_cls": rows.mass("first_special"), "to_sep": rows.mass("other_special"),
                "to_punct": rows.mass("punctuation"), "entropy": rows.entropy, "confidence": rows.confidence,
            }
            if one_text:
                stats |= {"to_self": rows.diagonal(0), "to_prev": rows.diagonal(-1), "to_next": rows.diagonal(1),
                          "distance": rows.distance}
            totals = real_row_sums({name: stats[name] for name in computed}, kept)  # (layer, head) each
            for i, layer in enumerate(rows.layers):
                sums = {name: total[i] for name, total in totals.items()}
                sums |= {name: torch.zeros(len(rows.heads), dtype=torch.float64) for name in POSITIONAL
                         if name not in sums}  # cross-attention: counted over no query, NaN
                sums["uniform_entropy"] = uniform_entropy.expand(len(rows.heads))
                self._add(layer, rows.heads, sums, counts)

    @staticmethod
    def _uniform_entropy(real: Tensor, key_real: Tensor, *, causal: bool) -> Tensor:
        """``(batch, query_pos)`` float64: log of the keys each query may see (``i + 1`` when causal)."""
        lengths = key_real.sum(-1).double()  # (batch,)
        n_queries = real.shape[1]
        if causal:
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
