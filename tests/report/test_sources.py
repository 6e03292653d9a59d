"""Where the report's numbers come from: the performance section says it measured nothing and records
the file it read, and the provenance statement names every such file beside "computed by this run"."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from headlab.bench import write_results
from headlab.bench.records import Comparison
from headlab.bench.timing import Timing
from headlab.report.provenance import ReadSource, collect_provenance, record_source, sources_read
from headlab.report.section import ReportContext
from headlab.report.sections import bench
from tests.support.bench import suite_result


def _plain(fragment: str) -> str:
    """The fragment's text: tags removed, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def _context(tmp_path: Path) -> ReportContext:
    return ReportContext(out_dir=tmp_path, assets_dir=tmp_path / "assets", seed=0, quick=True)


def test_the_statement_names_each_file_read_and_otherwise_claims_the_run(tmp_path: Path) -> None:
    alone = collect_provenance(seed=0, quick=True, command="headlab report")
    assert alone.statement().startswith("Every number above was computed by the run described here;")
    ctx = _context(tmp_path)
    assert sources_read(ctx) == ()
    record_source(ctx, ReadSource("Performance", "/x/RESULTS.json", "headlab bench on Xeon, 2026-01-01"))
    read = collect_provenance(seed=0, quick=True, command="headlab report", read=sources_read(ctx))
    assert read.statement() == (
        "Every number above was computed by the run described here except those of \u201cPerformance\u201d, read "
        "from /x/RESULTS.json and measured by headlab bench on Xeon, 2026-01-01. Rerunning the command with the "
        "same seed on the same software reproduces the numbers it computed.")
    assert read.to_dict()["read"] == ({"section": "Performance", "path": "/x/RESULTS.json",
                                       "measured": "headlab bench on Xeon, 2026-01-01"},)


def test_the_performance_section_says_it_read_its_numbers_and_records_from_where(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = suite_result()
    run.machine |= {"cpu": "Xeon", "logical cpus": "2"}
    write_results(run, tmp_path / "benchmarks" / "RESULTS.md")
    ctx = _context(tmp_path / "report")
    text = _plain(bench.render(ctx))
    path = tmp_path / "benchmarks" / "RESULTS.json"
    assert (f"Not measured by this report: every number in this section is read from {path}, written by "
            f"headlab bench --quick on Xeon (logical cpus 2), {run.started} — not by the run described at the end "
            "of the page") in text
    (source,) = sources_read(ctx)
    assert (source.section, source.path) == (bench.SECTION.title, str(path))
    assert source.measured == f"headlab bench --quick on Xeon (logical cpus 2), {run.started}"


def test_a_row_noisier_than_its_effect_is_marked_in_the_section() -> None:
    run = suite_result()
    noisy = Comparison("c", "half the heads pruned", "all heads", Timing((0.5, 2.27, 10.0)), Timing((1.0,) * 3))
    run.areas[0].rows = [noisy]
    text = _plain(bench.render_results({"cpu": run}, Path("/x/RESULTS.json")))
    assert "2.270, within noise" in text
    assert "1 of 1 rows cannot conclude" in text and "do not say which side is faster" in text


def test_the_page_footer_and_report_json_name_the_file_the_performance_section_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from headlab.report.build import build_report

    monkeypatch.chdir(tmp_path)
    write_results(suite_result(), tmp_path / "benchmarks" / "RESULTS.md")
    result = build_report(tmp_path / "report", sections=[bench.SECTION], progress=False, command="headlab report")
    footer = _plain(result.index.read_text().split("How this report was produced", 1)[1])
    path = tmp_path / "benchmarks" / "RESULTS.json"
    assert f"except those of \u201c{bench.SECTION.title}\u201d, read from {path}" in footer
    assert result.provenance["read"][0]["path"] == str(path)
