"""What each head of a vision transformer does on images: how far across the patch grid it looks, how much it sends
to [CLS] and the registers, how spread its attention is (Dosovitskiy et al. 2020, Fig. 7: mean attention distance;
Darcet et al. 2024, "Vision Transformers Need Registers": the special tokens as sinks).

Axis legend:
    pattern    (batch, head, query_pos, key_pos)   one layer's captured heads on a batch of images
    rows       (batch, head, patch)                 one number per patch query row
    grid       rows × columns patches after ``n_special`` leading special tokens (``headlab.models.images``)
    result     HeadTable                            a row per captured (layer, head)

Every statistic is a mean over the patch queries of every image (the special tokens' own rows are left out: they
have no place on the grid). A windowed model (Swin) runs each stage on its own grid (``PatchGrid.of``): a layer's
statistics are on its grid, and its distances in first-stage patches (a later stage's patch spans ``stride`` of
them), so that heads of every stage are measured in one unit. ``PatchStats`` is an accumulator (``update`` /
``merge`` / ``result``) over the batches of ``headlab.capture.images.capture_images``, float64 sums per (layer, head)
as ``SurfaceStats`` keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from headlab.analysis.per_head import HeadSums
from headlab.analysis.roles import BROAD, SINK
from headlab.analysis.sentences import pruning_sentence
from headlab.capture.batch import CaptureBatch
from headlab.heads import HeadTable, head_label
from headlab.models.images import PatchGrid

if TYPE_CHECKING:
    from headlab.analysis.importance import PruningCurve

__all__ = ["LOCAL", "PATCH_STATISTICS", "PatchStats", "image_statistics", "patch_roles", "patch_sentences",
           "uniform_distance"]

# Statistic → what its sum is averaged over ("patches": every patch query row; "attending": the rows with any
# attention on patches, where a distance among patches exists).
PATCH_STATISTICS: dict[str, str] = {
    "entropy": "patches",  # -Σ_j p_ij log p_ij over every key, nats
    "uniform_entropy": "patches",  # log(positions): uniform attention's entropy (on the layer's grid)
    "patch_distance": "attending",  # Σ_{j patch} p_ij d(i, j) / Σ_{j patch} p_ij, in (first-stage) patches, Euclidean
    "to_cls": "patches",  # mass on the first special token ([CLS]); absent from a model without special tokens
    "to_special": "patches",  # mass on every leading special token ([CLS], [DIST], registers): the sink share
    "to_self": "patches",  # p_ii
    "confidence": "patches",  # max_j p_ij
}
LOCAL = 0.5  # patch_distance ≤ this × attention spread evenly's (uniform_distance): a local head


class PatchStats(HeadSums):
    """Accumulates ``PATCH_STATISTICS`` per (layer, head) over image capture batches (patterns needed).

    Args:
        grid: the model's patch grid on these images (``headlab.capture.images.capture_images`` returns it).
    """

    def __init__(self, *, grid: PatchGrid) -> None:
        super().__init__()
        self.grid = grid
        self._distances: dict[tuple[PatchGrid, torch.device, torch.dtype], torch.Tensor] = {}

    def _settings(self) -> tuple[Any, ...]:
        return (self.grid,)

    def _grid_distances(self, grid: PatchGrid, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``(patch, patch)``: ``grid``'s distances, in the patterns' device and dtype (made once per triple)."""
        key = (grid, device, dtype)
        if key not in self._distances:
            self._distances[key] = grid.distances().to(device=device, dtype=dtype)
        return self._distances[key]

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch (its layers must carry patterns over their grid's positions, ``PatchGrid.of``).

        Raises:
            ValueError: a layer captured without patterns, or patterns over another number of positions.
        """
        for layer, taken in batch.layers.items():
            grid = self.grid.of(layer)
            s, n = grid.n_special, grid.n_positions
            pattern = taken.pattern
            if pattern is None:
                raise ValueError(f"layer {layer} was captured without patterns; capture with take=('pattern',)")
            if tuple(pattern.shape[-2:]) != (n, n):
                raise ValueError(f"layer {layer}'s patterns are over {tuple(pattern.shape[-2:])} positions; the grid "
                                 f"has {n} ({s} special tokens, {grid.rows}×{grid.columns} patches)")
            rows = pattern[:, :, s:, :]  # (batch, head, patch, key): the patch queries
            on_patches = rows[..., s:]
            mass = on_patches.sum(-1)
            weighted = (on_patches * self._grid_distances(grid, rows.device, rows.dtype)).sum(-1)
            attending = mass > 0
            stats = {
                "entropy": -torch.special.xlogy(rows, rows).sum(-1),
                "patch_distance": torch.where(attending, weighted / mass.clamp_min(1e-30), 0.0),
                "to_cls": rows[..., 0] if s else torch.zeros_like(mass),
                "to_special": rows[..., :s].sum(-1),
                "to_self": torch.diagonal(on_patches, dim1=-2, dim2=-1),
                "confidence": rows.amax(-1),
            }
            sums = {name: value.sum((0, 2), dtype=torch.float64) for name, value in stats.items()}
            sums["uniform_entropy"] = torch.full_like(sums["entropy"], math.log(n) * rows.shape[0] * rows.shape[2])
            counts = {"patches": rows.shape[0] * rows.shape[2], "attending": attending.sum((0, 2), dtype=torch.float64)}
            self._add(layer, taken.heads, sums, counts)

    def _mean_columns(self) -> dict[str, str]:
        """The statistics this grid has: ``to_cls`` and ``to_special`` only with special tokens."""
        return {name: count for name, count in PATCH_STATISTICS.items()
                if self.grid.n_special or name not in ("to_cls", "to_special")}

    def result(self) -> HeadTable:
        """The means: a row per captured head, the columns ``n_queries`` (patch query rows averaged over) and every
        statistic of ``PATCH_STATISTICS`` the grid has (float64; NaN where a head never attended to a patch).

        Raises:
            ValueError: nothing was accumulated.
        """
        columns = self._mean_columns()
        heads: list[tuple[int, int]] = []
        values: dict[str, list[torch.Tensor]] = {name: [] for name in ("n_queries", *columns)}
        for layer, head, i in self._order():
            heads.append((layer, head))
            values["n_queries"].append(torch.tensor(float(self.counts[layer]["patches"]), dtype=torch.float64))
            for name, count in columns.items():
                values[name].append(self._mean(layer, name, count)[i] if count == "attending" else
                                    self.sums[layer][name][i] / max(self.counts[layer][count], 1))
        return HeadTable(heads, {name: torch.stack(parts).numpy() for name, parts in values.items()})


def patch_roles(table: HeadTable, grid: PatchGrid) -> dict[tuple[int, int], tuple[str, ...]]:
    """``{(layer, head): labels}`` of a ``PatchStats`` result on ``grid``, in a fixed order (possibly none): ``sink``
    (over ``SINK`` of its attention on the special tokens), ``broad`` (entropy ≥ ``BROAD`` × uniform attention's),
    ``local`` (``patch_distance`` ≤ ``LOCAL`` × ``uniform_distance`` of the head's layer's grid, ``PatchGrid.of``)."""
    out = {}
    for layer, head in table.heads:
        near = LOCAL * uniform_distance(grid.of(layer))
        labels = []
        if "to_special" in table.columns and table.value("to_special", layer, head) > SINK:
            labels.append("sink")
        if table.value("entropy", layer, head) >= BROAD * table.value("uniform_entropy", layer, head):
            labels.append("broad")
        if table.value("patch_distance", layer, head) <= near:
            labels.append("local")
        out[(layer, head)] = tuple(labels)
    return out


def image_statistics(table: HeadTable) -> tuple[str, ...]:
    """The statistics of a ``PatchStats`` result that tell heads apart (its heatmaps' columns): every one of
    ``PATCH_STATISTICS`` it has but ``uniform_entropy``, the same for every head."""
    return tuple(name for name in PATCH_STATISTICS if name in table.columns and name != "uniform_entropy")


def uniform_distance(grid: PatchGrid) -> float:
    """The ``patch_distance`` of attention spread evenly over every patch, averaged over the query patches: the mean
    distance between two patches of the grid (a query and itself included), in (first-stage) patches."""
    return float(grid.distances().mean())


def patch_sentences(table: HeadTable, roles: Mapping[tuple[int, int], tuple[str, ...]], grid: PatchGrid,
                    pruning: Mapping[str, PruningCurve]) -> list[str]:
    """A few sentences about what the heads do on images, every number taken from ``table`` and ``grid``.

    Args:
        table: ``PatchStats``' result.
        roles: ``patch_roles`` of it.
        grid: the patch grid the images made.
        pruning: ``{metric name: curve}`` (one sentence each, ``headlab.analysis.sentences.pruning_sentence``).

    Returns:
        The roles counted, the most local and most global heads against uniform attention, the sink share, then
        one sentence per pruning curve.
    """
    def count(role: str) -> int:
        return sum(role in labels for labels in roles.values())

    uniform = uniform_distance(grid)
    if grid.layers:
        sizes = " to ".join(dict.fromkeys(f"{g.rows}×{g.columns}" for g in grid.layers))
        where = (f"on windowed patch grids from {sizes} (one per stage; distances in first-stage patches of "
                 f"{grid.patch_size[0]}×{grid.patch_size[1]} pixels: a later stage's patch is larger)")
    else:
        where = f"on a {grid.rows}×{grid.columns} patch grid"
    sinks = f" and {count('sink')} special-token sinks (over half their attention on [CLS] and the registers)" \
        if grid.n_special else ""
    out = [f"Of the {len(table)} heads analysed {where}, {count('local')} are local (mean distance attended ≤ "
           f"{LOCAL * uniform:.2f} patches, {LOCAL:.0%} of even attention's), {count('broad')} broad{sinks}."]
    near, far = table.top("patch_distance", 1, largest=False)[0], table.top("patch_distance", 1)[0]
    out.append(f"Head {head_label(*near)} looks nearest ({table.value('patch_distance', *near):.2f} patches on "
               f"average) and head {head_label(*far)} farthest ({table.value('patch_distance', *far):.2f}), where "
               f"attention spread evenly over the patches would give {uniform:.2f}; the mean head's "
               f"entropy is {np.nanmean(table['entropy']):.2f} nats.")
    if "to_special" in table.columns:
        top = table.top("to_special", 1)[0]
        out.append(f"The special tokens ({', '.join(grid.special)}) receive {np.nanmean(table['to_special']):.0%} of "
                   f"the mean head's attention from the patches, and {table.value('to_special', *top):.0%} of head "
                   f"{head_label(*top)}'s.")
    return out + [pruning_sentence(metric, curve) for metric, curve in pruning.items()]
