"""The report in headless Chromium, with the real default model (MiniLM): opened from file:// and
served from 127.0.0.1; its viewer answers clicks and hovers with the payload's weights."""

from __future__ import annotations

import base64
import json
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest

from headlab.report import Part, ReportContext, Section, build_report
from headlab.report.sections import params, viewer
from headlab.report.viewer.serve import local_server
from tests.support.browser import Tab
from tests.support.minilm import minilm
from tests.support.reference import captured_patterns

EVIL_TITLE = "<script>window.__pwned = 1</script> evil title"


def _evil(ctx: ReportContext) -> str:
    raise ValueError('<img src=x onerror="window.__pwned = 2"> went wrong')


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    minilm()  # skips without the packaged model
    out = tmp_path_factory.mktemp("report")
    sections = [
        Part("heads", "The heads", "The viewer on the example sentences.", sections=(viewer.SECTION,)),
        Section("evil", EVIL_TITLE, _evil),
        params.SECTION,
    ]
    result = build_report(out, sections=sections, progress=False)
    assert [s.ok for s in result.sections] == [True, False, True]
    return out


def _payload(tab: Tab) -> dict:
    return json.loads(tab.page.inner_text("#attention-viewer-data"))


def _decode(pattern: dict) -> np.ndarray:
    n = pattern["n"]
    scale = np.frombuffer(base64.b64decode(pattern["scale"]), dtype="<f4").astype(np.float64)
    codes = np.frombuffer(zlib.decompress(base64.b64decode(pattern["codes"])), dtype=np.uint8).reshape(n, n)
    return codes * scale[:, None] / 255


def test_report_from_file_viewer_hover_errors_in_place_and_nothing_runs(tab: Tab, report: Path) -> None:
    tab.page.goto((report / "index.html").as_uri())
    tab.wait_ready()
    assert tab.page.evaluate("window.__pwned") is None
    assert tab.page.locator("#evil img").count() == 0
    assert "went wrong" in tab.page.inner_text("#evil") and "ValueError" in tab.page.inner_text("#evil")
    assert EVIL_TITLE in tab.page.inner_text("nav.toc")
    broken = tab.page.eval_on_selector_all("img", "imgs => imgs.filter(i => !(i.complete && i.naturalWidth > 0))"
                                                  ".map(i => i.src)")
    assert broken == [] and tab.page.locator("img").count() >= 1

    tab.page.click(".hv-thumb[data-layer='0'][data-head='2']")  # MiniLM's previous-token head
    tab.wait_ready(layer=0, head=2)
    pos = 6
    tab.page.hover(f".hv-tok[data-pos='{pos}']")
    tab.page.wait_for_selector(f".hv[data-focus='{pos}']")
    to = np.array(tab.page.eval_on_selector_all(".hv-tok", "s => s.map(x => Number(x.dataset.to))"))
    payload = _payload(tab)
    index = payload["heads"].index([0, 2])
    encoded = _decode(payload["items"][0]["pieces"]["patterns"][index])
    np.testing.assert_allclose(to, encoded[pos], rtol=1e-12, atol=1e-12)
    patterns, _ = captured_patterns(minilm(), viewer.EXAMPLES[0])
    exact = patterns[0][2].numpy()
    assert np.abs(to - exact[pos]).max() <= exact[pos].max() / 510 + 1e-6
    assert int(np.argmax(to)) == pos - 1  # it attends to the previous token
    assert "previous token" in tab.page.inner_text(".hv-badges")
    tab.page.click(f".hv-tok[data-pos='{pos}']")  # pinned: the focus survives the scroll of the screenshot
    tab.shot("report-viewer", "#viewer")
    tab.shot("report-full")
    tab.assert_clean()


def test_report_served_from_127_0_0_1_only_its_folder(tab: Tab, report: Path) -> None:
    server = local_server(report)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert server.server_address[0] == "127.0.0.1"
        tab.page.goto(server.url)
        tab.wait_ready()
        tab.page.click(".hv-thumb[data-layer='5'][data-head='11']")
        tab.wait_ready(layer=5, head=11)
        base = server.url.rsplit("/", 1)[0]
        assert tab.page.request.get(base + "/assets/viewer.js").status == 200
        for path in ("/%2e%2e/%2e%2e/etc/passwd", "/assets/", "/assets/..%2f..%2fetc%2fpasswd"):
            assert tab.page.request.get(base + path).status == 404, path  # more in tests/report/viewer/test_serve.py
        tab.assert_clean()
    finally:
        server.shutdown()
        server.server_close()
