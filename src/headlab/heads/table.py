"""``HeadTable``: the one type of every per-head result — a row per (layer, head), named columns.

Analysis statistics, importance scores, probe scores and patching effects are all a value (or
several) per head. A ``HeadTable`` holds them as float64 columns aligned with its ``heads``,
looks a head up by ``(layer, head)``, lays a column out as a ``(layer, head)`` grid for a
heatmap, and writes plain rows or one JSON-ready dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from headlab import display
from headlab.heads.selection import head_label

GRID_COLUMNS = 3  # a table of at most this many columns shows each as a layer × head grid
MAX_GRID_CELLS = 4096  # a larger grid (layers × heads) shows as rows instead


class HeadTable:
    """Named per-head columns.

    Args:
        heads: ``(layer, head)`` of each row, unique.
        columns: name → one value per row (anything ``np.asarray`` reads as float64).

    Raises:
        ValueError: a repeated head, a column of another length, or no column.
    """

    def __init__(self, heads: Sequence[tuple[int, int]], columns: Mapping[str, Any]) -> None:
        self.heads = [(int(layer), int(head)) for layer, head in heads]
        self._rows = {h: i for i, h in enumerate(self.heads)}
        if len(self._rows) != len(self.heads):
            repeated = sorted({h for h in self.heads if self.heads.count(h) > 1})
            raise ValueError(f"heads {repeated} appear more than once")
        if not columns:
            raise ValueError("a HeadTable needs at least one column")
        self.columns: dict[str, np.ndarray] = {}
        for name, values in columns.items():
            array = np.asarray(values, dtype=np.float64).reshape(-1)
            if len(array) != len(self.heads):
                raise ValueError(f"column {name!r} has {len(array)} values for {len(self.heads)} heads")
            self.columns[name] = array

    def __repr__(self) -> str:
        return f"HeadTable({len(self.heads)} heads, columns {list(self.columns)})"

    def __len__(self) -> int:
        return len(self.heads)

    def __getitem__(self, name: str) -> np.ndarray:
        """A column, ``(len(heads),)``."""
        try:
            return self.columns[name]
        except KeyError:
            raise KeyError(f"no column {name!r}; the table has {list(self.columns)}") from None

    def index(self, layer: int, head: int) -> int:
        """The row of ``(layer, head)``.

        Raises:
            KeyError: the head is not in the table.
        """
        try:
            return self._rows[(layer, head)]
        except KeyError:
            raise KeyError(f"(layer {layer}, head {head}) is not in this table; it has layers {self.layers}") from None

    def value(self, name: str, layer: int, head: int) -> float:
        """One head's value in column ``name``."""
        return float(self[name][self.index(layer, head)])

    def at(self, name: str, heads: Sequence[tuple[int, int]]) -> np.ndarray:
        """Column ``name`` at ``heads`` (another table's rows, say), NaN for a head with no row here."""
        column = self[name]
        return np.array([column[self._rows[h]] if h in self._rows else np.nan for h in heads], dtype=np.float64)

    @property
    def layers(self) -> list[int]:
        """The layers with at least one row, in order."""
        return sorted({layer for layer, _ in self.heads})

    def grid(self, name: str) -> np.ndarray:
        """Column ``name`` as ``(len(layers), 1 + largest head)``, NaN where a head has no row (for heatmaps)."""
        layers = self.layers
        out = np.full((len(layers), 1 + max(h for _, h in self.heads)), np.nan)
        position = {layer: i for i, layer in enumerate(layers)}
        for (layer, head), value in zip(self.heads, self[name]):
            out[position[layer], head] = value
        return out

    def top(self, name: str, k: int | None = None, *, largest: bool = True,
            absolute: bool = False) -> list[tuple[int, int]]:
        """The heads by column ``name`` (by its magnitude with ``absolute``), largest first (or
        smallest with ``largest=False``); NaNs last."""
        values = np.abs(self[name]) if absolute else self[name]
        key = np.where(np.isnan(values), -np.inf if largest else np.inf, values)
        order = np.argsort(-key if largest else key, kind="stable")
        return [self.heads[i] for i in order[:k]]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per head: ``layer``, ``head`` and every column (NaN as None)."""
        return [{"layer": layer, "head": head,
                 **{name: None if np.isnan(col[i]) else float(col[i]) for name, col in self.columns.items()}}
                for i, (layer, head) in enumerate(self.heads)]

    def to_dict(self) -> dict[str, Any]:
        """``{"columns": [...], "rows": rows()}``: JSON-ready (no NaN)."""
        return {"columns": list(self.columns), "rows": self.rows()}

    def html(self, columns: Sequence[str] | None = None, *, rows: int = 12) -> str:
        """The table as short HTML (``headlab.display``): a layer × head heatmap per column for at most
        ``GRID_COLUMNS`` columns, else the first ``rows`` rows with every column.

        Args:
            columns: the columns to draw as grids (any number); None: every column when there are at
                most ``GRID_COLUMNS``, else the rows.
            rows: rows shown in the row form.

        Raises:
            KeyError: an unknown column.
        """
        if columns is None and len(self.columns) > GRID_COLUMNS:
            return self._rows_html(rows)
        names = list(self.columns) if columns is None else list(columns)
        for name in names:
            self[name]  # an unknown column raises KeyError naming the table's columns
        if not self.heads:
            return display.card("no heads")
        layers, width = self.layers, 1 + max(h for _, h in self.heads)
        if len(layers) * width > MAX_GRID_CELLS:
            return self._rows_html(rows)
        return "".join(display.heat_table(self.grid(name), rows=[f"L{layer}" for layer in layers],
                                          columns=[f"H{h}" for h in range(width)], caption=name) for name in names)

    def _rows_html(self, rows: int) -> str:
        shown = [[head_label(layer, head), *(float(col[i]) for col in self.columns.values())]
                 for i, (layer, head) in enumerate(self.heads[:rows])]
        more = len(self.heads) - len(shown)
        caption = f"the first {len(shown)} of {len(self.heads)} rows; .rows() has them all" if more > 0 else None
        return display.table(["head", *self.columns], shown, caption=caption)

    def _repr_html_(self) -> str:
        layers = display.runs(self.layers) or "none"
        return display.card(f"HeadTable: {len(self.heads)} heads in layers {layers}",
                            [("columns", ", ".join(self.columns))], display.Html(self.html()))
