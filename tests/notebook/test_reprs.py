"""What a notebook shows of headlab's objects: a few lines of text, never pages of tensors, and short HTML
tables whose numbers and shading are the object's own, with every piece of text escaped."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from headlab.analysis.importance import ImportanceResult, PruningCurve
from headlab.analysis.patching import PatchingResult
from headlab.analysis.retrieval import RetrievalResult
from headlab.analysis.roles import ProbeScores
from headlab.analysis.similarity import SimilarityResult
from headlab.analysis.sinks import SinkResult
from headlab.analysis.streaming import Conversion, StreamingResult
from headlab.capture import run_with_cache
from headlab.capture.cache import Cache
from headlab.capture.run import CaptureResult
from headlab.heads import HeadTable
from tests.support.tiny import tiny

HEADS = [(layer, h) for layer in range(3) for h in range(4)]


def _alphas(html: str) -> dict[str, float]:
    """``{"L1 H2": background alpha}`` of a heatmap's shaded cells."""
    return {title: float(alpha) for alpha, title in
            re.findall(r'<td style="background:rgba\(\d+,\d+,\d+,([\d.]+)\)[^"]*" title="([^:"]+):', html)}


def test_a_cache_repr_is_a_few_lines_whatever_it_holds():
    model = tiny("bert")
    cache = run_with_cache(model, ["the cat sat on the mat", "a dog"], take=("pattern", "z"), heads={0: None, 1: [2]})
    text = repr(cache)
    lines = text.splitlines()
    assert len(lines) <= 7 and len(text) < 700 and "tensor(" not in text
    assert lines[1] == "  inputs: input_ids (2, 8), attention_mask (2, 8)"
    assert lines[2] == "  tokens[0]: [CLS] the cat sat on the mat [SEP] (8 tokens; 1 more item)"
    assert "  pattern: layer 0 × every head: (2, 4, 8, 8)" in lines and "  z: layer 1 × head 2: (2, 1, 8, 8)" in lines
    html = cache._repr_html_()
    assert "(batch, head, query_pos, key_pos)" in html and "tensor(" not in html and len(html) < 6000


def test_a_cache_html_escapes_its_tokens():
    pattern = torch.full((1, 2, 2, 2), 0.5)
    cache = Cache(output=None, inputs={"input_ids": torch.zeros(1, 2, dtype=torch.long)}, n_heads=[2],
                  tokens=[["<img src=x onerror=alert(1)>", "&amp;"]], store={("pattern", 0): ((0, 1), pattern)})
    html = cache._repr_html_()
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt; &amp;amp;" in html
    assert "layer 0 × every head: (1, 2, 2, 2)" in repr(cache)


def test_a_head_table_shows_a_grid_per_column_or_its_first_rows():
    table = HeadTable(HEADS, {"effect": np.linspace(-1, 2, 12), "<b>": np.arange(12.0)})
    html = table._repr_html_()
    assert len(re.findall(r"<td (?:style|title)", html)) == 24  # two 3 × 4 grids
    alphas = _alphas(table.html(["effect"]))
    assert alphas["L2 H3"] == 1.0 and alphas["L0 H0"] == 0.5  # |−1| of the largest |2|
    assert "&lt;b&gt;" in html and "<b>" not in html
    wide = HeadTable(HEADS, {name: np.arange(12.0) for name in "abcd"})
    html = wide._repr_html_()
    assert "the first 12 of 12 rows" not in html and len(re.findall(r"<tr>", html)) == 1 + 12 + 1
    assert "the first 5 of 12 rows" in wide.html(rows=5) and "L1 H0" in wide.html(rows=5)
    assert len(re.findall(r"<td (?:style|title)", wide.html(["c"]))) == 12
    with pytest.raises(KeyError, match="no column 'x'"):
        table.html(["x"])
    assert repr(table) == "HeadTable(12 heads, columns ['effect', '<b>'])"


def _table(column: str, values) -> HeadTable:
    return HeadTable(HEADS, {column: np.asarray(values, dtype=float)})


