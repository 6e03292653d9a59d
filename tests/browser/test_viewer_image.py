"""An image model's viewer page (``headlab view MODEL IMAGE...``) in headless Chromium: a tiny random ViT, DINOv2 and
Swin (windowed attention: the heat on the open head's own stage grid).

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


def test_a_windowed_models_heat_is_on_the_open_heads_own_grid(tab: Tab, tmp_path: Path) -> None:
    """Swin on 16 × 16 pixels: layers 0 and 1 run on a 4 × 4 grid, layers 2 and 3 on 2 × 2 (each patch spanning 2 × 2
    first-stage patches). The page's positions are the first stage's; a stage-2 head's heat is its own row summed back
    onto its 2 × 2 grid, the model's weights to within the encoding's step."""
    from headlab.capture.images import capture_images

    model = headlab.load(save_vision(tmp_path / "swin", "swin"))
    pictures = write_images(tmp_path / "pictures", n=1)
    data = view_data(model, pictures)
    open_viewer(tab, data, tmp_path / "view.html")
    tab.page.click(".hv-thumb[data-layer='3'][data-head='1']")
    tab.wait_ready(layer=3, head=1)
    box = tab.page.locator(".hv-overlay").bounding_box()
    tab.page.mouse.move(box["x"] + box["width"] * 1.5 / 4, box["y"] + box["height"] * 2.5 / 4)  # first-stage r2c1
    tab.page.wait_for_selector(".hv[data-patch='1,0']")  # on the 2 × 2 grid: r1c0
    assert tab.page.get_attribute(".hv", "data-focus") == str(2 * 4 + 1)
    drawn = np.array(tab.page.evaluate("Array.from(window.headlabViewers[0].overlayWeights)"))
    fine = data.items[0].pieces.patterns[data.head_index(3, 1)].values()[2 * 4 + 1].reshape(2, 2, 2, 2)
    np.testing.assert_allclose(drawn, fine.sum((1, 3)).reshape(-1), rtol=1e-6, atol=1e-7)  # blocks summed back

    class Keep:
        def update(self, batch) -> None:
            self.pattern = batch.layers[3].pattern[0, 0].numpy()  # head 1 alone: (4, 4), the 2 × 2 grid's patches

    kept = Keep()
    capture_images(model, pictures, heads={3: [1]}, consumers=[kept], progress=False)
    exact = kept.pattern[2]  # query r1c0
    assert (np.abs(drawn - exact) <= 4 * exact.max() / 510 + 1e-6).all() and drawn.max() > 0
    np.testing.assert_allclose(_cell_alphas(tab, 2, 2), MAX_ALPHA * drawn / drawn.max(), atol=2 / 255)
    # a first-stage head draws on the 4 × 4 grid
    tab.page.click(".hv-thumb[data-layer='0'][data-head='0']")
    tab.wait_ready(layer=0, head=0)
    _hover_patch(tab, 0, 3, 4, 4)
    row = data.items[0].pieces.patterns[data.head_index(0, 0)].values()[3]
    np.testing.assert_allclose(tab.page.evaluate("Array.from(window.headlabViewers[0].overlayWeights)"), row,
                               rtol=1e-6, atol=1e-7)
    tab.shot("viewer-image-swin")
    tab.assert_clean()
