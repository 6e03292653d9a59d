"""Inline viewers (``headlab.show``) as notebook outputs in headless Chromium: three on one page (a model run on
texts, a cache, and the first one shown again), put there the three ways front ends do (conftest.py). Each mounts,
draws, and answers a hover with the weights of its own payload, which are the model's to within the encoding's
step; hovering one leaves the others alone, and nothing the texts hold runs."""

from __future__ import annotations

from typing import Any

import numpy as np

import headlab
from headlab.capture import run_with_cache
from tests.support.tiny import tiny

EVIL = ('the cat <script>window.__pwned = 1</script> sat on <img src=x onerror="window.__pwned = 2"> '
        "the mat --> <!-- ran")
PLAIN = "the big red dog ran on the mat, and the cat sat"


def _check(to: list[float], frm: list[float], encoded: np.ndarray, exact: np.ndarray, pos: int) -> None:
    """The page shows the encoded weights, which are the model's to within half a step of each row's largest."""
    to_, frm_ = np.array(to), np.array(frm)
    np.testing.assert_allclose(to_, encoded[pos], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(frm_, encoded[:, pos], rtol=1e-6, atol=1e-7)
    step = exact.max(axis=1) / 510 + 1e-6
    assert (np.abs(to_ - exact[pos]) <= step[pos]).all() and (np.abs(frm_ - exact[:, pos]) <= step).all()


def test_three_viewers_on_one_page_mount_draw_and_answer_a_hover(tab: Any, tmp_path, mode: str) -> None:
    bert, gpt2 = tiny("bert"), tiny("gpt2")
    ran = headlab.show(bert, [EVIL, PLAIN])
    cache = run_with_cache(gpt2, PLAIN)
    kept = headlab.show(cache)
    tab.open([ran._repr_html_(), "<p>text between outputs</p>", kept._repr_html_(), ran._repr_html_()], mode,
             tmp_path / "outputs.html")
    tab.page.wait_for_function("document.querySelectorAll('.hv[data-ready=\"1\"]').length === 3")
    roots = [tab.page.locator(".hv").nth(i) for i in range(3)]
    ids = [root.get_attribute("id") for root in roots]
    assert len(set(ids)) == 3
    assert tab.page.evaluate("window.headlabViewers.length") == 3
    assert tab.page.evaluate("window.__pwned") is None and tab.page.locator("img").count() == 0
    assert "<script>window.__pwned = 1</script>" in roots[0].locator(".hv-text:not(.hv-target)").inner_text()

    for root, n in zip(roots, (8, 8, 8)):  # every head's thumbnail drawn, and the open head's matrix
        sizes = root.locator(".hv-thumb canvas").evaluate_all("cs => cs.map(c => c.width * c.height)")
        assert len(sizes) == n and min(sizes) > 0
        assert root.locator(".hv-matrix").evaluate("c => c.width") > 0
    # a drawn thumbnail is not blank: its pixels differ
    distinct = roots[1].locator(".hv-thumb canvas").first.evaluate(
        "c => new Set(Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)).size")
    assert distinct > 2

    # the cache's viewer: open layer 1 head 2 (a causal pattern), hover a token
    roots[1].locator(".hv-thumb[data-layer='1'][data-head='2']").click()
    tab.page.wait_for_function("r => r.dataset.ready === '1' && r.dataset.head === '2'", arg=roots[1].element_handle())
    pos = 5
    to, frm = tab.hover(roots[1], pos)
    assert all(w == 0 for w in to[pos + 1:])  # nothing attends to the future
    encoded = kept.data.items[0].pieces.patterns[kept.data.head_index(1, 2)].values()
    _check(to, frm, encoded, cache["pattern", 1, 2][0].numpy(), pos)
    assert [root.get_attribute("data-focus") for root in roots] == [None, str(pos), None]

    # the model's viewer shown a second time answers on its own
    roots[2].locator(".hv-thumb[data-layer='0'][data-head='3']").click()
    tab.page.wait_for_function("r => r.dataset.ready === '1' && r.dataset.head === '3'", arg=roots[2].element_handle())
    to, frm = tab.hover(roots[2], 4)
    exact = run_with_cache(bert, EVIL)["pattern", 0, 3][0].numpy()
    _check(to, frm, ran.data.items[0].pieces.patterns[ran.data.head_index(0, 3)].values(), exact, 4)
    assert roots[0].get_attribute("data-head") == "0" and roots[0].get_attribute("data-focus") is None
    tab.shot(f"notebook-inline-{mode}")
    tab.assert_clean()


def test_a_cache_of_some_heads_opens_patterns_only(tab: Any, tmp_path) -> None:
    viewer = headlab.show(run_with_cache(tiny("bert"), PLAIN, heads={1: [0, 2]}))
    tab.open([viewer._repr_html_()], "inserted", tmp_path / "outputs.html")
    tab.page.wait_for_selector(".hv[data-ready='1']")
    assert tab.page.locator(".hv-thumb").count() == 2
    assert tab.page.is_disabled(".hv-views button[data-view='rollout']")
    assert tab.page.is_disabled(".hv-views button[data-view='flow']")
    assert "every head of layers 0" in tab.page.inner_text(".hv-view-hint")
    assert "every head of the layers from 0 on" in tab.page.inner_text(".hv-notes")
    assert "No statistics for this view" in tab.page.inner_text(".hv-left")
    assert tab.page.locator(".hv-stats").count() == 0
    assert tab.page.locator(".hv-badge").count() == 0  # no role measured, so no "no role label" either
    tab.assert_clean()


def test_where_no_script_runs_the_output_says_so(tab: Any, tmp_path) -> None:
    html = headlab.show(tiny("bert"), PLAIN)._repr_html_()
    # what an untrusted notebook shows: the markup without its scripts
    tab.open([html.replace("<script>", '<script type="text/plain">')], "page", tmp_path / "outputs.html")
    assert "The attention viewer did not start" in tab.page.inner_text(".hv-root")
    tab.assert_clean()
