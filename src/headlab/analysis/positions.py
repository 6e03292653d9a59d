"""Where and what to patch: the positions, the head tensor taken, and the (head × position) result.

``activation_patching`` and ``attribution_patching`` (``headlab.analysis.patching``) patch one *unit*
at a time: a head's tensor ``take`` at some positions.

    take      patched                                             through
    z         the head's weighted sum of values, at query positions   ``site.replacement`` / ``site.delta``
    q         its query, at query positions                      ``site.input_replacements["q"]``
    k, v      its key/value head's key or value, at key positions ``site.input_replacements["k" | "v"]``
    pattern   its attention weights, at query positions: there z ← source pattern @ this run's v

``k`` and ``v`` are per key/value head: with grouped-query attention a query head's k is its group's, so
a unit is a key/value head, patched for every query head of its group at once (rows are then
``(layer, kv head)``; with one key/value head per query head the two coincide).

``prepare`` checks the options and inputs and runs the source once (``PatchRuns``); ``replace`` and
``zero_delta`` set a unit's values or additive zero on its site; ``estimates`` sums AtP's products over
the positions asked; ``PositionGrid`` is the (head × position) result, ``plot_positions`` its figure.

Axis legend: z ``(batch, head, query_pos, d_head_v)``; q ``(batch, head, query_pos, d_head)``;
k, v ``(batch, kv_head, key_pos, d)``; pattern ``(batch, head, query_pos, key_pos)``;
a grid ``(row, position)``.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from headlab import display
from headlab.capture.cache import Cache, run_with_cache
from headlab.heads import HeadTable, head_label
from headlab.heads.selection import HeadSelection
from headlab.layer.gates import Replacement
from headlab.models import AttentionSite, HeadedModel
from headlab.models.handle import Inputs

__all__ = ["DIRECTIONS", "TAKES", "PatchRuns", "PositionGrid", "Unit", "plot_positions", "prepare", "save_effects"]

TAKES = ("z", "q", "k", "v", "pattern")  # the head tensors a patch can replace
DIRECTIONS = ("denoise", "noise")  # the corrupted run receives clean values, or the clean run corrupted ones
EACH = "each"
Where = list[int] | str | None  # positions patched together, "each" (one at a time), or None (every position)
SHOWN_ROWS = 12  # rows of a grid a notebook shows (largest |effect| first)


def row_label(layer: int, head: int, take: str) -> str:
    """``L1 H2`` (a query head), or ``L1 KV2`` (a key/value head: k and v)."""
    return f"L{layer} KV{head}" if take in ("k", "v") else head_label(layer, head)


def check_choices(take: object, direction: object) -> None:
    """Raise unless ``take`` is one of ``TAKES`` and ``direction`` one of ``DIRECTIONS``.

    Raises:
        ValueError: naming the value and the choices.
    """
    if take not in TAKES:
        raise ValueError(f"take={take!r}; expected one of {', '.join(map(repr, TAKES))}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r}; expected 'denoise' (the corrupted run receives the clean "
                         "values) or 'noise' (the clean run receives the corrupted values)")


def check_where(positions: object) -> Where:
    """``positions`` as ``None``, ``"each"`` or a list of ints (ranges are checked by ``resolve``).

    Raises:
        ValueError: another string, an empty list, an item that is not an int, or a repeated position.
    """
    expected = "expected None (every position at once), 'each' (one at a time) or a list of positions"
    if positions is None or (isinstance(positions, str) and positions == EACH):
        return positions
    if isinstance(positions, (str, bytes)) or not isinstance(positions, (Sequence, Tensor, np.ndarray)):
        raise ValueError(f"positions={positions!r}; {expected}")
    items = positions.reshape(-1).tolist() if isinstance(positions, (Tensor, np.ndarray)) else list(positions)
    if not items:
        raise ValueError(f"positions={positions!r} patches nothing; {expected}")
    out = []
    for p in items:
        if isinstance(p, bool):
            raise ValueError(f"positions={positions!r} has {p!r}; {expected}")
        try:
            out.append(operator.index(p))
        except TypeError:
            raise ValueError(f"positions={positions!r} has {p!r}; {expected}") from None
    return out


def resolve(where: Where, length: int, *, what: str) -> Where:
    """``where`` against a run of ``length`` positions: negative positions counted from the end.

    Raises:
        ValueError: a position out of range, or one listed twice (``what`` names the axis).
    """
    if not isinstance(where, list):
        return where
    out = []
    for p in where:
        if not -length <= p < length:
            raise ValueError(f"position {p} is out of range: these inputs have {length} {what} positions; expected "
                             f"0 to {length - 1} (or {-length} to -1)")
        out.append(p % length)
    repeated = sorted({p for p in out if out.count(p) > 1})
    if repeated:
        raise ValueError(f"positions={where!r} lists position {repeated[0]} more than once")
    return out


@dataclass(frozen=True)
class Unit:
    """One patched thing: a query head (z, q, pattern) or a key/value head (k, v) of a layer.

    Attributes:
        layer: the layer.
        head: the query head, or the key/value head for k and v.
        reader: a selected query head that reads it (itself for z, q, pattern): the cache's index.
    """

    layer: int
    head: int
    reader: int


def units(sites: Sequence[AttentionSite], selection: dict[int, list[int]], take: str) -> list[Unit]:
    """The units of ``take`` for the selected query heads: for k and v, each key/value head they read, once."""
    out: list[Unit] = []
    for layer, heads in selection.items():
        if take not in ("k", "v"):
            out.extend(Unit(layer, h, h) for h in heads)
            continue
        readers: dict[int, int] = {}
        for h in heads:
            readers.setdefault(sites[layer].kv_head_of[h], h)
        out.extend(Unit(layer, g, h) for g, h in sorted(readers.items()))
    return out


def values_of(take: str, unit: Unit, source: Cache, base: Cache | None, site: AttentionSite) -> Tensor:
    """The source's values of ``unit`` at every position: ``(batch, 1, positions, d)``.

    For ``pattern``, the z the head has with the source's pattern and the base run's values
    (``base`` holds its v): only that head changes, so the layer's values are the base run's. The
    site's persistent scale and shift of the head (a mask, an ablation) act on it as on any z.
    """
    if take != "pattern":
        return source[take, unit.layer, unit.reader].unsqueeze(1)
    assert base is not None
    pattern = source["pattern", unit.layer, unit.head]  # (batch, query_pos, key_pos)
    v = base["v", unit.layer, unit.head]  # (batch, key_pos, d_head_v)
    z = torch.matmul(pattern.to(v.dtype), v)  # (batch, query_pos, d_head_v)
    scale, shift = site.scale, site.shift
    if scale is not None:
        z = z * scale[unit.head].to(z)
    if shift is not None:
        z = z + shift[unit.head].to(z)
    return z.unsqueeze(1)


def replace(site: AttentionSite, take: str, unit: Unit, values: Tensor, positions: list[int] | None) -> None:
    """Set ``unit``'s values on its site for the next call (inside ``headlab.heads.scoped.intervening``).

    Args:
        values: ``(batch, 1, positions, d)`` at every position (``values_of``).
        positions: the positions replaced; None for every one.
    """
    index = None if positions is None else torch.tensor(positions, device=values.device)
    if index is not None:
        values = values.index_select(2, index)
    replacement = Replacement(torch.tensor([unit.head]), values.detach(), index)
    if take in ("z", "pattern"):
        site.replacement = replacement
    else:
        site.input_replacements = {**site.input_replacements, take: replacement}


def zero_delta(site: AttentionSite, take: str, like: Tensor) -> Tensor:
    """An additive zero on every head of ``take`` (z, q, or the key/value heads' k or v), set on the site.

    Args:
        like: one head's tensor ``(batch, positions, d)`` (the cache's).

    Returns:
        ``(batch, heads, positions, d)``, requiring grad: its gradient is ∂metric/∂``take``.
    """
    n_heads = site.n_kv_heads if take in ("k", "v") else site.n_heads
    delta = torch.zeros(like.shape[0], n_heads, *like.shape[1:], dtype=like.dtype, device=like.device,
                        requires_grad=True)
    if take == "z":
        site.delta = delta
    else:
        site.input_deltas = {**site.input_deltas, take: delta}
    return delta


def estimates(difference: Tensor, grad: Tensor | None, where: Where) -> list[float]:
    """AtP's ``difference · grad`` summed over the batch and d: over every position (None), the listed ones, or
    per position ("each"); zeros where the metric does not depend on the tensor (``grad`` None).

    Args:
        difference, grad: ``(batch, positions, d)``: source minus base values, and ∂metric/∂x at the base run.
    """
    if where == EACH:
        return [0.0] * difference.shape[1] if grad is None else (difference * grad).sum(dim=(0, 2)).tolist()
    if grad is None:
        return [0.0]
    if isinstance(where, list):
        return [float((difference * grad)[:, where].sum())]
    return [float((difference * grad).sum())]


@dataclass
class PatchRuns:
    """What both patching methods start from (``prepare``).

    Attributes:
        source: the cache of the run the values come from (clean when denoising), without gradients.
        base_inputs: the inputs of the run that receives them.
        units: what is patched, one at a time.
        readers: per layer, the query heads whose tensors the caches keep (a reader of each unit).
        take, direction: as asked.
        where: None, "each", or the positions (from 0).
        length: the positions of the patched axis (query positions; key positions for k and v).
        tokens: the clean and corrupted inputs' first items, as strings (None without a tokenizer).
    """

    source: Cache
    base_inputs: dict[str, Any]
    units: list[Unit]
    readers: dict[int, list[int]]
    take: str
    direction: str
    where: Where
    length: int
    tokens: tuple[list[str] | None, list[str] | None]

    def clean_and_corrupted(self, source_metric: float, base_metric: float) -> tuple[float, float]:
        """The metrics of the source and base runs as (clean, corrupted)."""
        return (source_metric, base_metric) if self.direction == "denoise" else (base_metric, source_metric)

    def grid(self, effects: np.ndarray, changes: np.ndarray) -> PositionGrid | None:
        """With ``where="each"``, the grid of ``effects`` and ``changes`` (one per unit and position); else None."""
        if self.where != EACH:
            return None
        pairs = [(unit.layer, unit.head) for unit in self.units]
        return PositionGrid(pairs, self.take, effects.reshape(len(pairs), self.length),
                            changes.reshape(len(pairs), self.length), *self.tokens)


def prepare(model: HeadedModel, clean: Inputs, corrupted: Inputs, heads: HeadSelection, *, take: str,
            direction: str, positions: object) -> PatchRuns:
    """Check the options and inputs, then run the source (clean when denoising), keeping ``take`` of the heads.

    Raises:
        ValueError: an unknown take or direction; inputs of different shapes; no head selected; positions
            that are not None, "each" or ints, out of range or repeated.
    """
    check_choices(take, direction)
    where = check_where(positions)
    selection = model.heads(heads)
    clean_inputs, corrupted_inputs = model.inputs(clean), model.inputs(corrupted)
    a, b = _shape(clean_inputs), _shape(corrupted_inputs)
    if a != b:
        raise ValueError(f"clean and corrupted inputs must have the same shape to patch between them: clean {a},"
                         f" corrupted {b} (batch, tokens); reword one so both have as many tokens")
    patched = units(model.sites, selection, take)
    if not patched:
        raise ValueError(f"heads={heads!r} selects no head to patch")
    readers: dict[int, list[int]] = {}
    for unit in patched:
        readers.setdefault(unit.layer, []).append(unit.reader)
    source_inputs, base_inputs = ((clean_inputs, corrupted_inputs) if direction == "denoise"
                                  else (corrupted_inputs, clean_inputs))
    source = run_with_cache(model, source_inputs, take=take, heads=readers)
    length = source[take, patched[0].layer, patched[0].reader].shape[1]
    where = resolve(where, length, what="key" if take in ("k", "v") else "query")
    return PatchRuns(source, base_inputs, patched, readers, take, direction, where, length,
                     (_first_tokens(model, clean_inputs), _first_tokens(model, corrupted_inputs)))


def _shape(inputs: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape of a forward's first tensor argument (the input ids of a transformers model)."""
    first = inputs["input_ids"] if "input_ids" in inputs else next(v for v in inputs.values() if isinstance(v, Tensor))
    return tuple(first.shape)


