"""The analysis section: its table holds every relation its headline may name, and heads are written
``L1 H2``, never as a number such as ``1.2``."""

from __future__ import annotations

import html
import re

from headlab.analysis.analyze import TABLE_RELATIONS
from headlab.report.sections.analysis import render_analysis
from tests.support.analysis import hand_result, relation

HREFS = {name: f"assets/analysis/{name}" for name in ("heads.json", "heads.csv", "heatmaps.png", "mds.png")}


def _text(result) -> str:
    return html.unescape(render_analysis(result, description="tiny model on 10 items", hrefs=HREFS))


def test_the_relation_the_headline_names_is_in_the_table_and_the_rest_are_counted():
    relations = [relation(f"r{i}", 100 - i, accuracy=0.5, baseline=0.45) for i in range(TABLE_RELATIONS)]
    relations.append(relation("mark", 29, accuracy=0.95, baseline=0.1))
    result = hand_result(causal=False, relations=relations)
    text = _text(result)
    (headline,) = [s for s in result.sentences() if "relation" in s]
    named = re.search(r"relations, (\S+) gains most", headline).group(1)
    rows = re.findall(r"<tr><td>(\w+)</td><td class=\"num\">\d+</td>", text)
    assert named in rows and "mark" not in rows and len(rows) == TABLE_RELATIONS
    assert "1 rarer one is in relations.csv" in text


def test_heads_are_written_l_h_in_sentences_and_tables():
    text = _text(hand_result(causal=False, relations=[relation("nsubj", 40, accuracy=0.6, baseline=0.3)]))
    assert "<td>previous_token</td><td>L1 H0</td>" in text and "<td>L0 H1</td>" in text
    assert "Head L1 H0 sends" in text
    assert not re.search(r"<td>\d+\.\d+</td>", text)  # no head written as layer.head
