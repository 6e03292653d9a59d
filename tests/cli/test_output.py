"""Output locations: checked before any work, written through a temporary folder moved into place."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from headlab.cli.output import output_file, output_folder, staged_files, staged_folder


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden ones too) and its text."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder holding a file, a foreign folder, an empty folder and an earlier report."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    (tmp_path / "empty").mkdir()
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report.json").write_text("{}")
    (tmp_path / "old" / "stale.png").write_text("old plot")
    return tmp_path


@pytest.mark.parametrize(("path", "owner", "message"), [
    ("afile", None, "'afile' is a file; expected a folder"),
    ("afile/x", None, "'afile/x' lies below 'afile', which is a file"),
    ("afile/x/y", "report.json", "'afile/x/y' lies below 'afile', which is a file"),
    ("mine", "report.json", "'mine' is a folder that holds other files and no report.json"),
    (".", "report.json", "'.' is the current folder or contains it"),
    ("x" * 300, None, f"'{'x' * 300}' cannot be used: File name too long"),
])
def test_a_folder_that_cannot_be_written_is_refused(place: Path, path: str, owner: str | None, message: str) -> None:
    with pytest.raises(typer.BadParameter, match="^" + re.escape(message)) as err:
        output_folder(Path(path), owner=owner)
    assert err.value.param_hint == "--out"


@pytest.mark.parametrize(("path", "owner"), [
    ("new/deeper", "report.json"), ("empty", "report.json"), ("old", "report.json"), ("mine", None), (".", None),
])
def test_a_folder_that_can_be_written_is_accepted(place: Path, path: str, owner: str | None) -> None:
    assert output_folder(Path(path), owner=owner) == Path(path)


@pytest.mark.parametrize(("path", "message"), [
    ("mine", "'mine' is a folder; expected a file path, e.g. page.html"),
    ("afile/page.html", "'afile/page.html' lies below 'afile', which is a file"),
])
def test_a_file_path_that_cannot_be_written_is_refused(place: Path, path: str, message: str) -> None:
    with pytest.raises(typer.BadParameter, match="^" + re.escape(message)):
        output_file(Path(path), example="page.html")
    assert output_file(Path("afile"), example="page.html") == Path("afile")  # an existing file is replaced


def test_a_staged_folder_replaces_the_old_one_as_a_whole(place: Path) -> None:
    with staged_folder(Path("old")) as work:
        assert work.parent == place and work.name.startswith(".old.partial-") and not any(work.iterdir())
        (work / "report.json").write_text("new")
    assert _tree(place / "old") == {"report.json": "new"}  # no stale file from the earlier run
    assert sorted(p.name for p in place.iterdir()) == ["afile", "empty", "mine", "old"]


def test_a_staged_folder_may_lie_below_folders_that_do_not_exist_yet(place: Path) -> None:
    with staged_folder(Path("a/b/c")) as work:
        assert work.parent == place
        (work / "index.html").write_text("page")
    assert _tree(place / "a") == {"b/c/index.html": "page"}


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_a_staged_folder_interrupted_or_failing_leaves_the_old_one_as_it_was(place: Path,
                                                                             capsys: pytest.CaptureFixture,
                                                                             stop: type[BaseException]) -> None:
    before = _tree(place)
    with (pytest.raises(typer.Exit if stop is KeyboardInterrupt else stop) as err,  # noqa: PT012 - a stop mid-write
          staged_folder(Path("old")) as work):
        (work / "report.json").write_text("half")
        raise stop()
    assert _tree(place) == before and sorted(p.name for p in place.iterdir()) == ["afile", "empty", "mine", "old"]
    if stop is KeyboardInterrupt:
        assert err.value.exit_code == 1
        assert capsys.readouterr().err == "interrupted; old left as it was\n"


def test_staged_files_are_added_to_the_folder_and_the_rest_is_left_alone(place: Path) -> None:
    with staged_files(Path("mine")) as work:
        (work / "patching.json").write_text("{}")
        (work / "notes.txt").write_text("replaced")
    assert _tree(place / "mine") == {"notes.txt": "replaced", "patching.json": "{}"}
    with staged_files(Path("fresh")) as work:
        (work / "a.json").write_text("1")
    assert _tree(place / "fresh") == {"a.json": "1"}


def test_staged_files_interrupted_leave_the_folder_as_it_was(place: Path, capsys: pytest.CaptureFixture) -> None:
    before = _tree(place)
    with pytest.raises(typer.Exit), staged_files(place, shown=Path("view.html")) as work:  # noqa: PT012 - a stop mid-write
        (work / "view.html").write_text("half")
        raise KeyboardInterrupt
    assert _tree(place) == before and not (place / "view.html").exists()
    assert capsys.readouterr().err == "interrupted; view.html left as it was\n"


def test_bench_out_keeps_the_other_devices_run_through_the_staging(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """bench writes RESULTS.md and RESULTS.json in a temporary folder: the run stored there for another
    device must reach it, as it does when the files are written in place."""
    import json

    from typer.testing import CliRunner

    import headlab.bench
    from headlab.bench import read_results
    from headlab.cli import app

    stored = Path(__file__).parents[2] / "benchmarks" / "RESULTS.json"
    document = json.loads(stored.read_text(encoding="utf-8"))
    document["runs"] = {"cuda": document["runs"]["cpu"]}  # as if measured on a GPU earlier
    (tmp_path / "RESULTS.json").write_text(json.dumps(document), encoding="utf-8")
    monkeypatch.setattr(headlab.bench, "run_suite", lambda **options: read_results(stored)["cpu"])
    result = CliRunner().invoke(app, ["bench", "--out", str(tmp_path / "RESULTS.md")])
    assert result.exit_code == 0, result.output
    assert sorted(read_results(tmp_path / "RESULTS.md")) == ["cpu", "cuda"]
    assert "## CPU" in (tmp_path / "RESULTS.md").read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["RESULTS.json", "RESULTS.md"]
