"""The viewer's rollout and flow toggles in headless Chromium (tiny random BERT and GPT-2).

The highlight the page shows after a toggle must carry exactly the encoded rollout / flow through the open
head's layer, and those must be ``headlab.analysis.flow``'s numbers computed apart from the viewer, to
within the encoding's step; a text beyond the flow limit disables the flow button and says the limit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from headlab.analysis.flow import attention_flow, rollout
from headlab.capture import pattern_to_words
from headlab.report.viewer import view_data
from tests.support.browser import PLAIN, Tab, check_highlight, hover, open_viewer
from tests.support.reference import captured_patterns
from tests.support.tiny import tiny

SHORT = "the cat sat on the mat"
LONG = "the big red dog ran on the mat and the cat sat on the big red mat"


def test_rollout_and_flow_toggles_show_the_models_numbers(tab: Tab, tmp_path: Path) -> None:
    model = tiny("gpt2")
    data = view_data(model, [SHORT, LONG], flow_max_length=12)
    assert data.items[0].pieces.flow is not None and data.items[1].pieces.flow is None
    open_viewer(tab, data, tmp_path / "view.html")
    assert tab.page.get_attribute(".hv", "data-view") == "pattern"
    patterns, _ = captured_patterns(model, SHORT)
    exact_rollout = rollout([patterns[0], patterns[1]]).float().numpy()
    exact_flow = attention_flow([patterns[0], patterns[1]]).float().numpy()

    tab.page.click(".hv-thumb[data-layer='1'][data-head='2']")
    tab.wait_ready(layer=1, head=2)
    tab.page.click(".hv-views button[data-view='rollout']")
    tab.wait_ready(view="rollout", layer=1)
    assert tab.page.inner_text(".hv-head-title") == "Attention rollout through layer 1"
    pos = 4
    to, frm = hover(tab, pos)
    check_highlight(to, frm, data.items[0].pieces.rollout[1].values(), exact_rollout[1], pos)
    assert abs(to.sum() - 1) < 0.02 and (to[pos + 1:] == 0).all()  # a distribution over earlier inputs

    tab.page.click(".hv-views button[data-view='flow']")
    tab.wait_ready(view="flow", layer=1)
    assert tab.page.inner_text(".hv-head-title") == "Attention flow through layer 1"
    to, frm = hover(tab, pos)
    check_highlight(to, frm, data.items[0].pieces.flow[1].values(), exact_flow[1], pos)
    tab.shot("viewer-flow-gpt2")

    tab.page.click(".hv-thumb[data-layer='0'][data-head='0']")  # another layer: flow through layer 0 = Ã_0
    tab.wait_ready(view="flow", layer=0)
    to, _ = hover(tab, pos)
    np.testing.assert_allclose(to, data.items[0].pieces.flow[0].values()[pos], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(data.items[0].pieces.flow[0].values(), data.items[0].pieces.rollout[0].values())

    # the long text: flow refused with the limit named, the view falls back to rollout
    tab.page.select_option(".hv-toolbar select >> nth=0", "1")
    tab.wait_ready(item=1, view="rollout")
    assert tab.page.is_disabled(".hv-views button[data-view='flow']")
    n = data.items[1].pieces.n
    assert tab.page.inner_text(".hv-view-hint") == f"(flow: texts of at most 12 word pieces; this one has {n})"
    tab.page.click(".hv-views button[data-view='pattern']")
    tab.wait_ready(view="pattern", item=1)
    assert tab.page.inner_text(".hv-head-title") == "Layer 0 · head 0"
    tab.assert_clean()


def test_word_level_rollout_is_pooled_from_the_pieces(tab: Tab, tmp_path: Path) -> None:
    model = tiny("bert")
    data = view_data(model, PLAIN)
    words = data.items[0].words
    assert words is not None and words.flow is not None
    open_viewer(tab, data, tmp_path / "view.html")
    tab.page.click(".hv-seg button[data-level='words']")
    tab.wait_ready(level="words")
    tab.page.click(".hv-views button[data-view='rollout']")
    tab.wait_ready(view="rollout", level="words", layer=0)
    tab.page.click(".hv-thumb[data-layer='1'][data-head='1']")
    tab.wait_ready(view="rollout", level="words", layer=1)
    assert "pooled from the pieces" in tab.page.inner_text(".hv-help >> nth=-1")
    pos = words.labels.index("and")
    to, frm = hover(tab, pos)
    patterns, units = captured_patterns(model, PLAIN)
    exact = pattern_to_words(rollout([patterns[0], patterns[1]]), units)[1].float().numpy()
    check_highlight(to, frm, words.rollout[1].values(), exact, pos)
    tab.shot("viewer-rollout-bert-words")
    tab.assert_clean()
