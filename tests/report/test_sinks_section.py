"""The sinks section: it renders on a tiny bidirectional and a tiny causal model and on MiniLM, writes its
plots, and every number in its sentences is one the run measured."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pytest

from headlab.analysis.sinks import sink_sentences
from headlab.report import ReportContext
from headlab.report.sections import sinks
from tests.support.tiny import tiny


def _ctx(tmp_path: Path, model) -> ReportContext:
    ctx = ReportContext(out_dir=tmp_path, assets_dir=tmp_path / "assets", seed=0, quick=True)
    ctx.memo("model", lambda: model)
    return ctx


def _percent(sentence: str, after: str) -> float:
    return float(re.search(re.escape(after) + r"\D*?(\d+)%", sentence).group(1)) / 100


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_renders_on_tiny_models_with_its_plots(tmp_path: Path, kind: str) -> None:
    text = html.unescape(sinks.render(_ctx(tmp_path, tiny(kind))))
    for href in sinks.PLOTS.values():
        assert f'src="{href}"' in text
        assert (tmp_path / href).read_bytes()[:4] == b"\x89PNG"
    assert "on 60 items of the bundled corpus" in text and "sink heads" in text
    assert ("the first 4 positions" if kind == "gpt2" else "the first position") in text
    assert text.count("<tr>") == 1 + min(sinks.TABLE_HEADS, 8)


def test_sentences_read_the_measured_numbers():
    from headlab.capture import load_corpus

    model = tiny("gpt2")
    report = sinks.measure(model, list(load_corpus(None).texts[:20]))
    vw, table = report.weighted, report.sinks.table
    first, norms, worst, heads, position = sink_sentences(report.weighted, report.sinks, causal=report.causal)
    assert _percent(first, "Averaged over the 8 heads,") == pytest.approx(np.nanmean(vw["raw_first"]), abs=0.005)
    assert _percent(first, "those shares are") == pytest.approx(np.nanmean(vw["weighted_first"]), abs=0.005)
    assert f"{np.nanmean(vw['norm_first']):.2f} against {np.nanmean(vw['norm_other']):.2f}" in norms
    label = re.search(r"Head (L\d+ H\d+)", worst).group(1)
    layer, head = (int(x) for x in re.findall(r"\d+", label))
    gap = vw["raw_sink"] - vw["weighted_sink"]
    assert vw.heads[int(np.nanargmax(gap))] == (layer, head)
    assert f"{len(report.sinks.sink_heads())} of the 8 heads are sink heads" in heads
    growth = float(np.nanmean(table["raw_growth"]))
    assert f"{abs(growth) * 100:.1f} percentage points" in position
    assert ("gains" if growth >= 0 else "loses") in position


def test_minilm(tmp_path: Path) -> None:
    from tests.support.minilm import minilm

    model = minilm()
    text = html.unescape(sinks.render(_ctx(tmp_path, model)))
    assert "all-MiniLM-L6-v2" in text and "the first token ([CLS])" in text
    # Kobayashi et al.'s finding holds in MiniLM: [CLS] draws far more weight than it carries
    report = sinks.measure(model, ["The keys that the old man left on the kitchen table belong to his daughter."])
    assert np.nanmean(report.weighted["raw_first"]) > 2 * np.nanmean(report.weighted["weighted_first"])
