"""Small HTML builders for report sections.

Every piece of text that goes into the page passes through :func:`escape`. The only
way to put markup in a table cell or a fragment unescaped is to wrap it in
:class:`Html`, which the helpers here do for the markup they build themselves
(badges, links, code spans). Sections never concatenate raw user or token text.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from headlab.display import Html, escape  # one escape for the report and the notebook forms

__all__ = ["Html", "escape", "number", "badge", "link", "code", "table", "details"]


def number(value: float | int, *, digits: int = 2) -> str:
    """Format a number for a report: integers as they are, floats in scientific notation.

    Differences between implementations span many orders of magnitude (0 to ~1e-3),
    so floats use ``{:.{digits}e}``; an exact zero prints as ``0``.

    Args:
        value: the number.
        digits: digits after the decimal point of the mantissa.

    Returns:
        The formatted text, e.g. ``"2.38e-07"``, ``"0"``, ``"nan"``, ``"inf"``.
    """
    if isinstance(value, (bool, int)):
        return str(value)
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    return f"{value:.{digits}e}"


def badge(ok: bool, *, text: str | None = None) -> Html:
    """A coloured pass/fail badge.

    Args:
        ok: green when True, red when False.
        text: label; defaults to ``"pass"`` / ``"fail"``.

    Returns:
        ``<span class="badge pass|fail">label</span>``.
    """
    label = text if text is not None else ("pass" if ok else "fail")
    kind = "pass" if ok else "fail"
    return Html(f'<span class="badge {kind}">{escape(label)}</span>')


def link(href: str, text: str) -> Html:
    """An ``<a>`` element with escaped target and text.

    Args:
        href: relative or absolute URL.
        text: link text.

    Returns:
        The anchor element.
    """
    return Html(f'<a href="{escape(href)}">{escape(text)}</a>')


def code(text: object) -> Html:
    """Inline monospaced text (``<code>``), escaped."""
    return Html(f"<code>{escape(text)}</code>")


def details(summary: str, body: object, *, preformatted: bool = True) -> Html:
    """A collapsible ``<details>`` block.

    Args:
        summary: the always-visible line.
        body: the hidden content; escaped unless it is :class:`Html`.
        preformatted: wrap the body in ``<pre>`` (for tracebacks and logs).

    Returns:
        The ``<details>`` element.
    """
    inner = f"<pre>{escape(body)}</pre>" if preformatted else escape(body)
    return Html(f"<details><summary>{escape(summary)}</summary>{inner}</details>")


def _cell(value: object) -> Html:
    if isinstance(value, Html):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return escape(number(value))
    return escape(value)


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    numeric_cols: Iterable[int] = (),
    caption: str | None = None,
) -> Html:
    """An HTML table; every cell is escaped unless it is :class:`Html`.

    Floats are formatted with :func:`number`. Numeric columns are right-aligned in a
    monospaced, tabular font so that magnitudes line up.

    Args:
        headers: column titles.
        rows: one sequence per row, each as long as ``headers``.
        numeric_cols: indices of numeric columns.
        caption: optional caption above the table.

    Returns:
        The ``<table>`` element wrapped in a horizontally scrollable ``<div>``.

    Raises:
        ValueError: a row's length differs from the number of headers.
    """
    numeric = set(numeric_cols)

    def cls(i: int) -> str:
        return ' class="num"' if i in numeric else ""

    head = "".join(f"<th{cls(i)}>{escape(h)}</th>" for i, h in enumerate(headers))
    body_rows = []
    for r, row in enumerate(rows):
        if len(row) != len(headers):
            raise ValueError(f"row {r} has {len(row)} cells, expected {len(headers)} (headers={list(headers)})")
        cells = "".join(f"<td{cls(i)}>{_cell(v)}</td>" for i, v in enumerate(row))
        body_rows.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{escape(caption)}</caption>" if caption is not None else ""
    return Html(
        f'<div class="table-wrap"><table>{cap}<thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body_rows)}</tbody></table></div>"
    )
