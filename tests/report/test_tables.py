"""The per-head tables: each defined once, drawn the same by the terminal (rich) and the report (HTML) —
the same headers, the same cells, numeric columns right-aligned — with every text escaped in both."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
from rich.console import Console

from headlab.analysis import Conversion, RetrievalResult, StreamingResult
from headlab.analysis.sinks import SinkResult
from headlab.analysis.syntax import RelationAccuracy, SyntaxResult
from headlab.heads import HeadTable
from headlab.report.tables import (
    TOP_HEADS,
    Column,
    DisplayTable,
    classes_table,
    relations_table,
    retrieval_table,
    roles_table,
    sinks_table,
    streaming_table,
    to_html,
    to_rich,
)

HEADS = [(0, 0), (0, 1), (1, 0), (1, 1)]


def _sinks(n_sink: int = 4) -> tuple[HeadTable, SinkResult]:
    vw = HeadTable(HEADS, {"raw_sink": [0.9, 0.2, 0.6, 0.1], "weighted_sink": [0.3, 0.1, 0.5, 0.05],
                           "norm_first": [0.25, 1.0, 0.5, 2.0], "norm_other": [3.0, 2.0, 1.0, 2.5]})
    by_position = HeadTable(HEADS[:3], {"raw_share": [0.8, np.nan, 0.55], "raw_growth": [-0.021, 0.01, np.nan],
                                        "sink_head": [1.0, 0.0, 1.0]})  # (1, 1) not captured here
    return vw, SinkResult(by_position, n_sink, (0, 8), np.zeros((3, 2)), None, np.zeros((3, 2)))


def _tables() -> list[DisplayTable]:
    relations = [RelationAccuracy(f"r{i}<b>", 30 - i, (0, 1), 0.6, (1, 1), 0.2, -1 if i else 2, 0.4) for i in range(14)]
    syntax = SyntaxResult(relations=relations, head_slots=HEADS, per_head={}, counts={}, min_count=1, items=3, arcs=99)
    retrieval = RetrievalResult(HeadTable(HEADS, {"score": [0.05, 0.3, 0.0, 0.12], "attended": [0.1, 0.4, 0.0, 0.2],
                                                  "retrieved": [1, 6, 0, 2]}), 2, 20, 15, 0.0)
    conversions = [Conversion(4, [(0, 1), (1, 0)], [(0, 1)], 0.0123, 2, 1, 0, 2, 3 * 1024, 8 * 1024, 0.5),
                   Conversion(16, [], [], 0.0, 0, 0, 0, 2, 0, 8 * 1024, 0.0)]
    streaming = StreamingResult(HeadTable(HEADS, {"z_change_w4": [0.1] * 4}), "causal", [4, 16], 2, 0.02,
                                "key/value cache", "a loss", 3.2, [0.9, 0.05], conversions, 3, 32)
    return [roles_table({(1, 0): ("previous_token",), (0, 1): ("sink", "previous_token")}),
            classes_table({"vertical": 0.5, "diagonal": 0.25, "block": 0.25}), relations_table(syntax),
            sinks_table(*_sinks()), retrieval_table(retrieval), streaming_table(streaming)]


def _terminal(shown: DisplayTable) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(to_rich(shown))
    return console.export_text()


@pytest.mark.parametrize("shown", _tables(), ids=lambda t: t.title.split(":")[0].split(" (")[0])
def test_the_terminal_and_the_report_draw_the_same_table(shown):
    rich = to_rich(shown)
    assert [c.header for c in rich.columns] == shown.headers
    assert [c.justify for c in rich.columns] == ["right" if c.numeric else "left" for c in shown.columns]
    fragment = to_html(shown)
    heads = re.findall(r"<th( class=\"num\")?>(.*?)</th>", fragment)
    assert [html.unescape(h) for _, h in heads] == shown.headers
    assert [bool(num) for num, _ in heads] == [c.numeric for c in shown.columns]
    cells = [html.unescape(c) for c in re.findall(r"<td(?: class=\"num\")?>(.*?)</td>", fragment)]
    assert cells == [cell for row in shown.rows for cell in row]
    assert html.unescape(re.search(r"<caption>(.*?)</caption>", fragment).group(1)) == shown.title
    said = _terminal(shown)
    assert shown.title in " ".join(said.split()) and all(cell in said for row in shown.rows for cell in row)


def test_cells_are_written_once_for_both():
    roles, classes, relations, sinks, retrieval, streaming = _tables()
    assert roles.rows == (("previous_token", "L0 H1, L1 H0"), ("sink", "L0 H1"))
    assert classes.rows == (("50%", "25%", "25%"),)
    assert len(relations.rows) == 12 and "2 rarer ones are in relations.csv" in relations.title
    assert relations.rows[0] == ("r0<b>", "30", "L0 H1", "dependent → syntactic head", "60%", "40%", "+2")
    assert sinks.rows[0] == ("L0 H0", "90%", "30%", "0.25", "3.00", "80%", "yes", "-2.1")
    assert sinks.rows[1] == ("L1 H0", "60%", "50%", "0.50", "1.00", "55%", "yes", "–")  # no growth: NaN
    assert sinks.rows[3] == ("L1 H1", "10%", "5%", "2.00", "2.50", "–", "–", "–")  # a head SinkShare did not see
    assert "on the first 4 positions" in sinks.title and sinks.headers[5] == "raw on the first 4 positions"
    assert "the first position" in sinks_table(*_sinks(1)).title
    assert retrieval.rows[0] == ("1", "L0 H1", "0.300", "0.400") and len(retrieval.rows) == min(TOP_HEADS, 4)
    assert retrieval.title.startswith("Retrieval heads (Wu et al. 2024): top 4 of 4 by score (> 0.1 is a retrieval")
    assert streaming.rows[0] == ("4", "2", "1", "+0.0123", "1 / 2", "38%", "50%")
    assert streaming.title.startswith("Streaming heads: 2 sink tokens") and "key/value heads freed" in streaming.headers


def test_every_text_is_escaped_in_both():
    shown = DisplayTable("a [bold]title[/bold] <i>", (Column("[red]h[/red]"), Column("<n>", numeric=True)),
                         (("[link=x]a[/link]", "<b>1</b>"),))
    said = _terminal(shown)
    assert "[bold]title[/bold]" in said and "[red]h[/red]" in said and "[link=x]a[/link]" in said
    fragment = to_html(shown)
    assert "<b>" not in fragment and "<i>" not in fragment and "&lt;b&gt;1&lt;/b&gt;" in fragment


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match=r"row 0 has 1 cells, expected 2 \(columns \['a', 'b'\]\)"):
        DisplayTable("t", (Column("a"), Column("b")), (("x",),))
