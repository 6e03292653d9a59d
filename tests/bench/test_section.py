"""The report section: the latest stored runs as tables, or a plain statement that none exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headlab.bench import write_results
from headlab.report import build_report
from headlab.report.sections.bench import JSON_NAME, SECTION, candidate_paths, find_results, render_results
from tests.support.bench import suite_result


def test_no_run_is_said_plainly() -> None:
    html = render_results({}, None)
    assert "No benchmark has been run" in html and "headlab bench --out benchmarks/RESULTS.md" in html


def test_a_run_shows_when_where_goals_and_every_row_escaped() -> None:
    run = suite_result()
    run.machine["cpu"] = "<Xeon & co>"
    run.areas[0].rows[0] = type(run.areas[0].rows[0])(**{**run.areas[0].rows[0].__dict__, "case": "<b>case</b>"})
    html = render_results({"cpu": run}, Path("/x/RESULTS.json"), json_href="bench.json")
    assert "&lt;Xeon &amp; co&gt;" in html and "<Xeon" not in html
    assert "&lt;b&gt;case&lt;/b&gt;" in html
    assert run.started in html and "headlab bench --quick" in html and "Goals met: 1 of 2" in html
    assert html.count('class="badge pass"') == 1 and html.count('class="badge fail"') == 1
    assert "No GPU table" in html and 'href="bench.json"' in html


def test_an_area_that_failed_shows_its_error_escaped() -> None:
    run = suite_result()
    run.areas[0].error = "RuntimeError: <a> & <b> disagree"
    html = render_results({"cpu": run}, Path("/x/RESULTS.json"))
    assert "<strong>Failed</strong>: RuntimeError: &lt;a&gt; &amp; &lt;b&gt; disagree" in html


def test_find_results_takes_the_first_existing_path(tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "RESULTS.json", tmp_path / "b" / "RESULTS.json"
    assert find_results([first, second]) is None
    second.parent.mkdir()
    second.write_text("{}")
    assert find_results([first, second]) == second
    assert candidate_paths()[0] == Path.cwd() / "benchmarks" / "RESULTS.json"


def test_section_renders_the_stored_run_in_a_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_results(suite_result(), tmp_path / "benchmarks" / "RESULTS.md")
    result = build_report(tmp_path / "report", sections=[SECTION], progress=False)
    assert result.sections[0].ok, result.sections[0].error
    page = result.index.read_text(encoding="utf-8")
    assert 'id="bench"' in page and "Layer" in page
    stored = json.loads((tmp_path / "report" / JSON_NAME).read_text(encoding="utf-8"))
    assert stored["cpu"]["command"] == "headlab bench --quick"
