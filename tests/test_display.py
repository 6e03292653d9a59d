"""headlab.display: escaped tables, heatmap shading by value, short numbers and the text form of results."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from headlab import display
from headlab.report import html as report_html


def _cells(html: str) -> list[tuple[str, float | None, str]]:
    """``(title, background alpha or None, text)`` of each ``<td>``."""
    found = []
    for attrs, text in re.findall(r"<td([^>]*)>([^<]*)</td>", html):
        alpha = re.search(r"rgba\(\d+,\d+,\d+,([\d.]+)\)", attrs)
        title = re.search(r'title="([^"]*)"', attrs)
        found.append((title.group(1) if title else "", float(alpha.group(1)) if alpha else None, text))
    return found


def test_one_escape_for_the_report_and_the_notebook():
    assert report_html.escape is display.escape and report_html.Html is display.Html
    assert display.escape('<a href="x">&</a>') == "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
    safe = display.Html("<b>kept</b>")
    assert display.escape(safe) is safe


def test_table_escapes_every_cell_and_refuses_ragged_rows():
    html = display.table(["<name>", "value"], [["<script>x</script>", 0.5], [display.Html("<i>ok</i>"), None]])
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html and "&lt;name&gt;" in html
    assert "<i>ok</i>" in html and "<td>–</td>" in html  # None as a dash
    with pytest.raises(ValueError, match=r"row 0 has 1 cells, expected 2"):
        display.table(["a", "b"], [[1]])


def test_heat_table_shades_by_magnitude_and_sign():
    values = np.array([[0.5, -1.0, float("nan")], [0.25, 0.0, 2.0]])
    html = display.heat_table(values, rows=["L0", "L1"], columns=["H0", "H1", "H2"], caption="effect <x>")
    cells = _cells(html)
    assert len(cells) == 6 and "effect &lt;x&gt;" in html
    by_title = {title.split(":")[0]: (alpha, text) for title, alpha, text in cells}
    assert by_title["L1 H2"] == (1.0, "2.00")  # the largest magnitude is full strength
    assert by_title["L0 H0"] == (0.25, "0.50") and by_title["L1 H1"] == (0.0, "0")
    assert by_title["L0 H2"] == (None, "")  # NaN: blank, no colour
    red = re.search(r'<td style="background:rgba\((\d+),\d+,\d+,0.50\)', html)
    assert red and int(red.group(1)) > 150  # the negative cell is red, half strength
    with pytest.raises(ValueError, match=r"expected 2 × 3"):
        display.heat_table([[1.0, 2.0]] * 2, rows=["a", "b"], columns=["x", "y", "z"])


@pytest.mark.parametrize("value, text", [
    (None, "–"), (float("nan"), "–"), (0.0, "0"), (12345, "12,345"), (0.123456, "0.123"), (1234.5, "1.23e+03"),
    (2e-5, "2.00e-05"), (float("inf"), "∞"), ("pattern", "pattern"), (True, "True"),
])
def test_short_numbers(value, text):
    assert display.short(value) == text


def test_runs_abbreviate_shape_summary():
    assert display.runs([5, 0, 1, 2, 7, 9, 10]) == "0–2, 5, 7, 9–10" and display.runs([]) == ""
    assert display.abbreviate(list("abcdefghijklmn"), head=3, tail=2) == "a b c … m n"
    assert display.abbreviate(list("abcdef"), head=3, tail=2) == "a b c d e f"  # nothing worth leaving out
    assert display.shape(np.zeros((1, 2, 3))) == "(1, 2, 3)" and display.shape(3) == "int"
    text = display.summary("Title", [("metric", math.pi), ("heads", 72)])
    assert text.splitlines() == ["Title", "  metric: 3.14", "  heads: 72"]
