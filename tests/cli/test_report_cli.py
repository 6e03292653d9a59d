"""`headlab report` and the app around it, through typer's CliRunner."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import headlab.report.sections as registry
from headlab.cli import app
from headlab.report import ReportContext, Section

runner = CliRunner()

_HAS_INTEROP = importlib.util.find_spec("headlab.interop") is not None and (
    importlib.util.find_spec("headlab.interop.torch_mha") is not None
)


def _fail(ctx: ReportContext) -> str:
    raise RuntimeError("section exploded")


@pytest.mark.slow  # every default section with quick budgets: minutes on 2 cores (`make report` runs the same)
@pytest.mark.skipif(not _HAS_INTEROP, reason="headlab.interop.torch_mha is not importable yet (parity_suite missing)")
def test_report_quick_with_default_sections_exits_0_and_writes_index(tmp_path: Path) -> None:
    out = tmp_path / "rep"
    result = runner.invoke(app, ["report", "--out", str(out), "--quick"])
    assert result.exit_code == 0, result.output
    assert (out / "index.html").is_file()
    assert "index.html" in result.output and "ok" in result.output


def test_report_summarises_sections_and_exits_0_when_all_render(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, bool]] = []

    def render(ctx: ReportContext) -> str:
        seen.append((ctx.seed, ctx.quick))
        return "<p>fine</p>"

    monkeypatch.setattr(registry, "DEFAULT_SECTIONS", [Section("fine", "Fine section", render)])
    result = runner.invoke(app, ["report", "--out", str(tmp_path), "--seed", "3", "--quick"])
    assert result.exit_code == 0, result.output
    assert seen == [(3, True)]
    assert "Fine section" in result.output and "ok" in result.output
    assert "headlab report --out" in (tmp_path / "index.html").read_text()


def test_report_exits_1_and_names_the_failure_when_a_section_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry, "DEFAULT_SECTIONS", [Section("bad", "Bad section", _fail)])
    result = runner.invoke(app, ["report", "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "failed" in result.output and "section exploded" in result.output
    assert (tmp_path / "index.html").is_file()  # the page is still written, showing the error


def test_json_prints_the_summary_and_a_failed_section_still_exits_1(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    monkeypatch.setattr(registry, "DEFAULT_SECTIONS", [Section("fine", "Fine section", lambda ctx: "<p>fine</p>"),
                                                       Section("bad", "Bad section", _fail)])
    result = runner.invoke(app, ["report", "--out", str(tmp_path / "a"), "--quick", "--json"])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document == json.loads((tmp_path / "a" / "report.json").read_text())
    assert [(s["id"], s["ok"]) for s in document["sections"]] == [("fine", True), ("bad", False)]
    assert "section exploded" in document["sections"][1]["error"]
    refused = runner.invoke(app, ["report", "--out", str(tmp_path / "b"), "--json", "--serve"])
    assert refused.exit_code == 2 and "--json prints the summary and exits" in refused.output


def test_help_lists_the_report_command() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "report" in result.output
    sub = runner.invoke(app, ["report", "--help"])
    assert sub.exit_code == 0 and "--out" in sub.output and "--quick" in sub.output


def test_version_prints_the_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith("headlab ")


@pytest.mark.parametrize("args", [["report", "--bogus"], ["report", "--seed", "notanint"], ["nosuchcommand"]])
def test_bad_arguments_are_usage_errors(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2


def test_importing_the_cli_does_not_import_torch() -> None:
    # `headlab --help` must be instant: torch (~1 s to import) loads only inside command bodies.
    code = "import sys; import headlab.cli; print(sorted(m for m in ('torch', 'headlab.report') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"importing headlab.cli loaded {out.strip()}"


def test_model_and_text_reach_the_sections(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.tiny import save_causal_checkpoint

    model = str(save_causal_checkpoint(tmp_path / "tiny-gpt2"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one\ntwo\n")
    seen: list[tuple[str | None, Path | None]] = []

    def render(ctx: ReportContext) -> str:
        seen.append((ctx.model, ctx.text))
        return "<p>fine</p>"

    monkeypatch.setattr(registry, "DEFAULT_SECTIONS", [Section("fine", "Fine section", render)])
    out = tmp_path / "rep"
    result = runner.invoke(app, ["report", model, "--text", str(corpus), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert seen == [(model, corpus)]
    page = (out / "index.html").read_text()
    assert f"headlab report {model} --out {out} --seed 0 --text {corpus}" in page
    assert "tiny-gpt2 (GPT2LMHeadModel)" in page  # loaded before the sections, so the page names it


def test_a_missing_corpus_file_is_a_usage_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", "--text", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "missing.txt' does not exist" in " ".join(result.output.split())


def test_serve_serves_the_report_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import headlab.report.viewer.serve as serve_module

    calls = []
    monkeypatch.setattr(serve_module, "serve", lambda path, *, port, announce: calls.append((path, port)))
    monkeypatch.setattr(registry, "DEFAULT_SECTIONS", [Section("fine", "Fine", lambda ctx: "<p>ok</p>")])
    result = runner.invoke(app, ["report", "--out", str(tmp_path / "rep"), "--serve"])
    assert result.exit_code == 0, result.output
    assert calls == [(tmp_path / "rep", 0)]


def test_a_rerun_replaces_the_old_report_as_a_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "rep"
    monkeypatch.setattr(registry, "DEFAULT_SECTIONS", [Section("one", "One", lambda ctx: ctx.write_file(
        "assets/one.json", "{}") and "<p>one</p>")])
    assert runner.invoke(app, ["report", "--out", str(out)]).exit_code == 0
    monkeypatch.setattr(registry, "DEFAULT_SECTIONS", [Section("two", "Two", lambda ctx: "<p>two</p>")])
    result = runner.invoke(app, ["report", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.rglob("*")) == ["index.html", "report.json"]  # no asset of the old run
    assert "Report written to" in result.output and sorted(p.name for p in tmp_path.iterdir()) == ["rep"]
