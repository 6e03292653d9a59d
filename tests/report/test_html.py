"""Report HTML helpers: everything is escaped unless it is markup the helpers built."""

from __future__ import annotations

import math

import pytest

from headlab.report.html import Html, badge, escape, link, number, table


def test_escape_escapes_markup_and_quotes_but_passes_html_through() -> None:
    assert escape('<b a="1">&\'') == "&lt;b a=&quot;1&quot;&gt;&amp;&#x27;"
    assert escape(Html("<b>ok</b>")) == "<b>ok</b>"
    assert escape(3) == "3"


def test_table_escapes_every_cell_and_header() -> None:
    out = table(["<h>"], [["<script>x</script>"], [Html("<em>kept</em>")]])
    assert "<script>" not in out
    assert "&lt;script&gt;x&lt;/script&gt;" in out and "&lt;h&gt;" in out
    assert "<em>kept</em>" in out


def test_table_marks_numeric_columns_and_formats_floats() -> None:
    out = table(["name", "diff"], [["a", 2.384185791015625e-07], ["b", 0.0]], numeric_cols=[1])
    assert '<td class="num">2.38e-07</td>' in out
    assert '<td class="num">0</td>' in out
    assert '<th class="num">diff</th>' in out and "<td>a</td>" in out


def test_table_rejects_ragged_rows() -> None:
    with pytest.raises(ValueError, match="row 1 has 1 cells, expected 2"):
        table(["a", "b"], [[1, 2], [3]])


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0, "0"), (1.5e-3, "1.50e-03"), (7, "7"), (math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")],
)
def test_number_formats(value: float, text: str) -> None:
    assert number(value) == text


def test_badge_and_link_escape_their_text() -> None:
    assert badge(True) == '<span class="badge pass">pass</span>'
    assert 'class="badge fail"' in badge(False, text="<x>") and "&lt;x&gt;" in badge(False, text="<x>")
    assert link('a"b.json', "<t>") == '<a href="a&quot;b.json">&lt;t&gt;</a>'