def _results():
    ramp = np.linspace(0, 1, 12)
    effect = HeadTable(HEADS, {"effect": ramp - 0.2, "change": ramp})
    sinks = HeadTable(HEADS, {"raw_share": ramp, "sink_head": (ramp >= 0.5).astype(float)})
    streaming = HeadTable(HEADS, {"loss_change_w8": ramp, "z_change_w8": ramp, "streaming_w8": ramp > 0.5})
    conversion = Conversion(window=8, tolerant=HEADS[:3], heads=HEADS[:2], loss_change=0.01, evaluations=3, freed=2,
                            unsaved=0, units=12, saved_bytes=10, total_bytes=40, limit_share=0.2)
    return [
        (PatchingResult("activation", effect, 1.0, 0.5, forwards=14, backwards=0, seconds=1.5),
         "largest |effect|: L2 H3 0.8", "effect"),
        (ImportanceResult(HeadTable(HEADS, {"score": ramp, "raw": ramp}), "gradient", True, 4, 0.5),
         "least important: L0 H0 0, L0 H1 0.0909", "score"),
        (ProbeScores("induction", _table("induction", ramp), 0.8, n_seqs=8, length=10, seed=0),
         "above 0.8: 3 heads: L2 H3 1, L2 H2 0.909, L2 H1 0.818", "induction"),
        (SinkResult(sinks, n_sink=1, edges=(0, 1, 2), raw=np.zeros((12, 3)), weighted=None,
                    counts=np.ones((12, 3), dtype=int)), "sink heads (share ≥ 0.5): 6: L2 H3 1", "raw_share"),
        (RetrievalResult(_table("score", ramp), needles=4, steps=40, copied=30), "copy accuracy: 0.75 of 40 steps",
         "score"),
        (StreamingResult(streaming, kind="causal", windows=[8], sinks=4, budget=0.02, memory="key/value cache",
                         loss="next-token loss", base_loss=3.0, all_heads=[0.5], conversions=[conversion], texts=2,
                         length=64),
         "W = 8: 3 heads within 0.02, 2 converted together; 25% of the key/value cache saved",
         "loss_change_w8"),
    ]


@pytest.mark.parametrize("result, line, grid", _results(), ids=lambda v: "" if isinstance(v, str) else type(v).__name__)
def test_a_result_shows_its_title_its_facts_and_its_grid(result, line, grid):
    text = repr(result)
    assert len(text.splitlines()) <= 6 and any(row.strip().startswith(line) for row in text.splitlines()), text
    html = result._repr_html_()
    assert html.count("<table") == 2 and f">{grid}<" in html  # the facts, then one grid captioned by its column
    assert text.splitlines()[0] in html.replace("&gt;", ">").replace("&#x27;", "'")
    assert max(_alphas(html).values()) == 1.0


def test_results_without_a_grid():
    similarity = SimilarityResult(np.array([[0, 0.2, 0.5], [0.2, 0, 0.1], [0.5, 0.1, 0]]), [(0, 0), (0, 1), (1, 0)],
                                  rows=100, sampled=50)
    text = repr(similarity)
    assert "closest: L0 H1 and L1 H0: 0.1" in text and "farthest: L0 H0 and L1 H0: 0.5" in text
    assert "query rows: 50 read of 100" in text
    capture = CaptureResult(items=3, tokens=30, padded_tokens=36, batches=1, truncated=[2], max_length=16,
                            layers={0: [0, 1], 1: [0, 1], 3: [2]}, take=("pattern",), seconds=0.5)
    text = repr(capture)
    assert text.splitlines()[0] == "CaptureResult: 3 items, 30 tokens in 1 batches"
    assert "taken: pattern of 5 heads in layers 0–1, 3" in text and "truncated: 1 items to 16 pieces" in text
    assert "60 tokens/s" in text and "1.20× the real ones" in text
    curve = PruningCurve(fractions=[0.0, 0.5, 1.0], removed=[0, 6, 12], values=[1.0, 0.8, 0.1])
    assert repr(curve).splitlines() == ["PruningCurve: 3 steps, up to 100% of the heads removed", "  metric: 1 → 0.1"]
    for result in (similarity, capture, curve):
        assert "headlab-repr" in result._repr_html_()
