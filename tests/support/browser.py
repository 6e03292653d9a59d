"""What the browser tests share: a ``Tab`` (a page with its console errors on record), and the viewer
steps they repeat: open a viewer document, hover a token, check the highlight against the patterns.

The browser is Debian's ``chromium`` (browsers cannot be downloaded here); screenshots go to
test-artifacts/ (git-ignored) for people to look at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
PLAIN = "the big red dog ran on the mat, and the cat sat"  # a short text without markup


@dataclass
class Tab:
    """A browser page with its console errors on record."""

    page: Any
    errors: list[str] = field(default_factory=list)

    def shot(self, name: str, selector: str | None = None) -> Path:
        """Save a screenshot as test-artifacts/<name>.png: of the element ``selector``, or of the whole page."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        if selector is None:
            self.page.screenshot(path=str(path), full_page=True)
        else:
            self.page.locator(selector).screenshot(path=str(path))
        return path

    def wait_ready(self, root: str = ".hv", **attributes: object) -> None:
        """Wait until the viewer ``root`` has rendered (``data-ready="1"``) with the given data attributes."""
        selector = root + "[data-ready='1']" + "".join(f"[data-{k}='{v}']" for k, v in attributes.items())
        self.page.wait_for_selector(selector, timeout=30_000)

    def assert_clean(self) -> None:
        """No console error and no uncaught exception so far."""
        assert self.errors == [], self.errors


def open_viewer(tab: Tab, data: Any, path: Path) -> None:
    """Write ``data``'s viewer document (a ``ViewerData``) to ``path``, open it and wait until it has drawn."""
    from headlab.report.viewer import viewer_document

    path.write_text(viewer_document(data), encoding="utf-8")
    tab.page.goto(path.as_uri())
    tab.wait_ready()


def hover(tab: Tab, pos: int) -> tuple[np.ndarray, np.ndarray]:
    """Hover token ``pos``; returns every token's (data-to, data-from) as the page set them."""
    tab.page.hover(f".hv-tok[data-pos='{pos}']")
    tab.page.wait_for_selector(f".hv[data-focus='{pos}']")
    values = tab.page.eval_on_selector_all(".hv-tok", "spans => spans.map(s => [Number(s.dataset.to), "
                                                      "Number(s.dataset.from)])")
    values = np.array(values)
    return values[:, 0], values[:, 1]


def check_highlight(to: np.ndarray, frm: np.ndarray, encoded: np.ndarray, exact: np.ndarray, pos: int) -> None:
    """Token ``pos``'s highlight (``hover``'s weights to and from it) against the encoded pattern and the exact one."""
    # the page shows the encoded weights (float32 arithmetic in Python, float64 in the browser) ...
    np.testing.assert_allclose(to, encoded[pos], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(frm, encoded[:, pos], rtol=1e-6, atol=1e-7)
    # ... which are the model's to within half a step of each row's largest weight
    step = exact.max(axis=1) / 510 + 1e-6
    assert (np.abs(to - exact[pos]) <= step[pos]).all()
    assert (np.abs(frm - exact[:, pos]) <= step).all()
