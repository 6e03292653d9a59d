"""Fixtures of the notebook tests: a tab of the session's Chromium (tests/conftest.py's ``browser``: Debian's
chromium driven by Playwright), and a page that holds notebook outputs the way a front end does.

``outputs_page(outputs, mode)`` writes the HTML of a list of outputs in one of three ways:

    "page"      the outputs one after another in the page's own markup, as nbconvert's HTML export and a
                saved notebook page have them: their scripts run while the page is parsed.
    "inserted"  an empty page that, once loaded, inserts each output as VS Code's notebook renderer does:
                the markup through innerHTML (scripts set that way never run), the output attached, then a
                copy of each script (its type kept, nothing else) added and removed again, which runs it.
    "detached"  as JupyterLab does with a trusted output: the markup through innerHTML into an element not
                yet in the page, each script replaced by a copy with all its attributes, then the element
                attached, which runs the copies.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
MODES = ("page", "inserted", "detached")

_LOADER = """
window.addEventListener("load", function () {
  var mode = document.body.dataset.mode;
  var outputs = JSON.parse(document.getElementById("outputs").textContent);
  outputs.forEach(function (html, i) {
    var box = document.createElement("section");
    box.className = "nb-output";
    box.dataset.output = String(i);
    box.innerHTML = html;
    if (mode === "inserted") document.body.appendChild(box);
    Array.prototype.slice.call(box.getElementsByTagName("script")).forEach(function (old) {
      var copy = document.createElement("script");
      if (mode === "inserted") {
        if (old.getAttribute("type")) copy.setAttribute("type", old.getAttribute("type"));
        copy.text = old.textContent;
        box.appendChild(copy);
        box.removeChild(copy);
      } else {
        for (var a = 0; a < old.attributes.length; a++) {
          copy.setAttribute(old.attributes[a].name, old.attributes[a].value);
        }
        copy.textContent = old.textContent;
        old.parentNode.replaceChild(copy, old);
      }
    });
    if (mode === "detached") document.body.appendChild(box);
  });
  document.body.dataset.loaded = "1";
});
"""


def outputs_page(outputs: Sequence[str], mode: str) -> str:
    """A page holding ``outputs`` (HTML strings) in ``mode`` (see the module docstring)."""
    from headlab.report.viewer.encoding import script_json

    if mode not in MODES:
        raise ValueError(f"mode {mode!r}; expected one of {MODES}")
    head = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>notebook outputs</title></head>'
    if mode == "page":
        body = "".join(f'<section class="nb-output" data-output="{i}">{html}</section>'
                       for i, html in enumerate(outputs))
        done = '<script>document.body.dataset.loaded = "1";</script>'
        return f'{head}<body data-mode="page">{body}{done}</body></html>\n'
    return (f'{head}<body data-mode="{mode}"><script type="application/json" id="outputs">{script_json(list(outputs))}'
            f"</script><script>{_LOADER}</script></body></html>\n")


class Tab:
    """A browser page with its console errors and uncaught exceptions on record."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: self.errors.append(f"uncaught: {error}"))

    def open(self, outputs: Sequence[str], mode: str, path: Path) -> None:
        """Write ``outputs_page(outputs, mode)`` to ``path``, open it and wait until the outputs are in."""
        path.write_text(outputs_page(outputs, mode), encoding="utf-8")
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-loaded='1']", state="attached")

    def hover(self, root: Any, pos: int) -> tuple[list[float], list[float]]:
        """Hover token ``pos`` of the viewer ``root`` (a locator); every token's ``(data-to, data-from)`` as the
        viewer set them (its test hooks, static/ui.js)."""
        root.locator(f".hv-tok[data-pos='{pos}']").hover()
        self.page.wait_for_function("([r, p]) => r.dataset.focus === String(p)", arg=[root.element_handle(), pos])
        values = root.locator(".hv-tok").evaluate_all("s => s.map(t => [Number(t.dataset.to), Number(t.dataset.from)])")
        return [v[0] for v in values], [v[1] for v in values]

    def assert_clean(self) -> None:
        """No console error and no uncaught exception so far."""
        assert self.errors == [], self.errors

    def shot(self, name: str) -> Path:
        """Save a screenshot of the whole page as test-artifacts/<name>.png (git-ignored), for people to look at."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """Each way a front end puts an output in its page (the module docstring)."""
    return request.param


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    yield Tab(context.new_page())
    context.close()
