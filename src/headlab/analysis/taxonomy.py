"""Kovaleva et al. 2019 ("Revealing the Dark Secrets of BERT") pattern classes, by computable rules.

Axis legend:
    patterns      (batch, head, query_pos, key_pos)
    masks         (batch, pos)
    result        HeadTable                   a row per captured (layer, head)

The paper sorted heads into five classes by eye (a CNN trained on 400 hand labels). Here each
class is a threshold rule on per-head averages that ``TaxonomyStats`` accumulates (float64 sums
and counts, mergeable like every headlab accumulator):

    special       mass on special tokens ([CLS], [SEP], BOS, EOS)
    top_columns   per item, the share of the TOP_COLUMNS heaviest key columns in the item's
                  total attention (a "vertical" stripe need not sit on a special token)
    band          mass on keys i−1, i, i+1 (the "diagonal")
    block         mass on keys of the query's own segment, the band and special tokens excluded,
                  over items with two or more segments (see ``headlab.analysis.reductions.segments``)
    block_uniform the same for uniform attention: the chance level ``block`` is judged against

``classify`` applies the rules in docs/analysis.md. The classes read a text's diagonal and segments, so
cross-attention layers (a batch of pairs: queries of the target over the source's keys) have none: each
view of self-attention (``CaptureBatch.views``) is read, the cross-attention view skipped.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from headlab.analysis.per_head import PerHeadMeans, real_row_sums
from headlab.analysis.reductions import BatchReductions, StackReductions, reductions
from headlab.analysis.surface import is_causal
from headlab.capture.batch import CaptureBatch
from headlab.capture.run import capture
from headlab.heads import HeadTable
from headlab.models import HeadedModel

__all__ = [
    "BLOCK", "BLOCK_OVER_UNIFORM", "CLASSES", "DIAGONAL", "MIXED", "TOP_COLUMNS", "VERTICAL",
    "TaxonomyStats", "class_shares", "classify", "classify_head", "taxonomy_stats",
]

CLASSES = ("vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous")
TOP_COLUMNS = 2  # key columns that make a vertical stripe
VERTICAL = 0.5  # max(special, top_columns) ≥ this: vertical
DIAGONAL = 0.5  # band ≥ this: diagonal
MIXED = (0.25, 0.6)  # both scores ≥ 0.25 and their sum ≥ 0.6: vertical+diagonal
BLOCK = 0.5  # block ≥ this ...
BLOCK_OVER_UNIFORM = 1.5  # ... and ≥ this × block_uniform: block
_STATS = ("special", "band", "block", "block_uniform", "top_columns")
_COUNT_OF = {"special": "queries", "band": "queries", "block": "block_queries", "block_uniform": "block_queries",
             "top_columns": "items"}


def _block_uniform(shared: BatchReductions, *, causal: bool) -> Tensor:
    """``(batch, 1, q)`` float64: ``block`` for uniform attention over the keys each query may see."""
    real, content, segment = shared.real, shared.content, shared.segment
    n_pos = real.shape[1]
    positions = torch.arange(n_pos, device=real.device)
    offset = positions[:, None] - positions[None, :]  # i − j
    block_keys = (segment[:, :, None] == segment[:, None, :]) & (offset.abs() > 1) & content[:, None, :]
    allowed = ((offset >= 0)[None] if causal else True) & real[:, None, :]
    return ((block_keys & allowed).sum(-1) / allowed.sum(-1).clamp(min=1))[:, None, :].double()


def _near(shared: BatchReductions) -> dict[int, Tensor]:
    """``{o: (batch, q) bool}`` for o in −1, 0, 1: key i + o exists, is content and is in the query's
    segment — the band keys that ``block`` excludes but the segment mass includes."""
    content, segment = shared.content, shared.segment
    n_pos = segment.shape[1]
    near = {}
    for o in (-1, 0, 1):
        keys = torch.arange(n_pos, device=segment.device) + o
        inside = (keys >= 0) & (keys < n_pos)
        k = keys.clamp(0, n_pos - 1)
        near[o] = inside[None, :] & content[:, k] & (segment[:, k] == segment)
    return near


def _item_statistics(rows: StackReductions, near: dict[int, Tensor], block_uniform: Tensor) -> dict[str, Tensor]:
    """Row statistics ``(layer, batch, head, q)`` and, for ``top_columns``, item statistics ``(layer, batch,
    head)``, float64, from the stack's shared reductions."""
    shape = rows.shape  # (layer, batch, head, q, k)
    if shape[-1] != shape[-2]:
        raise ValueError(f"taxonomy needs self-attention patterns (query_pos == key_pos), got shape {shape[1:]}")
    segment = rows.keys.segment.to(rows.device)
    own = segment[:, None, :, None].expand(*shape[:-1], 1)
    in_segment = rows.segment_masses.gather(-1, own).squeeze(-1).double()  # (layer, batch, head, q)
    diagonals = {o: rows.diagonal(o).double() for o in (-1, 0, 1)}
    block = in_segment - sum(diagonals[o] * near[o][:, None, :] for o in (-1, 0, 1))
    n_real = rows.keys.real.to(rows.dtype).sum(-1)[:, None, None].clamp(min=1)
    columns = rows.key_sums / n_real  # (layer, batch, head, k)
    return {
        "special": rows.mass("special").double(),
        "band": sum(diagonals.values()),
        "block": block,
        "block_uniform": block_uniform.expand(shape[:-1]),
        "top_columns": columns.topk(min(TOP_COLUMNS, shape[-1]), dim=-1).values.sum(-1).double(),  # (l, b, h)
    }


