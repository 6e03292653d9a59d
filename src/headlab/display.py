"""How headlab's objects show themselves: a few lines of text (``__repr__``) and small HTML tables
(``_repr_html_``, which Jupyter and VS Code notebooks render).

This module imports nothing from headlab, so that every room (capture, heads, analysis, models …) can
use it. Every piece of text that reaches the HTML passes through ``escape``; markup is built here only,
and wrapped in ``Html`` to say it is already safe. An output carries no stylesheet of ours, so each table
brings a few rules scoped to ``.headlab-repr`` and each heatmap cell its colour inline.

    Shown                             a result's __repr__ and _repr_html_ from its _title, _facts and _parts
    summary(title, facts)             the text form: a title line, then ``  label: value`` lines
    card(title, facts, *parts)        the HTML form: the same title and facts, then tables
    table(headers, rows)              a compact table, every cell escaped
    heat_table(values, rows, columns) a grid of numbers coloured by value (a layer × head heatmap)
"""

from __future__ import annotations

import html as _stdlib_html
import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Html", "Shown", "abbreviate", "card", "escape", "heat_table", "runs", "shape", "short",
           "summary", "table"]

Facts = Sequence[tuple[str, object]]
# One rule set, scoped to .headlab-repr, sent with every table: an output carries no stylesheet of ours, and these
# rules follow the front end's own (a notebook's table styles) so they win the ties. Cell colours are inline.
_STYLE = ("<style>.headlab-repr{font:13px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:.2rem 0}"
          ".headlab-repr table{border-collapse:collapse;margin:.1rem 0;"
          "font:12px/1.3 ui-monospace,Menlo,Consolas,monospace}"
          ".headlab-repr th,.headlab-repr td{padding:.1rem .4rem;white-space:nowrap;text-align:right;"
          "border:1px solid rgba(128,128,128,.3);color:inherit}"
          ".headlab-repr th{font-weight:600;text-align:left}.headlab-repr .hl-num{text-align:right}"
          ".headlab-repr .hl-facts th,.headlab-repr .hl-facts td{border:0;font-family:inherit;font-size:13px;"
          "text-align:left}"
          ".headlab-repr .hl-facts th{font-weight:400;opacity:.75}.headlab-repr .hl-title{font-weight:600}"
          ".headlab-repr .hl-cap{font-size:12px;opacity:.8;margin:.3rem 0 .1rem}"
          ".headlab-repr .hl-scroll{overflow-x:auto;max-width:100%}</style>")
_POSITIVE = (33, 102, 172)  # blue: more of the value
_NEGATIVE = (178, 24, 43)  # red: a signed value below zero


class Html(str):
    """A string that is already safe HTML; ``escape`` passes it through unchanged."""

    __slots__ = ()


def escape(value: object) -> Html:
    """Escape any value for use as HTML text or a quoted attribute.

    Args:
        value: anything; non-strings are converted with ``str``. An ``Html`` value is returned unchanged.

    Returns:
        The escaped text (``& < > " '`` replaced by entities), marked as ``Html``.
    """
    if isinstance(value, Html):
        return value
    return Html(_stdlib_html.escape(str(value), quote=True))


def short(value: object) -> str:
    """A number as a person reads it at a glance: integers with thousands separators, floats to three
    significant digits (scientific below 0.001 or from 10,000), ``–`` for None and NaN; anything else as ``str``."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "–"
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.3g}"
    return f"{value:.2e}"


def shape(value: Any) -> str:
    """``(1, 12, 9, 9)``: the shape of a tensor or array (anything with ``.shape``), else its type's name."""
    dims = getattr(value, "shape", None)
    if dims is None:
        return type(value).__name__
    return "(" + ", ".join(str(int(d)) for d in dims) + ")"


def format_bytes(n: float) -> str:
    """``"812 KiB"``, ``"12.3 MiB"`` or ``"1.23 GiB"``."""
    if n < 2**20:
        return f"{n / 2**10:.0f} KiB"
    if n < 2**30:
        return f"{n / 2**20:.3g} MiB"
    return f"{n / 2**30:.3g} GiB"


def abbreviate(items: Sequence[object], *, head: int = 8, tail: int = 2, sep: str = " ") -> str:
    """The first ``head`` and last ``tail`` items joined by ``sep``, ``…`` between them when some are left out."""
    texts = [str(item) for item in items]
    if len(texts) <= head + tail + 1:
        return sep.join(texts)
    return sep.join([*texts[:head], "…", *texts[len(texts) - tail:]])


def runs(numbers: Iterable[int]) -> str:
    """``0–5, 7, 9–10``: sorted integers with consecutive runs joined."""
    values = sorted({int(n) for n in numbers})
    parts: list[str] = []
    start = previous = None
    for n in [*values, None]:
        if start is not None and (n is None or previous is None or n != previous + 1):
            parts.append(str(start) if start == previous else f"{start}–{previous}")
            start = None
        if n is not None and start is None:
            start = n
        previous = n
    return ", ".join(parts)


class Shown:
    """A result that shows itself from its ``_title()`` and ``_facts()``: ``repr`` as ``summary``, a notebook's
    HTML as ``card``, with ``_parts()`` (tables, heatmaps) after the facts. A dataclass using it is declared
    with ``repr=False``, or the ``__repr__`` the dataclass writes would take its place."""

    def _title(self) -> str:
        raise NotImplementedError

    def _facts(self) -> Facts:
        return ()

    def _parts(self) -> Sequence[str]:
        return ()

    def __repr__(self) -> str:
        return summary(self._title(), self._facts())

    def _repr_html_(self) -> str:
        return card(self._title(), self._facts(), *self._parts())


