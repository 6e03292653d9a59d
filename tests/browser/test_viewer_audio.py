"""An audio model's viewer page (``headlab view MODEL WAV...``) in headless Chromium: a tiny random Whisper.

The page shows the encoder's frames as a strip of times beside the decoder's token. On a cross-attention head,
hovering the token must draw the open head's encoded row over the frames as heat (the weights drawn, each cell's
alpha), those must be the model's weights to within the encoding's step; on an encoder head, hovering a frame draws
its row over the frames and marks the column; the matrix is the site's rectangle.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import headlab
from headlab.capture import run_with_cache
from headlab.report.viewer import view_data
from tests.support.audio import save_whisper, write_wavs
from tests.support.browser import Tab, open_viewer

pytest.importorskip("transformers")
MAX_ALPHA = 0.85  # image.js's MAX_ALPHA: a frame's alpha at the row's largest weight on a frame
CROSS, ENCODER = (3, 2), (1, 0)  # (layer, head): a head of the first cross-attention site, one of the encoder's


def _frames(tab: Tab, attribute: str) -> np.ndarray:
    """Every frame cell's ``data-{attribute}`` as a number (NaN where it has none)."""
    read = f"c => c.dataset.{attribute} === undefined ? NaN : Number(c.dataset.{attribute})"
    return np.array(tab.page.eval_on_selector_all(".hv-frame", f"cells => cells.map({read})"))


def _alphas(tab: Tab) -> np.ndarray:
    """Every frame cell's background alpha, in [0, 1] (0 where it has no background)."""
    return np.array(tab.page.eval_on_selector_all(".hv-frame", """cells => cells.map(c => {
        const m = getComputedStyle(c).backgroundColor.match(/rgba?\\(([^)]*)\\)/);
        const parts = m ? m[1].split(',').map(Number) : [];
        return parts.length === 4 ? parts[3] : 0; })"""))


def test_hovering_the_token_of_a_cross_head_shows_its_row_over_the_frames(tab: Tab, tmp_path: Path) -> None:
    model = headlab.load(save_whisper(tmp_path / "whisper"))
    clips = write_wavs(tmp_path / "clips", n=2)
    data = view_data(model, clips)
    open_viewer(tab, data, tmp_path / "view.html")
    tab.page.select_option(".hv-toolbar select >> nth=0", "1")  # the second recording: 0.5 s, 8 frames of audio
    tab.wait_ready(item=1)
    assert tab.page.locator(".hv-frame").count() == 16 and tab.page.locator(".hv-frame.hv-pad").count() == 8
    assert tab.page.locator(".hv-frame >> nth=1").inner_text() == "0.06 s"
    assert tab.page.locator(".hv-tok").all_inner_texts() == ["tok 0"]

    tab.page.click(f".hv-thumb[data-layer='{CROSS[0]}'][data-head='{CROSS[1]}']")
    tab.wait_ready(layer=CROSS[0], head=CROSS[1], item=1)
    width, height = tab.page.evaluate("(m => [m.width, m.height])(document.querySelector('.hv-matrix'))")
    assert width > 4 * height  # 1 token × 16 frames: a wide rectangle (and its labels)
    tab.page.hover(".hv-tok[data-pos='0']")
    tab.page.wait_for_selector(".hv[data-focus='0'][data-focus-axis='tokens']")
    drawn = np.array(tab.page.evaluate("Array.from(window.headlabViewers[0].frameWeights)"))
    encoded = data.items[1].pieces.patterns[data.head_index(*CROSS)].values()  # (1 token, 16 frames)
    assert encoded.shape == (1, 16)
    np.testing.assert_allclose(drawn, encoded[0], rtol=1e-6, atol=1e-7)  # the token's row, over the frames
    np.testing.assert_allclose(_frames(tab, "to"), encoded[0], rtol=1e-6, atol=1e-7)
    exact = run_with_cache(model, model.inputs(clips[1]), take="pattern")["pattern", CROSS[0]][0, CROSS[1]].numpy()
    assert (np.abs(drawn - exact[0]) <= exact[0].max() / 510 + 1e-6).all()
    np.testing.assert_allclose(_alphas(tab), MAX_ALPHA * drawn / drawn.max(), atol=2 / 255)
    assert np.isnan(_frames(tab, "from")).all()  # the frames are no cross query
    tokens = tab.page.eval_on_selector_all(".hv-tok", "spans => spans.map(s => s.dataset.to === undefined)")
    assert tokens == [True]  # the token's weights went to the frames, not to the tokens

    # an encoder head: a hovered frame's row over the frames as heat, its column marked
    tab.page.click(f".hv-thumb[data-layer='{ENCODER[0]}'][data-head='{ENCODER[1]}']")
    tab.wait_ready(layer=ENCODER[0], head=ENCODER[1])
    tab.page.hover(".hv-frame[data-pos='5']")
    tab.page.wait_for_selector(".hv[data-focus='5'][data-focus-axis='frames']")
    encoder = data.items[1].pieces.patterns[data.head_index(*ENCODER)].values()  # (16, 16)
    np.testing.assert_allclose(tab.page.evaluate("Array.from(window.headlabViewers[0].frameWeights)"), encoder[5],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_frames(tab, "from"), encoder[:, 5], rtol=1e-6, atol=1e-7)
    assert tab.page.locator(".hv-frame.hv-focused").get_attribute("data-pos") == "5"
    width, height = tab.page.evaluate("(m => [m.width, m.height])(document.querySelector('.hv-matrix'))")
    assert width == height  # frames × frames: square
    tab.page.mouse.move(1, 1)  # off the strip: the heat goes
    tab.page.wait_for_function("!document.querySelector('.hv').dataset.focus")
    assert _alphas(tab).max() == 0
    tab.shot("viewer-audio")
    tab.assert_clean()
