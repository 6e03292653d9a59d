"""The viewer's circuit panel in headless Chromium: tiny random GPT-2 and grouped-query LLaMA with EAP scores.

Clicking a head lists its strongest incoming and outgoing edges as the scores rank them (labels, order, role
colours matching the legend); clicking the head at an edge's far end opens it, and an edge into a shared
key/value head leads to each query head that reads it; a text with markup in it stays text; without edge
scores there is no panel and no console error.
"""

from __future__ import annotations

from pathlib import Path

from headlab.report.viewer import view_data
from tests.support.browser import PLAIN, Tab, open_viewer
from tests.support.circuits import CLEAN, CORRUPTED, tiny_edges
from tests.support.tiny import tiny

EVIL = "the <b>dog</b> </script><img src=x onerror=\"window.__pwned = 1\">"


def _listed(tab: Tab, direction: str) -> list[str]:
    return tab.page.eval_on_selector_all(f".hv-circuit ol[data-direction='{direction}'] li.hv-edge",
                                         "lis => lis.map(li => li.dataset.label)")


def test_clicking_a_head_lists_its_strongest_edges_and_an_edge_leads_to_the_other_head(tab: Tab,
                                                                                     tmp_path: Path) -> None:
    scores = tiny_edges("gpt2")
    data = view_data(tiny("gpt2"), CLEAN, edges=scores, edge_texts=(EVIL, CORRUPTED), top_edges=3)
    open_viewer(tab, data, tmp_path / "view.html")
    assert tab.page.locator(".hv-circuit").count() == 1
    assert tab.page.evaluate("window.__pwned") is None and tab.page.locator("img").count() == 0
    assert EVIL in tab.page.inner_text(".hv-circuit-texts")  # the clean text as given, shown as text

    tab.page.click(".hv-thumb[data-layer='1'][data-head='2']")
    tab.wait_ready(layer=1, head=2)
    into = [e for e in scores.top(len(scores)) if e.receiver != "output" and e.receiver[:2] == (1, 2)]
    out = [e for e in scores.top(len(scores)) if e.sender == (1, 2)]
    assert _listed(tab, "in") == [e.label for e in into[:3]]
    assert _listed(tab, "out") == [e.label for e in out[:3]]
    assert "Circuit: layer 1 · head 2" in tab.page.inner_text(".hv-circuit h4")
    # each edge's role chip has its role's colour, the same as the legend's
    legend = dict(tab.page.eval_on_selector_all(
        ".hv-circuit-key", "ks => ks.map(k => [k.dataset.role, getComputedStyle(k.firstChild).backgroundColor])"))
    assert len(set(legend.values())) == 4
    for role, colour in tab.page.eval_on_selector_all(
            ".hv-edge", "lis => lis.map(li => [li.dataset.role, getComputedStyle(li.firstChild).backgroundColor])"):
        assert colour == legend[role]
    tab.shot("viewer-circuit-L1H2", ".hv-circuit")

    # the strongest incoming edge from a head: its sender opens
    sender = next(e.sender for e in into[:3] if e.sender != "input")
    tab.page.click(f".hv-circuit ol[data-direction='in'] .hv-edge-head[data-layer='{sender[0]}']"
                   f"[data-head='{sender[1]}'] >> nth=0")
    tab.wait_ready(layer=sender[0], head=sender[1])
    assert tab.page.get_attribute(f".hv-thumb[data-layer='{sender[0]}'][data-head='{sender[1]}']",
                                  "aria-pressed") == "true"
    assert _listed(tab, "in") == [e.label for e in scores.top(len(scores))
                                  if e.receiver != "output" and e.receiver[:2] == sender][:3]
    # and from there an outgoing edge leads back to layer 1
    tab.page.click(".hv-circuit ol[data-direction='out'] .hv-edge-head[data-layer='1'][data-head='2']")
    tab.wait_ready(layer=1, head=2)
    tab.assert_clean()


def test_an_edge_into_a_shared_key_value_head_leads_to_the_query_heads_that_read_it(tab: Tab,
                                                                                    tmp_path: Path) -> None:
    model, scores = tiny("llama"), tiny_edges("llama")
    open_viewer(tab, view_data(model, CLEAN, edges=scores, top_edges=50), tmp_path / "view.html")
    tab.page.click(".hv-thumb[data-layer='0'][data-head='2']")
    tab.wait_ready(layer=0, head=2)
    edge = ".hv-circuit ol[data-direction='out'] li[data-label='L0 H2 → L1 H1.k']"
    readers = tab.page.eval_on_selector_all(f"{edge} .hv-edge-head", "bs => bs.map(b => b.textContent)")
    assert readers == ["L1 H2", "L1 H3"]  # key/value head 1 of layer 1 is read by query heads 2 and 3
    tab.page.click(f"{edge} .hv-edge-head[data-head='3']")
    tab.wait_ready(layer=1, head=3)
    assert "L0 H2 → L1 H1.k" in _listed(tab, "in")
    assert "from key/value head 1, which heads H2, H3 share" in tab.page.inner_text(".hv-circuit")
    tab.assert_clean()


def test_without_edge_scores_there_is_no_panel(tab: Tab, tmp_path: Path) -> None:
    open_viewer(tab, view_data(tiny("gpt2"), PLAIN), tmp_path / "view.html")
    tab.page.click(".hv-thumb[data-layer='1'][data-head='1']")
    tab.wait_ready(layer=1, head=1)
    assert tab.page.locator(".hv-circuit").count() == 0
    assert tab.page.locator(".hv-left > .hv-panel").count() == 2  # the heads and the statistics, no empty box
    tab.assert_clean()
