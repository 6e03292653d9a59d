"""The standalone viewer (``headlab view``'s page) in headless Chromium: tiny random BERT and GPT-2.

Each test opens the page from file://, clicks a head's thumbnail, hovers a token and checks that
the highlight the page shows carries exactly the weights of the encoded pattern, and that those
are the model's weights to within the encoding's step; nothing the text holds may run.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import numpy as np

from headlab.capture import pattern_to_words
from headlab.report.viewer import ViewerData, view_data, viewer_document
from headlab.report.viewer.serve import local_server
from tests.support.browser import PLAIN, Tab, check_highlight, hover, open_viewer
from tests.support.reference import captured_patterns
from tests.support.text import WORDS
from tests.support.tiny import tiny

EVIL = ('the cat <script>window.__pwned = 1</script> sat on <img src=x onerror="window.__pwned = 2"> '
        'the xyzzy mat --> <!-- ran')


def test_bert_click_a_head_hover_a_token_and_nothing_in_the_text_runs(tab: Tab, tmp_path: Path) -> None:
    model = tiny("bert")
    data = view_data(model, [EVIL, PLAIN])
    open_viewer(tab, data, tmp_path / "view.html")

    assert tab.page.evaluate("window.__pwned") is None
    assert tab.page.locator("img").count() == 0  # the <img> of the text never became an element
    assert tab.page.locator("script").count() == 2  # the payload and the viewer, nothing from the text
    shown = tab.page.inner_text(".hv-text")
    assert "<script>window.__pwned = 1</script>" in shown and 'onerror="window.__pwned = 2">' in shown
    assert "<!-- ran" in shown

    tab.page.click(".hv-thumb[data-layer='1'][data-head='2']")
    tab.wait_ready(layer=1, head=2)
    assert tab.page.get_attribute(".hv-thumb[data-layer='1'][data-head='2']", "aria-pressed") == "true"
    assert tab.page.inner_text(".hv-head-title") == "Layer 1 · head 2"
    pos = 4
    to, frm = hover(tab, pos)
    patterns, _ = captured_patterns(model, EVIL)
    i = data.head_index(1, 2)
    check_highlight(to, frm, data.items[0].pieces.patterns[i].values(), patterns[1][2].numpy(), pos)
    # the strongest key gets the darkest blue, a zero weight no colour
    spans = tab.page.locator(".hv-tok")
    strongest = int(np.argmax(to))
    assert spans.nth(strongest).evaluate("s => getComputedStyle(s).backgroundColor").endswith(", 0.8)")
    assert tab.page.locator(".hv-focus").inner_text().startswith("“")
    # each head's statistics as measured on the texts
    entropy = tab.page.inner_text(".hv-stats tr[data-stat='entropy'] td.hv-num")
    assert entropy.startswith(f"{data.info[i].stats['entropy']:.2f} / ")
    tab.shot("viewer-bert-pieces")
    tab.assert_clean()


def test_bert_word_level_and_the_second_text(tab: Tab, tmp_path: Path) -> None:
    model = tiny("bert")
    data = view_data(model, [EVIL, PLAIN])
    open_viewer(tab, data, tmp_path / "view.html")
    tab.page.select_option(".hv-toolbar select >> nth=0", "1")
    tab.wait_ready(item=1)
    tab.page.click(".hv-seg button[data-level='words']")
    tab.wait_ready(level="words", item=1)
    words = data.items[1].words
    assert tab.page.locator(".hv-tok").count() == words.n
    pos = words.labels.index("and")
    assert words.pieces[pos] == 3 and tab.page.locator(".hv-tok").nth(pos).inner_text() == "and"
    tab.page.click(".hv-thumb[data-layer='0'][data-head='1']")
    tab.wait_ready(layer=0, head=1, level="words")
    to, frm = hover(tab, pos)
    patterns, units = captured_patterns(model, PLAIN)
    exact = pattern_to_words(patterns[0][1].double(), units).float().numpy()
    check_highlight(to, frm, words.patterns[data.head_index(0, 1)].values(), exact, pos)
    assert abs(to.sum() - 1) < 0.02  # a word's row still sums to one
    tab.shot("viewer-bert-words")
    tab.assert_clean()


def test_gpt2_causal_pattern_and_pinning_served_over_http(tab: Tab, tmp_path: Path) -> None:
    model = tiny("gpt2")
    data = view_data(model, PLAIN)
    page = tmp_path / "view.html"
    page.write_text(viewer_document(data), encoding="utf-8")
    server = local_server(page)  # what `headlab view --serve` runs
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tab.page.goto(server.url)
        tab.wait_ready()
        _check_causal(tab, model, data)
    finally:
        server.shutdown()
        server.server_close()


def _check_causal(tab: Tab, model, data: ViewerData) -> None:
    assert "causal" in tab.page.inner_text(".hv-about")
    tab.page.click(".hv-thumb[data-layer='1'][data-head='0']")
    tab.wait_ready(layer=1, head=0)
    pos = 5
    tab.page.click(f".hv-tok[data-pos='{pos}']")  # click pins the token
    tab.page.hover(".hv-tok[data-pos='9']")
    assert tab.page.get_attribute(".hv", "data-focus") == str(pos)
    to, frm = hover(tab, pos)
    assert (to[pos + 1:] == 0).all() and (frm[:pos] == 0).all()  # nothing attends to the future
    patterns, _ = captured_patterns(model, PLAIN)
    check_highlight(to, frm, data.items[0].pieces.patterns[data.head_index(1, 0)].values(), patterns[1][0].numpy(),
                     pos)
    tab.page.select_option(".hv-toolbar select", "linear")
    tab.wait_ready()
    tab.shot("viewer-gpt2")
    tab.assert_clean()


def test_two_thousand_tokens(tab: Tab, tmp_path: Path) -> None:
    model = tiny("bert", layers=2, heads=2)
    rng = random.Random(0)
    text = " ".join(rng.choice(WORDS) for _ in range(1998))
    data = view_data(model, text)
    n = data.items[0].pieces.n
    assert n == 2000
    open_viewer(tab, data, tmp_path / "long.html")
    assert tab.page.locator(".hv-tok").count() == n
    tab.page.click(".hv-thumb[data-layer='1'][data-head='1']")
    tab.wait_ready(layer=1, head=1)
    pos = 1500
    tab.page.locator(f".hv-tok[data-pos='{pos}']").scroll_into_view_if_needed()
    to, frm = hover(tab, pos)
    patterns, _ = captured_patterns(model, text)
    check_highlight(to, frm, data.items[0].pieces.patterns[data.head_index(1, 1)].values(),
                     patterns[1][1].numpy(), pos)
    size = tab.page.eval_on_selector(".hv-matrix", "c => [c.width, c.height]")
    assert size[0] == size[1] > 0
    tab.shot("viewer-2000-tokens")
    tab.assert_clean()


def test_a_text_whose_words_are_single_pieces_disables_the_word_switch(tab: Tab, tmp_path: Path) -> None:
    data = view_data(tiny("bert"), "the cat sat")
    assert data.items[0].words is None
    open_viewer(tab, data, tmp_path / "view.html")
    assert tab.page.is_disabled(".hv-seg button[data-level='words']")
    assert tab.page.get_attribute(".hv", "data-level") == "pieces"
    assert tab.page.inner_text(".hv-hint") == "(every word here is one piece)"
    tab.assert_clean()
