"""The circuits section: on the induction experiment's trained model (the run the experiment section made,
shared through the report's memo) and a saved causal checkpoint, it renders sentences generated from the
numbers it measured and writes them as JSON; its sentences follow synthetic verdicts."""

from __future__ import annotations

import html
import json
import re

import pytest

from headlab.report.section import ReportContext
from headlab.report.sections.circuits import TOP, induction_sentences, render
from tests.support.circuits import _trained
from tests.support.tiny import save_causal_checkpoint

pytest.importorskip("transformers")


def test_the_section_names_the_induction_circuit_and_the_models_edges(tmp_path):
    checkpoint = save_causal_checkpoint(tmp_path / "gpt2")
    ctx = ReportContext(out_dir=tmp_path / "report", assets_dir=tmp_path / "report" / "assets", seed=0, quick=True,
                        model=str(checkpoint))
    ctx.memo("experiment:induction", _trained)  # the experiment section's run, as the report shares it
    text = html.unescape(re.sub(r"<[^>]+>", " ", render(ctx)))
    induction = json.loads((ctx.out_dir / "assets/circuits/induction.json").read_text())
    model = json.loads((ctx.out_dir / "assets/circuits/model.json").read_text())
    assert "previous-token heads L0 H0" in text
    assert ("the previous-token head feeding the induction head through its key" in text  # every method, one edge
            or "goes from a previous-token head into an induction head" in text)  # every method, different pairs
    for method in ("path patching", "EAP", "EAP-IG (5 steps)"):
        assert induction[method]["edges"], method
    assert len(model["exact"]["edges"]) == TOP
    strongest = max(model["eap_ig"]["edges"], key=lambda e: abs(e["score"]))
    assert f"its strongest edge is {strongest['label']}" in text
    assert f"scores all {len(model['eap_ig']['edges'])} edges" in text
    assert (ctx.out_dir / "assets/circuits/composition.png").read_bytes()[:4] == b"\x89PNG"


def test_sentences_follow_the_verdicts():
    same = induction_sentences([("EAP", "L0 H0 → L1 H0.k", True), ("path patching", "L0 H0 → L1 H0.k", True)],
                               ["L0 H0"], ["L1 H0"])
    assert "Every method — EAP, path patching — names the same strongest edge between heads, L0 H0 → L1 H0.k" in same[1]
    apart = induction_sentences([("EAP", "L0 H0 → L1 H0.k", True), ("EAP-IG", "L0 H2 → L1 H3.k", True)],
                                ["L0 H0", "L0 H2"], ["L1 H0", "L1 H3"])
    assert "though they pick different pairs: EAP: L0 H0 → L1 H0.k; EAP-IG: L0 H2 → L1 H3.k." in apart[1]
    missed = induction_sentences([("EAP", "L0 H1 → L1 H0.v", False)], [], ["L1 H0"])
    assert missed[0].endswith("previous-token heads none and induction heads L1 H0.")
    assert "EAP: L0 H1 → L1 H0.v (not that circuit)" in missed[1]