def _first_tokens(model: HeadedModel, inputs: Mapping[str, Any]) -> list[str] | None:
    """The first item's tokens, padding included (labels of the positions); an image model's positions as
    ``HeadedModel.labels`` names them (``[CLS]``, ``patch r0c3``); or None."""
    if isinstance(inputs.get("pixel_values"), Tensor):
        labels = model.labels(inputs)
        return None if labels is None else labels[0]
    ids = inputs.get("input_ids")
    if model.tokenizer is None or not isinstance(ids, Tensor) or ids.dim() != 2:
        return None
    return [str(t) for t in model.tokenizer.convert_ids_to_tokens(ids[0].tolist())]


@dataclass(repr=False)
class PositionGrid:
    """Per (head, position) patching effects: what ``positions="each"`` measures.

    Attributes:
        heads: each row's ``(layer, head)``: key/value heads when ``take`` is k or v.
        take: the tensor patched.
        effect, change: ``(len(heads), positions)``, as ``PatchingResult.table``'s columns.
        tokens: the clean input's tokens (its first item), None without a tokenizer.
        corrupted_tokens: the corrupted input's, likewise.
    """

    heads: list[tuple[int, int]]
    take: str
    effect: np.ndarray
    change: np.ndarray
    tokens: list[str] | None = None
    corrupted_tokens: list[str] | None = None

    @property
    def n_positions(self) -> int:
        return int(self.effect.shape[1])

    def labels(self) -> list[str]:
        """One label per position: ``"3 cat"``, ``"3 cat→dog"`` where the runs differ, ``"3"`` without tokens."""
        if self.tokens is None:
            return [str(p) for p in range(self.n_positions)]
        other = self.corrupted_tokens or self.tokens
        return [f"{p} {a}" if a == b else f"{p} {a}→{b}" for p, (a, b) in enumerate(zip(self.tokens, other))]

    def row_labels(self) -> list[str]:
        return [row_label(layer, head, self.take) for layer, head in self.heads]

    def value(self, name: str, layer: int, head: int, position: int) -> float:
        """``effect`` or ``change`` of one row at one position."""
        grid = {"effect": self.effect, "change": self.change}[name]
        return float(grid[self.heads.index((layer, head)), position])

    def top(self, k: int | None = None) -> list[tuple[int, int, int]]:
        """``(layer, head, position)`` of the cells by |effect|, largest first (NaNs last)."""
        values = np.nan_to_num(np.abs(self.effect), nan=-np.inf).reshape(-1)
        order = np.argsort(-values, kind="stable")[:k]
        return [(*self.heads[int(i) // self.n_positions], int(i) % self.n_positions) for i in order]

    def peaks(self) -> HeadTable:
        """Per row, the cell of largest |effect|: columns ``effect``, ``change`` and its ``position``."""
        at = np.nan_to_num(np.abs(self.effect), nan=-np.inf).argmax(axis=1)
        rows = np.arange(len(self.heads))
        return HeadTable(self.heads, {"effect": self.effect[rows, at], "change": self.change[rows, at],
                                      "position": at})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: rows, positions, tokens, and the two grids row by row (NaN as None)."""
        def grid(values: np.ndarray) -> list[list[float | None]]:
            return [[None if np.isnan(v) else float(v) for v in row] for row in values]

        return {"rows": [{"layer": layer, "head": head} for layer, head in self.heads],
                "unit": "kv_head" if self.take in ("k", "v") else "head", "positions": self.n_positions,
                "tokens": self.tokens, "corrupted_tokens": self.corrupted_tokens,
                "effect": grid(self.effect), "change": grid(self.change)}

    def html(self, *, rows: int = SHOWN_ROWS) -> str:
        """The rows of largest |effect| as a (head × position) heatmap (``headlab.display.heat_table``)."""
        order = np.argsort(-np.nan_to_num(np.abs(self.effect), nan=-np.inf).max(axis=1), kind="stable")[:rows]
        shown = "every row" if len(order) == len(self.heads) else f"the {len(order)} of {len(self.heads)} rows " \
            "of largest |effect|"
        return display.heat_table(self.effect[order], rows=[self.row_labels()[i] for i in order],
                                  columns=self.labels(), caption=f"effect by position ({shown})")


def plot_positions(grids: Sequence[tuple[str, PositionGrid]], path: str | Path, *, title: str = "") -> Path:
    """One (head × position) heatmap of ``effect`` per ``(name, grid)``, side by side, tokens on the x axis, as a PNG.

    Raises:
        ValueError: no grid.
    """
    if not grids:
        raise ValueError("plot_positions needs at least one grid (a result of positions='each')")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    n_rows, n_positions = len(grids[0][1].heads), grids[0][1].n_positions
    fig = Figure(figsize=(max(3.5, 0.32 * n_positions + 1.6) * len(grids), max(2.5, 0.2 * n_rows + 1.6)),
                 layout="constrained")
    limit = max(float(np.nanmax(np.abs(g.effect))) for _, g in grids) or 1.0
    image = None
    for i, (name, grid) in enumerate(grids):
        ax = fig.add_subplot(1, len(grids), i + 1)
        image = ax.imshow(grid.effect, cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(grid.n_positions), grid.labels(), rotation=90, fontsize="small")
        ax.set_yticks(range(len(grid.heads)), grid.row_labels(), fontsize="small")
        ax.set_xlabel("position")
        ax.set_title(name, fontsize="medium")
    assert image is not None
    return save_effects(fig, image, path, title=title)


def save_effects(fig: Any, image: Any, path: str | Path, *, title: str = "") -> Path:
    """Finish a figure of patching effects (its colour bar, its title) and write it as a PNG: both patching plots'."""
    fig.colorbar(image, ax=fig.axes, label="effect (share of the clean − corrupted gap)")
    if title:
        fig.suptitle(title, fontsize="small")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
