"""headlab.show: one self-contained piece of HTML per output (the viewer's own style and script inlined, fresh
ids), and the viewer's data from a cache equal to what the cache kept (tiny random BERT and GPT-2)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import headlab
from headlab.analysis.flow import attention_flow, rollout
from headlab.capture import run_with_cache
from headlab.report.viewer import InlineViewer, asset_text, cache_view_data, show, view_data, viewer_document
from tests.support.tiny import tiny

EVIL = 'the cat <script>window.__pwned = 1</script> sat </style> on <!-- the --> mat'
PLAIN = "the big red dog ran on the mat, and the cat sat"


def _close(encoded: np.ndarray, exact: np.ndarray) -> None:
    """Encoded weights are the exact ones to within half a step of each row's largest weight."""
    step = exact.max(axis=1, keepdims=True) / 510 + 1e-6
    assert (np.abs(encoded - exact) <= step).all()


def test_the_inline_html_carries_everything_and_fresh_ids():
    viewer = show(tiny("bert"), [EVIL, PLAIN])
    first, second = viewer.html(), viewer.html()
    assert viewer._repr_html_() != first  # every output gets its own ids
    ids = [re.search(r'id="(hv-[0-9a-f]{16})"', html).group(1) for html in (first, second)]
    assert ids[0] != ids[1]
    for html, element_id in zip((first, second), ids):
        assert f'data-headlab-viewer="{element_id}-data"' in html and f'id="{element_id}-data"' in html
        # offline: the script and the style inline, nothing fetched
        assert asset_text("viewer.js") in html and asset_text("viewer.css") in html
        assert not re.search(r"<(link|img|iframe)\b|\bsrc=|https?://", html, flags=re.IGNORECASE)
        # the texts cannot close the payload's script (or open another) however they are written
        assert html.count("<script") == 2 and html.count("</script>") == 2 and "<!--" not in html
        assert "</style>" not in html.split("<style>", 1)[1].split("</style>", 1)[1]
        assert "The attention viewer did not start" in html  # what shows where no script runs


@pytest.mark.parametrize("name", ["viewer.js", "viewer.css"])
def test_the_assets_can_sit_inline(name):
    text = asset_text(name).lower()  # none of these may change how the page around them is parsed
    assert "<script" not in text and "</script" not in text and "</style" not in text and "<!--" not in text


def test_a_cache_shows_what_it_kept():
    model = tiny("gpt2")
    cache = run_with_cache(model, [PLAIN, "the cat sat"])  # two items: the second is padded on the right
    data = cache_view_data(cache, flow_max_length=12)
    assert data.heads == [(layer, h) for layer in range(2) for h in range(4)] and data.causal
    assert data.info[0].stats == {} and data.info[0].roles == ()
    for row, item in enumerate(data.items):
        n = len(cache.tokens[row])
        assert item.pieces.labels == cache.tokens[row] and item.pieces.n == n and item.words is None
        assert item.text == " ".join(cache.tokens[row]) and not any(item.pieces.special)
        for i, (layer, h) in enumerate(data.heads):
            _close(item.pieces.patterns[i].values(), cache["pattern", layer, h][row, :n, :n].numpy())
        means = [cache["pattern", layer][row, :, :n, :n].mean(0, keepdim=True) for layer in range(2)]
        for got, exact in zip(item.pieces.rollout, rollout(means)):
            _close(got.values(), exact.numpy())
        if n <= 12:
            for got, exact in zip(item.pieces.flow, attention_flow(means)):
                _close(got.values(), exact.numpy())
        else:
            assert item.pieces.flow is None
    assert [it.pieces.flow is None for it in data.items] == [True, False]
    assert not cache_view_data(run_with_cache(tiny("bert"), PLAIN)).causal


def test_a_cache_of_some_heads_has_no_rollout_and_says_why():
    cache = run_with_cache(tiny("bert"), PLAIN, heads={0: [1], 1: None})
    data = cache_view_data(cache, heads={1: [2]})
    assert data.heads == [(1, 2)] and data.items[0].pieces.rollout == [] and data.items[0].pieces.flow is None
    assert "every head of the layers from 0 on" in data.notes[0]
    with pytest.raises(ValueError, match=r"no pattern of heads \[\(0, 0\)\]"):
        cache_view_data(cache, heads={0: [0]})
    with pytest.raises(ValueError, match="kept no pattern"):
        cache_view_data(run_with_cache(tiny("bert"), PLAIN, take="z"))


def test_show_takes_a_model_with_texts_a_cache_or_data():
    model = tiny("bert")
    data = view_data(model, PLAIN)
    assert show(data).data is data
    assert isinstance(headlab.show(run_with_cache(model, PLAIN)), InlineViewer)
    with pytest.raises(TypeError, match=r"show\(model, text\)"):
        show(model)
    with pytest.raises(TypeError, match="texts are for a model"):
        show(run_with_cache(model, PLAIN), PLAIN)
    assert show(model, PLAIN, heads={1: [0]}).data.heads == [(1, 0)]


def test_reprs_are_one_line():
    viewer = show(tiny("bert"), [EVIL, PLAIN])
    for text in (repr(viewer), repr(viewer.data)):
        assert "\n" not in text and len(text) < 200 and "8 heads of tiny random bert" in text


def test_save_writes_the_standalone_page(tmp_path):
    viewer = show(run_with_cache(tiny("gpt2"), PLAIN))
    page = viewer.save(tmp_path / "out" / "view.html").read_text(encoding="utf-8")
    assert page == viewer_document(viewer.data) and "Content-Security-Policy" in page
