"""The report section: both audits side by side, verdicts, per-head tables, plot and JSON."""

from __future__ import annotations

import html
import json
from pathlib import Path

from headlab.report.section import ReportContext
from headlab.report.sections.audit import JSON_NAME, PLOT_NAME, SECTION, audit_pair, plot_same_slice


def test_section_renders_both_audits_with_their_evidence(tmp_path: Path) -> None:
    ctx = ReportContext(out_dir=tmp_path, assets_dir=tmp_path / "assets", seed=3, quick=True)
    fragment = SECTION.render(ctx)
    text = html.unescape(fragment)
    tutorial, standard = audit_pair(d_model=32, n_heads=4, seed=3)  # what quick mode audits
    assert ("The tutorial layer's heads do share their projections (each reads only its own slice); the standard "
            "layer's heads do not.") in text
    for result in (tutorial, standard):
        for line in result.verdict:
            assert line in text
    assert "<td>heads share W_QK</td><td>yes</td><td>no</td>" in fragment
    assert "<td>each head reads</td><td>narrow</td><td>wide</td>" in fragment
    assert (f"<td>parameters</td><td>{tutorial.parameters.module:,}</td><td>{standard.parameters.module:,}</td>"
            in fragment)
    assert "SliceSharedAttention: per head" in text and "MultiheadAttention: per head" in text
    doc = json.loads((tmp_path / JSON_NAME).read_text())
    assert [d["module"] for d in doc] == ["SliceSharedAttention", "MultiheadAttention"]
    assert doc[0]["shared"] is True and doc[1]["shared"] is False and doc[0]["evidence"]["same_slice_spread"] == 0.0
    svg = (tmp_path / PLOT_NAME).read_text()
    assert svg.lstrip().startswith("<?xml") and f'src="{PLOT_NAME}"' in fragment and f'href="{JSON_NAME}"' in fragment
    assert plot_same_slice((tutorial, standard)) == svg.encode()  # reproducible for the same seed