def summary(title: str, facts: Facts = ()) -> str:
    """The text form of a result: ``title``, then one indented ``label: value`` line per fact.

    Values go through ``short`` (numbers) or ``str``.
    """
    return "\n".join([title, *(f"  {label}: {short(value)}" for label, value in facts)])


def card(title: str, facts: Facts = (), *parts: str) -> Html:
    """The HTML form of a result: ``title`` in bold, the facts as a two-column table, then ``parts``.

    Args:
        title: the heading line (escaped).
        facts: ``(label, value)`` pairs; values go through ``short`` and are escaped unless ``Html``.
        parts: more HTML (e.g. ``heat_table``'s); a plain string is escaped.

    Returns:
        ``<div class="headlab-repr">…</div>``.
    """
    rows = "".join(f"<tr><th>{escape(label)}</th><td>{_text(value)}</td></tr>" for label, value in facts)
    body = f'<table class="hl-facts">{rows}</table>' if rows else ""
    return Html(f'{_STYLE}<div class="headlab-repr"><div class="hl-title">{escape(title)}</div>'
                f"{body}{''.join(escape(part) for part in parts)}</div>")


def table(headers: Sequence[object], rows: Iterable[Sequence[object]], *, caption: str | None = None,
          labels: int = 1) -> Html:
    """A compact table; every cell is escaped unless it is ``Html``, numbers go through ``short``.

    Args:
        headers: column titles.
        rows: one sequence per row, each as long as ``headers``.
        caption: a line above the table.
        labels: the leading columns that are labels (left-aligned, bold); the rest are right-aligned values.

    Returns:
        ``<table>`` inside a horizontally scrollable ``<div>``.

    Raises:
        ValueError: a row's length differs from the number of headers.
    """
    head = "".join(f"<th>{escape(h)}</th>" if i < labels else f'<th class="hl-num">{escape(h)}</th>'
                   for i, h in enumerate(headers))
    body = []
    for r, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"row {r} has {len(row)} cells, expected {len(headers)} (headers={list(headers)})")
        body.append("<tr>" + "".join(f"<th>{_text(v)}</th>" if i < labels else f"<td>{_text(v)}</td>"
                                     for i, v in enumerate(row)) + "</tr>")
    return _wrap(f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>", caption)


def heat_table(values: Iterable[Iterable[float]], *, rows: Sequence[object], columns: Sequence[object],
               caption: str | None = None, names: Sequence[Sequence[str]] | None = None) -> Html:
    """A grid of numbers, each cell shaded by its value: blue for positive, red for negative, strength
    ``|value| / max |value|``; NaN cells stay blank.

    Args:
        values: ``(len(rows), len(columns))`` numbers (a list of lists or a 2-d array), NaN for no value.
        rows, columns: the row and column labels (e.g. ``L0…``, ``H0…``).
        caption: a line above the grid.
        names: per cell, a tooltip naming it (default ``"{row} {column}"``).

    Returns:
        ``<table>`` inside a horizontally scrollable ``<div>``.

    Raises:
        ValueError: ``values`` is not ``len(rows) × len(columns)``.
    """
    grid = [[float(v) for v in row] for row in values]
    if len(grid) != len(rows) or any(len(row) != len(columns) for row in grid):
        raise ValueError(f"values are {len(grid)} × {[len(row) for row in grid]}; "
                         f"expected {len(rows)} × {len(columns)}")
    finite = [abs(v) for row in grid for v in row if math.isfinite(v)]
    peak = max(finite, default=0.0) or 1.0
    head = "<th></th>" + "".join(f'<th style="text-align:center">{escape(c)}</th>' for c in columns)
    body = []
    for i, (label, row) in enumerate(zip(rows, grid)):
        cells = []
        for j, v in enumerate(row):
            name = names[i][j] if names is not None else f"{label} {columns[j]}"
            if not math.isfinite(v):
                cells.append(f'<td title="{escape(name)}: no value"></td>')
                continue
            strength = min(1.0, abs(v) / peak)
            r, g, b = _POSITIVE if v >= 0 else _NEGATIVE
            ink = ";color:#fff" if strength > 0.55 else ""
            cells.append(f'<td style="background:rgba({r},{g},{b},{strength:.2f}){ink}" '
                         f'title="{escape(name)}: {escape(repr(v))}">{escape(_cell_number(v))}</td>')
        body.append(f'<tr><th>{escape(label)}</th>{"".join(cells)}</tr>')
    return _wrap(f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>", caption)


def _text(value: object) -> Html:
    return value if isinstance(value, Html) else escape(short(value))


def _cell_number(v: float) -> str:
    """Two decimals fit a heatmap cell; a magnitude they would round away is shown in scientific notation."""
    if v == 0:
        return "0"
    return f"{v:.2f}" if 0.005 <= abs(v) < 100 else f"{v:.0e}"


def _wrap(inner: str, caption: str | None) -> Html:
    cap = f'<div class="hl-cap">{escape(caption)}</div>' if caption else ""
    return Html(f'{_STYLE}<div class="headlab-repr">{cap}<div class="hl-scroll"><table>{inner}</table></div></div>')
