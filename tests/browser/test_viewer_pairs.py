"""A text encoder-decoder's viewer page on a (source, target) pair (``headlab view MODEL --pair SOURCE TARGET``) in
headless Chromium: a tiny random BART with MiniLM's tokenizer.

The page shows the source and the target side by side. On a cross-attention head, hovering a target token must paint
the source tokens with that token's encoded row (data-to) and no target token; hovering a source token paints the
target tokens that attend to it (data-from); the matrix is the site's rectangle, target × source. On a decoder
self-attention head, a target token's row goes to the target tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import headlab
from headlab.capture import run_with_cache
from headlab.report.viewer import view_data
from tests.support.browser import Tab, open_viewer
from tests.support.families import FAMILIES
from tests.support.minilm import minilm_tokenizer

PAIR = ("The cat sat on the mat.", "Le chat dort.")
CROSS, DECODER = (3, 1), (2, 0)  # (layer, head): a head of the first cross-attention site, one of the decoder's self


def _spans(tab: Tab, strip: str, attribute: str) -> np.ndarray:
    """Every token span's ``data-{attribute}`` in ``strip`` (``.hv-text:not(.hv-target)`` or ``.hv-target``)."""
    read = f"s => s.dataset.{attribute} === undefined ? NaN : Number(s.dataset.{attribute})"
    return np.array(tab.page.eval_on_selector_all(f"{strip} .hv-tok", f"spans => spans.map({read})"))


def test_a_pair_shows_source_and_target_and_cross_heads_read_across(tab: Tab, tmp_path: Path) -> None:
    tokenizer = minilm_tokenizer()
    model = headlab.attach(FAMILIES["bart"].build(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                                  decoder_start_token_id=tokenizer.cls_token_id), tokenizer=tokenizer)
    data = view_data(model, PAIR)
    source, target = data.items[0].pieces, data.items[0].target
    assert target is not None and data.axes is not None
    assert data.axes[data.head_index(*CROSS)] == ("target", "tokens")
    open_viewer(tab, data, tmp_path / "view.html")
    source_strip, target_strip = ".hv-text:not(.hv-target)", ".hv-target"
    assert tab.page.locator(f"{source_strip} .hv-tok").all_inner_texts() == source.labels
    assert tab.page.locator(f"{target_strip} .hv-tok").all_inner_texts() == target.labels
    assert target.labels[:3] == ["[CLS]", "[CLS]", "Le"]  # the start token, then the target shifted

    tab.page.click(f".hv-thumb[data-layer='{CROSS[0]}'][data-head='{CROSS[1]}']")
    tab.wait_ready(layer=CROSS[0], head=CROSS[1])
    tab.page.hover(f"{target_strip} .hv-tok[data-pos='2']")
    tab.page.wait_for_selector(".hv[data-focus='2'][data-focus-axis='target']")
    encoded = data.items[0].pieces.patterns[data.head_index(*CROSS)].values()  # (target, source)
    assert encoded.shape == (target.n, source.n)
    np.testing.assert_allclose(_spans(tab, source_strip, "to"), encoded[2], rtol=1e-6, atol=1e-7)
    assert np.isnan(_spans(tab, target_strip, "to")).all()  # its weights went to the source
    exact = run_with_cache(model, model.inputs(PAIR), take="pattern")["pattern", CROSS[0]][0, CROSS[1]].numpy()
    assert (np.abs(encoded[2] - exact[2]) <= exact[2].max() / 510 + 1e-6).all()
    width, height = tab.page.evaluate("(m => [m.width, m.height])(document.querySelector('.hv-matrix'))")
    assert width > height  # fewer target positions than source ones: wider than high

    tab.page.mouse.move(1, 1)
    tab.page.wait_for_function("!document.querySelector('.hv').dataset.focus")
    tab.page.hover(f"{source_strip} .hv-tok[data-pos='3']")
    tab.page.wait_for_selector(".hv[data-focus='3'][data-focus-axis='tokens']")
    np.testing.assert_allclose(_spans(tab, target_strip, "from"), encoded[:, 3], rtol=1e-6, atol=1e-7)

    tab.page.click(f".hv-thumb[data-layer='{DECODER[0]}'][data-head='{DECODER[1]}']")
    tab.wait_ready(layer=DECODER[0], head=DECODER[1])
    tab.page.hover(f"{target_strip} .hv-tok[data-pos='4']")
    tab.page.wait_for_selector(".hv[data-focus='4'][data-focus-axis='target']")
    decoder = data.items[0].pieces.patterns[data.head_index(*DECODER)].values()  # (target, target), causal
    np.testing.assert_allclose(_spans(tab, target_strip, "to"), decoder[4], rtol=1e-6, atol=1e-7)
    assert (decoder[4, 5:] == 0).all()
    tab.shot("viewer-pairs")
    tab.assert_clean()


@pytest.fixture(autouse=True)
def _transformers() -> None:
    pytest.importorskip("transformers")
