"""The shared state of accumulators that average statistics per (layer, head): ``HeadSums``, and
``PerHeadMeans`` for those whose counts are per layer.

Sums are float64 per statistic, counts per normaliser (tokens, items, ...), both per layer;
merging adds them, so a corpus split across processes merges exactly. The result is a
``headlab.heads.HeadTable`` with a row per captured head.

A batch's sums stay where they were computed (on the GPU, as the kernels that make them are still
running) until ``FOLD_EVERY`` batches of a layer are held or the sums are read: then each statistic's
held batches are stacked and added in one go and moved to the CPU. Adding every batch on arrival would
cost a copy to the CPU, a wait for the GPU and a few small ops per statistic, layer and batch, which on a
GPU took longer than the reductions themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from headlab.analysis.reductions import launch_bound
from headlab.heads import HeadTable

if TYPE_CHECKING:
    from typing_extensions import Self

FOLD_EVERY = 64  # batches of a layer held on their device before their sums are folded into the totals


def real_row_sums(values: Mapping[str, Tensor], rows: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``{name: (layer, head) float64}``: each statistic ``values[name]`` ``(layer, batch, head, query_pos)``
    summed over the rows ``rows[name]`` ``(batch, 1, query_pos)`` bool selects (where, not a product: padded query
    rows may hold anything, NaN included).

    Every statistic has the same dtype. On a CPU each is summed on its own (2–3× faster than stacking them first);
    where ops cost their launch (``launch_bound``), they are stacked and summed with three launches in all.
    """
    first = next(iter(values.values()))
    if not launch_bound(first.device):
        return {name: torch.where(rows[name], value, 0.0).sum((1, 3), dtype=torch.float64)
                for name, value in values.items()}
    names = list(values)
    kept = torch.stack([rows[name] for name in names], -1)  # (batch, 1, query_pos, stat)
    stacked = torch.stack([values[name] for name in names], -1)  # (layer, batch, head, query_pos, stat)
    return dict(zip(names, torch.where(kept, stacked, 0.0).sum((1, 3), dtype=torch.float64).unbind(-1)))


