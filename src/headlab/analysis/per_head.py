"""The shared machinery of accumulators that average statistics per (layer, head).

Sums are float64 per statistic, counts per normaliser (tokens, items, ...), both per layer;
merging adds them, so a corpus split across processes merges exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor


class PerHeadMeans:
    """Base of ``SurfaceStats`` and ``TaxonomyStats``: sums, counts, merge and the means.

    Args:
        causal: the model is causal; accumulators of different causality do not merge.
    """

    def __init__(self, *, causal: bool = False) -> None:
        self.causal = causal
        self.sums: dict[int, dict[str, Tensor]] = {}  # layer → statistic → (heads,) float64
        self.counts: dict[int, dict[str, int]] = {}  # layer → normaliser → count
        self.heads: dict[int, tuple[int, ...]] = {}

    def merge(self, other: PerHeadMeans) -> PerHeadMeans:
        """Fold another accumulator's sums into this one (e.g. from another process); returns self."""
        if type(other) is not type(self) or other.causal != self.causal:
            raise ValueError(f"cannot merge {type(other).__name__}(causal={other.causal}) into "
                             f"{type(self).__name__}(causal={self.causal})")
        for layer in other.sums:
            self._add(layer, other.heads[layer], other.sums[layer], other.counts[layer])
        return self

    def _add(self, layer: int, heads: tuple[int, ...], sums: Mapping[str, Tensor], counts: Mapping[str, int]) -> None:
        if layer in self.heads and self.heads[layer] != tuple(heads):
            raise ValueError(f"layer {layer}: heads {tuple(heads)} differ from the accumulated {self.heads[layer]}")
        self.heads[layer] = tuple(heads)
        held = self.sums.setdefault(layer, {})
        for name, total in sums.items():
            held[name] = held.get(name, 0) + total.double().cpu()
        held_counts = self.counts.setdefault(layer, {})
        for name, n in counts.items():
            held_counts[name] = held_counts.get(name, 0) + n

    def _means(self, count_of: Mapping[str, str]) -> tuple[tuple[int, ...], tuple[int, ...], dict[str, Tensor]]:
        """``(layers, heads, {statistic: (n_layers, n_heads) mean})``; NaN where a head was not captured
        or a statistic's normaliser stayed 0.

        Raises:
            ValueError: nothing was accumulated.
        """
        if not self.sums:
            raise ValueError(f"{type(self).__name__} has no data: update it with at least one capture batch")
        layers = tuple(sorted(self.sums))
        heads = tuple(sorted({h for hs in self.heads.values() for h in hs}))
        means = {name: torch.full((len(layers), len(heads)), math.nan, dtype=torch.float64) for name in count_of}
        for i, layer in enumerate(layers):
            columns = [heads.index(h) for h in self.heads[layer]]
            for name, count in count_of.items():
                n = self.counts[layer][count]
                if n:
                    means[name][i, columns] = self.sums[layer][name] / n
        return layers, heads, means


def grid_index(layers: tuple[int, ...], heads: tuple[int, ...], layer: int, head: int) -> tuple[int, int]:
    """The (row, column) of ``(layer, head)`` in a result's (n_layers, n_heads) tensors.

    Raises:
        KeyError: the head was not captured.
    """
    if layer not in layers or head not in heads:
        raise KeyError(f"(layer {layer}, head {head}) is not in layers {layers} × heads {heads}")
    return layers.index(layer), heads.index(head)