class TaxonomyStats(PerHeadMeans):
    """Accumulates the taxonomy statistics per (layer, head) over capture batches (patterns needed).

    Args:
        causal: query i sees keys 0..i (only ``block_uniform`` depends on it).
    """

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch (its layers must carry patterns), each view of self-attention (``CaptureBatch.views``)."""
        for view in batch.views():
            if view.keys is None:
                self._update(view)

    def _update(self, batch: CaptureBatch) -> None:
        shared = reductions(batch)
        real = shared.real
        block_rows = real & ~shared.special & (shared.n_content >= 2)[:, None]
        weights = {"queries": real, "block_queries": block_rows}
        counts = {"queries": real.sum(), "block_queries": block_rows.sum(), "items": len(batch)}
        # the rows each per-row statistic is summed over, (batch, 1, q)
        kept = {name: weights[count][:, None] for name, count in _COUNT_OF.items() if count != "items"}
        near = block_uniform = None
        for rows in shared.stacks:
            if near is None or block_uniform is None:  # once per batch, shared by every layer
                near, block_uniform = _near(shared), _block_uniform(shared, causal=self.causal)
            stats = _item_statistics(rows, near, block_uniform)
            totals = real_row_sums({name: stats[name] for name in kept}, kept)  # (layer, head) each
            totals |= {name: stats[name].sum(1) for name, count in _COUNT_OF.items() if count == "items"}
            for i, layer in enumerate(rows.layers):
                self._add(layer, rows.heads, {name: total[i] for name, total in totals.items()}, counts)

    def result(self) -> HeadTable:
        """The means: a row per captured head, a float64 column per taxonomy statistic (``special``,
        ``band``, ``block``, ``block_uniform``, ``top_columns``); ``block`` and ``block_uniform`` are NaN
        when no item had two content segments.

        Raises:
            ValueError: nothing was accumulated.
        """
        return self._table({name: _COUNT_OF[name] for name in _STATS})


def classify_head(result: HeadTable, layer: int, head: int) -> str:
    """The class of one head of a ``TaxonomyStats`` result, by the first rule that holds (docs/analysis.md).

    Raises:
        KeyError: the head is not in ``result``.
    """
    vertical = max(result.value("special", layer, head), result.value("top_columns", layer, head))
    diagonal = result.value("band", layer, head)
    block, chance = result.value("block", layer, head), result.value("block_uniform", layer, head)
    low, total = MIXED
    if vertical >= low and diagonal >= low and vertical + diagonal >= total:
        return "vertical+diagonal"
    if vertical >= VERTICAL:
        return "vertical"
    if diagonal >= DIAGONAL:
        return "diagonal"
    if not math.isnan(block) and block >= BLOCK and block >= BLOCK_OVER_UNIFORM * chance:
        return "block"
    return "heterogeneous"


def classify(result: HeadTable) -> dict[tuple[int, int], str]:
    """``{(layer, head): class}`` for every head of a ``TaxonomyStats`` result; classes from ``CLASSES``."""
    return {(layer, head): classify_head(result, layer, head) for layer, head in result.heads}


def class_shares(classes: dict[tuple[int, int], str]) -> dict[str, float]:
    """The share of heads in each of ``CLASSES`` (all five keys; 0.0 for an empty class)."""
    n = max(len(classes), 1)
    return {name: sum(c == name for c in classes.values()) / n for name in CLASSES}


def taxonomy_stats(model: HeadedModel | nn.Module, corpus: Any = None, *, causal: bool | None = None,
                   **capture_options: Any) -> HeadTable:
    """Run a capture with a ``TaxonomyStats`` and return its result (arguments as ``surface_stats``)."""
    accumulator = TaxonomyStats(causal=is_causal(model) if causal is None else causal)
    capture(model, corpus=corpus, take=("pattern",), consumers=[accumulator], **capture_options)
    return accumulator.result()