class HeadSums:
    """Float64 sums and counts per (layer, head), merged by adding: the state of the per-head accumulators.

    Subclasses add with ``_add(layer, heads, sums, counts)``, every sum ``(len(heads), ...)``, every count
    a number or ``(len(heads), ...)`` (a statistic may be undefined on some heads' rows), tensors on any
    device and in any dtype (held as they are until folded, so never a view of memory reused later), and
    read means with ``_mean`` or ``PerHeadMeans._table``.
    """

    def __init__(self) -> None:
        self._sums: dict[int, dict[str, Tensor]] = {}  # layer → name → (heads, ...) float64, on the CPU
        self._counts: dict[int, dict[str, Any]] = {}  # layer → name → a count, or (heads, ...) float64
        # layer → each batch's (sums, counts) not folded in yet, on the device that made them
        self._held: dict[int, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
        self.heads: dict[int, tuple[int, ...]] = {}

    @property
    def sums(self) -> dict[int, dict[str, Tensor]]:
        """``{layer: {name: (heads, ...) float64}}`` on the CPU, every batch added so far."""
        self._fold()
        return self._sums

    @property
    def counts(self) -> dict[int, dict[str, Any]]:
        """``{layer: {name: count}}``, a number or ``(heads, ...)`` float64 (CPU), every batch added so far."""
        self._fold()
        return self._counts

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with every held batch folded in (nothing left on a GPU)."""
        self._fold()
        return self.__dict__.copy()

    def _settings(self) -> tuple[Any, ...]:
        """What two accumulators must share to merge."""
        return ()

    def merge(self, other: Self) -> Self:
        """Fold another accumulator's sums into this one (e.g. from another process); returns self.

        Raises:
            ValueError: another type or other settings, or other heads in a layer.
        """
        if type(other) is not type(self) or other._settings() != self._settings():
            raise ValueError(f"cannot merge {type(other).__name__}{other._settings()} into "
                             f"{type(self).__name__}{self._settings()}; expected the same type and settings")
        self._fold()  # what this one holds may sit on another device than other's totals
        for layer in other.sums:
            self._add(layer, other.heads[layer], other.sums[layer], other.counts[layer])
        self._fold()
        return self

    def _add(self, layer: int, heads: tuple[int, ...], sums: Mapping[str, Tensor], counts: Mapping[str, Any]) -> None:
        if layer in self.heads and self.heads[layer] != tuple(heads):
            raise ValueError(f"layer {layer}: heads {tuple(heads)} differ from the accumulated {self.heads[layer]}")
        self.heads[layer] = tuple(heads)
        held = self._held.setdefault(layer, [])
        held.append((sums, counts))
        if len(held) >= FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Add the held batches into the totals: per statistic, the batches' values stacked and summed at once."""
        for layer, held in self._held.items():
            for store, parts in ((self._sums, [s for s, _ in held]), (self._counts, [c for _, c in held])):
                totals = store.setdefault(layer, {})
                for name in dict.fromkeys(name for part in parts for name in part):
                    values = [part[name] for part in parts if name in part]
                    tensors = [v.detach() for v in values if isinstance(v, Tensor)]
                    total = sum(v for v in values if not isinstance(v, Tensor))
                    if tensors:
                        total = total + torch.stack(tensors).double().sum(0).cpu()
                    totals[name] = totals.get(name, 0) + total
        self._held.clear()

    def _order(self) -> list[tuple[int, int, int]]:
        """``(layer, head, index in the layer's arrays)`` in layer then head order.

        Raises:
            ValueError: nothing was accumulated.
        """
        if not self.sums:
            raise ValueError(f"{type(self).__name__} has no data: update it with at least one capture batch")
        return [(layer, head, i) for layer in sorted(self.heads)
                for i, head in sorted(enumerate(self.heads[layer]), key=lambda t: t[1])]

    def _mean(self, layer: int, name: str, count: str) -> Tensor:
        """``sums[name] / counts[count]`` of one layer (counts per head), NaN where the count is 0."""
        total, n = self.sums[layer][name], self.counts[layer][count]
        return torch.where(n > 0, total / n.clamp_min(1.0), math.nan)


class PerHeadMeans(HeadSums):
    """Base of ``SurfaceStats`` and ``TaxonomyStats``: counts per layer, means as a ``HeadTable``.

    Args:
        causal: the model is causal; accumulators of different causality do not merge.
    """

    def __init__(self, *, causal: bool = False) -> None:
        super().__init__()
        self.causal = causal

    def _settings(self) -> tuple[Any, ...]:
        return (self.causal,)

    def _table(self, count_of: Mapping[str, str], *, count_columns: Mapping[str, str] | None = None) -> HeadTable:
        """One row per captured head, layer then head order.

        Args:
            count_of: statistic → the normaliser its sum is divided by (NaN where that count is 0).
            count_columns: column → a normaliser written as it is (e.g. ``n_queries``), placed first.

        Raises:
            ValueError: nothing was accumulated.
        """
        if not self.sums:
            raise ValueError(f"{type(self).__name__} has no data: update it with at least one capture batch")
        heads: list[tuple[int, int]] = []
        columns: dict[str, list[Tensor]] = {name: [] for name in [*(count_columns or {}), *count_of]}
        for layer in sorted(self.sums):
            captured = self.heads[layer]
            order = sorted(range(len(captured)), key=captured.__getitem__)
            heads += [(layer, captured[i]) for i in order]
            for name, count in (count_columns or {}).items():
                columns[name].append(torch.full((len(order),), float(self.counts[layer][count]), dtype=torch.float64))
            for name, count in count_of.items():
                n = self.counts[layer][count]
                mean = self.sums[layer][name] / n if n else torch.full((len(order),), math.nan, dtype=torch.float64)
                columns[name].append(mean[order])
        return HeadTable(heads, {name: torch.cat(parts).numpy() for name, parts in columns.items()})
