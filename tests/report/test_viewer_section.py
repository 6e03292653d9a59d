"""The report's viewer section: the example sentences, the viewer's assets, corpus roles when the analysis ran,
a circuit panel when a section shared edge scores."""

from __future__ import annotations

import json
import re
from pathlib import Path

from headlab.report import ReportContext
from headlab.report.sections import viewer
from headlab.report.viewer import asset_text
from tests.support.circuits import CLEAN, CORRUPTED, tiny_edges
from tests.support.tiny import tiny


def _ctx(tmp_path: Path) -> ReportContext:
    ctx = ReportContext(out_dir=tmp_path, assets_dir=tmp_path / "assets", seed=0, quick=True)
    ctx.memo("model", lambda: tiny("gpt2"))
    return ctx


def _payload(fragment: str) -> dict:
    return json.loads(re.search(r'id="attention-viewer-data">(.*?)</script>', fragment).group(1))


def test_fragment_links_its_assets_and_carries_every_example(tmp_path: Path) -> None:
    fragment = viewer.render(_ctx(tmp_path))
    assert '<link rel="stylesheet" href="assets/viewer.css">' in fragment
    assert '<script src="assets/viewer.js"></script>' in fragment
    assert (tmp_path / "assets" / "viewer.js").read_text() == asset_text("viewer.js")
    payload = _payload(fragment)
    assert [item["text"] for item in payload["items"]] == list(viewer.EXAMPLES)
    assert payload["causal"] and payload["nHeads"] == [4, 4]
    assert all(info["corpus"] is None for info in payload["info"])
    assert "measured on these sentences only" in fragment


def test_corpus_rows_of_the_analysis_are_shown_when_it_ran(tmp_path: Path) -> None:
    class Analysis:
        def rows(self) -> list[dict]:
            return [{"layer": 0, "head": 1, "roles": "previous_token", "importance_gradient": 0.25}]

    ctx = _ctx(tmp_path)
    ctx.memo("analysis", Analysis)
    fragment = viewer.render(ctx)
    corpus = {(i["layer"], i["head"]): i["corpus"] for i in _payload(fragment)["info"]}
    assert corpus[(0, 1)]["roles"] == "previous_token" and corpus[(0, 0)] is None
    assert "on the corpus (from the analysis above)" in fragment


def test_edge_scores_a_section_shared_give_the_viewer_a_circuit_panel(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    assert _payload(viewer.render(ctx))["circuit"] is None
    ctx.memo(viewer.EDGES, lambda: tiny_edges("gpt2"))
    ctx.memo(viewer.EDGE_TEXTS, lambda: (CLEAN, CORRUPTED))
    fragment = viewer.render(ctx)
    circuit = _payload(fragment)["circuit"]
    assert circuit["method"] == "eap" and (circuit["clean"], circuit["corrupted"]) == (CLEAN, CORRUPTED)
    assert set(circuit["heads"]) == {f"{layer}.{h}" for layer in range(2) for h in range(4)}
    assert "The circuit panel lists the open head" in fragment
