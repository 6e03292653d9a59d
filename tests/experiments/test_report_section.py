"""The report sections of the experiments: one per experiment, rendered into a folder."""

from __future__ import annotations

import json

import pytest

from headlab.experiments import EXPERIMENTS
from headlab.report import build_report
from headlab.report.section import ReportContext
from headlab.report.sections.experiments import HEADS_VS_ONE, SECTIONS, render_experiment


def test_one_section_per_experiment():
    assert [s.id for s in SECTIONS] == [f"experiment-{name}" for name in EXPERIMENTS]
    assert len({s.title for s in SECTIONS}) == len(SECTIONS)


def test_questions_and_titles_are_in_words():
    # they once cited discussion threads by number, which are not in the repository
    for text in [s.title for s in SECTIONS] + [e.question for e in EXPERIMENTS.values()]:
        assert "thread" not in text.lower() and "../seeds" not in text and text, text


def test_section_renders_its_numbers_into_the_page(tmp_path):
    result = build_report(tmp_path, sections=[HEADS_VS_ONE], seed=1, quick=True, progress=False)
    assert result.sections[0].ok, result.sections[0].error
    page = (tmp_path / "index.html").read_text(encoding="utf-8")
    document = json.loads((tmp_path / "experiments" / "heads-vs-one.json").read_text())
    assert document["seed"] == 1
    assert (tmp_path / "assets" / "experiments" / "heads-vs-one.png").read_bytes().startswith(b"\x89PNG")
    assert "headlab experiment heads-vs-one --seed 1 --quick" in page
    drawn = document["as_drawn"]["standard"]["output_difference"]
    assert f"differ by {drawn:.0%}" in page  # the sentence carries the run's own number


def test_unknown_experiment(tmp_path):
    ctx = ReportContext(out_dir=tmp_path, assets_dir=tmp_path / "assets", seed=0, quick=True)
    with pytest.raises(ValueError, match="unknown experiment 'nope'"):
        render_experiment("nope", ctx)


@pytest.mark.slow
def test_every_section_renders_in_quick_mode(tmp_path):
    result = build_report(tmp_path, sections=list(SECTIONS), seed=0, quick=True, progress=False)
    assert all(s.ok for s in result.sections), [s.error for s in result.sections]
    for name in EXPERIMENTS:
        assert (tmp_path / "experiments" / f"{name}.json").exists()
        assert (tmp_path / "assets" / "experiments" / f"{name}.png").exists()
