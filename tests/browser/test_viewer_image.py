"""An image model's viewer page (``headlab view MODEL IMAGE...``) in headless Chromium: a tiny random ViT and DINOv2.

Hovering a patch of the picture focuses its position: the heat over the picture must carry exactly the open head's
encoded row over the patch keys (the weights drawn, and each cell's alpha on the overlay canvas), those must be the
model's weights to within the encoding's step, and the token list highlights the same row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import headlab
from headlab.capture import run_with_cache
from headlab.report.viewer import view_data
from tests.support.browser import Tab, open_viewer
from tests.support.vision import save_vision, write_images

pytest.importorskip("transformers")
MAX_ALPHA = 0.85  # image.js's MAX_ALPHA: a cell's alpha at its row's largest weight on a patch


def _hover_patch(tab: Tab, row: int, column: int, rows: int, columns: int) -> None:
    """Move the mouse to the centre of patch (row, column) of the picture and wait until the page focused it."""
    box = tab.page.locator(".hv-overlay").bounding_box()
    tab.page.mouse.move(box["x"] + box["width"] * (column + 0.5) / columns,
                        box["y"] + box["height"] * (row + 0.5) / rows)
    tab.page.wait_for_selector(f".hv[data-patch='{row},{column}']")


def _cell_alphas(tab: Tab, rows: int, columns: int) -> np.ndarray:
    """The overlay canvas's alpha at the centre of every cell, row-major, in [0, 1]."""
    return np.array(tab.page.evaluate(
        """([rows, columns]) => {
          const canvas = document.querySelector('.hv-overlay'), ctx = canvas.getContext('2d'), out = [];
          for (let r = 0; r < rows; r++) for (let c = 0; c < columns; c++) {
            const x = Math.floor(canvas.width * (c + 0.5) / columns), y = Math.floor(canvas.height * (r + 0.5) / rows);
            out.push(ctx.getImageData(x, y, 1, 1).data[3] / 255);
          }
          return out;
        }""", [rows, columns]))


@pytest.mark.parametrize(("kind", "first"), [("vit", 1), ("dinov2", 3)])
def test_hovering_a_patch_shows_the_heads_row_as_heat(tab: Tab, tmp_path: Path, kind: str, first: int) -> None:
    model = headlab.load(save_vision(tmp_path / kind, kind))
    pictures = write_images(tmp_path / "pictures", n=2)
    data = view_data(model, pictures)
    open_viewer(tab, data, tmp_path / "view.html")
    assert tab.page.locator(".hv-picture").get_attribute("src").startswith("data:image/png;base64,")
    tab.page.select_option(".hv-toolbar select >> nth=0", "1")  # the second image
    tab.wait_ready(item=1)
    tab.page.click(".hv-thumb[data-layer='1'][data-head='2']")
    tab.wait_ready(layer=1, head=2, item=1)

    row, column = 2, 1
    _hover_patch(tab, row, column, 4, 4)
    pos = first + row * 4 + column
    assert tab.page.get_attribute(".hv", "data-focus") == str(pos)
    drawn = np.array(tab.page.evaluate("Array.from(window.headlabViewers[0].overlayWeights)"))
    encoded = data.items[1].pieces.patterns[data.head_index(1, 2)].values()
    np.testing.assert_allclose(drawn, encoded[pos, first:], rtol=1e-6, atol=1e-7)  # the row, over the patches
    exact = run_with_cache(model, model.inputs(pictures[1]), take="pattern")["pattern", 1][0, 2].numpy()
    assert (np.abs(drawn - exact[pos, first:]) <= exact[pos].max() / 510 + 1e-6).all()
    assert drawn.max() > 0
    np.testing.assert_allclose(_cell_alphas(tab, 4, 4), MAX_ALPHA * drawn / drawn.max(), atol=2 / 255)
    # the token list highlights the same row, the hovered patch outlined
    to = tab.page.eval_on_selector_all(".hv-tok", "spans => spans.map(s => Number(s.dataset.to))")
    np.testing.assert_allclose(to, encoded[pos], rtol=1e-6, atol=1e-7)
    assert tab.page.locator(".hv-tok.hv-focused").inner_text() == f"patch r{row}c{column}"
    # another head redraws the heat of its own row
    tab.page.click(".hv-thumb[data-layer='0'][data-head='1']")
    tab.wait_ready(layer=0, head=1)
    _hover_patch(tab, 0, 3, 4, 4)
    other = data.items[1].pieces.patterns[data.head_index(0, 1)].values()[first + 3, first:]
    np.testing.assert_allclose(tab.page.evaluate("Array.from(window.headlabViewers[0].overlayWeights)"), other,
                               rtol=1e-6, atol=1e-7)
    tab.page.mouse.move(1, 1)  # off the picture: the heat goes
    tab.page.wait_for_function("!document.querySelector('.hv').dataset.patch")
    assert _cell_alphas(tab, 4, 4).max() == 0
    tab.shot(f"viewer-image-{kind}")
    tab.assert_clean()
