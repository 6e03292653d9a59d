"""build_report: sections render in order, failures are contained and shown, output is self-contained."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import headlab.report.sections as registry
from headlab.report import Part, ReportContext, Section, build_report


def _ok(section_id: str, marker: str) -> Section:
    return Section(id=section_id, title=f"Title {section_id}", render=lambda ctx: f"<p>{marker}</p>")


def _boom(ctx: ReportContext) -> str:
    raise RuntimeError("kaboom in section")


def test_failing_section_shows_its_error_and_the_others_still_render(tmp_path: Path) -> None:
    sections = [_ok("first", "MARK-ONE"), Section("broken", "Broken", _boom), _ok("third", "MARK-THREE")]
    result = build_report(tmp_path, sections=sections, progress=False)
    html = result.index.read_text()

    assert [s.ok for s in result.sections] == [True, False, True]
    assert not result.ok
    assert result.sections[1].error == "RuntimeError: kaboom in section"
    assert "MARK-ONE" in html and "MARK-THREE" in html
    broken = html[html.index('id="broken"') : html.index('id="third"')]
    assert "RuntimeError: kaboom in section" in broken
    assert "<details><summary>Traceback</summary>" in broken
    assert "_boom" in broken  # the traceback names the failing function


def test_text_in_titles_and_errors_is_escaped(tmp_path: Path) -> None:
    def evil(ctx: ReportContext) -> str:
        raise ValueError("<script>alert('err')</script>")

    sections = [Section("evil", "<script>alert('title')</script>", evil)]
    html = build_report(tmp_path, sections=sections, progress=False).index.read_text()

    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(&#x27;title&#x27;)&lt;/script&gt;" in html
    assert "&lt;script&gt;alert(&#x27;err&#x27;)&lt;/script&gt;" in html


def test_table_of_contents_lists_every_section_and_the_footer(tmp_path: Path) -> None:
    sections = [_ok("alpha", "a"), _ok("beta", "b"), Section("gamma", "Title gamma", _boom)]
    html = build_report(tmp_path, sections=sections, progress=False).index.read_text()
    toc = re.search(r'<nav class="toc">(.*?)</nav>', html, re.DOTALL)
    assert toc is not None

    targets = re.findall(r'href="#([^"]+)"', toc.group(1))
    assert targets == ["alpha", "beta", "gamma", "provenance"]
    for s in sections:
        assert s.title in toc.group(1)
        assert f'id="{s.id}"' in html


def test_files_are_written_and_report_json_matches_the_result(tmp_path: Path) -> None:
    def with_asset(ctx: ReportContext) -> str:
        href = ctx.write_file("assets/data.json", '{"x": 1}')
        return f'<a href="{href}">data</a>'

    out = tmp_path / "nested" / "out"
    result = build_report(out, sections=[Section("asset", "Asset", with_asset)], seed=7, progress=False)

    assert result.index == out / "index.html" and result.index.is_file()
    assert json.loads((out / "assets" / "data.json").read_text()) == {"x": 1}
    assert 'href="assets/data.json"' in result.index.read_text()
    on_disk = json.loads((out / "report.json").read_text())
    assert on_disk == json.loads(json.dumps(result.to_dict()))
    assert on_disk["index"] == "index.html"  # relative: the folder can be moved, or built elsewhere and moved
    assert on_disk["sections"][0]["id"] == "asset" and on_disk["provenance"]["seed"] == 7
    assert not list(out.glob("*.tmp"))


def test_provenance_footer_names_versions_seed_and_command(tmp_path: Path) -> None:
    result = build_report(tmp_path, sections=[_ok("one", "x")], seed=1234, quick=True, progress=False,
                          command="headlab report --seed 1234 --quick")
    html = result.index.read_text()
    footer = html[html.index('id="provenance"') :]

    assert "How this report was produced" in footer
    assert torch.__version__ in footer
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in footer
    assert "<td>1234</td>" in footer
    assert "headlab report --seed 1234 --quick" in footer
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", footer)


def test_page_is_self_contained(tmp_path: Path) -> None:
    html = build_report(tmp_path, sections=[_ok("one", "x")], progress=False).index.read_text()
    assert html.startswith("<!DOCTYPE html>")
    assert "<style>" in html
    assert not re.search(r'(src|href)="(https?:)?//', html), "page must not load anything from the network"
    assert "<script" not in html
    assert re.findall(r"<link[^>]*>", html) == ['<link rel="icon" href="data:,">']


def test_default_sections_come_from_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "DEFAULT_SECTIONS", [_ok("registered", "FROM-REGISTRY")])
    result = build_report(tmp_path, progress=False)
    assert [s.id for s in result.sections] == ["registered"]
    assert "FROM-REGISTRY" in result.index.read_text()


def test_progress_bar_does_not_disturb_the_result(tmp_path: Path) -> None:
    result = build_report(tmp_path, sections=[_ok("one", "x"), _ok("two", "y")], progress=True)
    assert [s.ok for s in result.sections] == [True, True]
    assert all(s.seconds >= 0 for s in result.sections)


@pytest.mark.parametrize("ids", [["a", "a"], ["provenance"]])
def test_duplicate_or_reserved_ids_are_rejected(tmp_path: Path, ids: list[str]) -> None:
    with pytest.raises(ValueError, match=repr(ids[-1])):
        build_report(tmp_path, sections=[_ok(i, i) for i in ids], progress=False)


@pytest.mark.parametrize("bad", ["Has Space", "", "-lead", "UPPER", 'x"y'])
def test_section_ids_must_be_anchor_safe(bad: str) -> None:
    with pytest.raises(ValueError, match="section id"):
        Section(id=bad, title="t", render=lambda ctx: "")


@pytest.mark.parametrize("relpath", ["../escape.json", "/abs.json", "a/../../b"])
def test_assets_cannot_leave_the_report_folder(tmp_path: Path, relpath: str) -> None:
    ctx = ReportContext(out_dir=tmp_path / "r", assets_dir=tmp_path / "r" / "assets", seed=0, quick=False)
    with pytest.raises(ValueError, match="inside the report folder"):
        ctx.write_file(relpath, "x")


def test_parts_group_sections_number_them_and_link_across(tmp_path: Path) -> None:
    sections = [
        Part("q1", "First question?", "Why it <matters>.", sections=(_ok("a", "A"), Section("b", "B", _boom)),
             see_also=("c",)),
        Part("q2", "Unmeasured question?", "Nothing yet.", sections=()),
        _ok("c", "C"),
    ]
    result = build_report(tmp_path, sections=sections, progress=False)
    html = result.index.read_text()
    assert [s.id for s in result.sections] == ["a", "b", "c"] and [s.ok for s in result.sections] == [True, False, True]
    toc = re.search(r'<nav class="toc">(.*?)</nav>', html, re.DOTALL).group(1)
    assert re.findall(r'href="#([^"]+)"', toc) == ["q1", "a", "b", "q2", "c", "provenance"]
    part = html[html.index('id="q1"'):html.index('id="q2"')]
    assert 'id="a"' in part and 'id="b"' in part and "kaboom in section" in part
    assert "Why it &lt;matters&gt;." in part
    assert '<a href="#c">3 Title c</a>' in part  # see-also links carry the target's number and title
    assert ">1.1<" in part and ">1.2<" in part
    assert "No section of this build measures this yet." in html[html.index('id="q2"'):]


def test_part_ids_and_references_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'a'"):
        build_report(tmp_path, sections=[Part("a", "A", "", sections=(_ok("a", "x"),))], progress=False)
    with pytest.raises(ValueError, match="refers to \\['nowhere'\\]"):
        build_report(tmp_path, sections=[Part("p", "P", "", sections=(), see_also=("nowhere",))], progress=False)
    with pytest.raises(ValueError, match="part id"):
        Part("Bad Id", "t", "", sections=())


def test_model_and_text_reach_the_sections_and_the_provenance(tmp_path: Path) -> None:
    from tests.support.tiny import save_causal_checkpoint

    model = str(save_causal_checkpoint(tmp_path / "tiny-gpt2"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one line\nanother line\n")
    seen = []

    def record(ctx: ReportContext) -> str:
        seen.append((ctx.model, ctx.text))
        return "<p>seen</p>"

    result = build_report(tmp_path / "out", sections=[Section("rec", "Rec", record)], model=model,
                          text=corpus, progress=False)
    assert seen == [(model, corpus)]
    footer = result.index.read_text()
    assert "tiny-gpt2 (GPT2LMHeadModel)" in footer and f"{corpus} (2 items)" in footer  # checked, so loaded
    assert result.provenance["corpus"] == f"{corpus} (2 items)"
    default = build_report(tmp_path / "default", sections=[Section("rec", "Rec", record)], progress=False)
    assert "not loaded: no section needed it" in default.index.read_text()  # the packaged model loads on demand


def test_memo_computes_once_per_report(tmp_path: Path) -> None:
    calls = []

    def compute() -> int:
        calls.append(1)
        return 41 + len(calls)

    def first(ctx: ReportContext) -> str:
        assert ctx.memoized("value") is None
        return f"<p>{ctx.memo('value', compute)}</p>"

    def second(ctx: ReportContext) -> str:
        return f"<p>{ctx.memo('value', compute)} {ctx.memoized('value')}</p>"

    html = build_report(tmp_path, sections=[Section("one", "One", first), Section("two", "Two", second)],
                        progress=False).index.read_text()
    assert calls == [1] and "<p>42 42</p>" in html


@pytest.mark.parametrize(("inputs", "error", "message"), [
    ({"text": "empty.txt"}, ValueError, "has no item"),
    ({"text": "missing.txt"}, FileNotFoundError, "missing.txt' does not exist"),
    ({"model": "nope"}, FileNotFoundError, "nope: no such directory"),
])
def test_a_model_or_corpus_that_cannot_be_used_stops_the_build_before_any_section(
        tmp_path: Path, inputs: dict[str, str], error: type[Exception], message: str) -> None:
    (tmp_path / "empty.txt").write_text("\n\n")
    ran: list[str] = []
    section = Section("one", "One", lambda ctx: ran.append("one") or "<p>one</p>")
    with pytest.raises(error, match=message):
        build_report(tmp_path / "out", sections=[section], progress=False,
                     **{key: str(tmp_path / value) for key, value in inputs.items()})
    assert ran == [] and not (tmp_path / "out").exists()


def test_progress_is_a_line_per_section_where_stderr_is_not_a_terminal(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture) -> None:
    build_report(tmp_path, sections=[_ok("a", "A"), _ok("b", "B")], progress=True)
    assert capsys.readouterr().err.splitlines() == ["report: section 1/2: Title a", "report: section 2/2: Title b"]
