"""`headlab view` through typer's CliRunner, on a tiny random BERT saved to disk (no download)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.analysis.flow import FLOW_MAX_LENGTH
from headlab.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers")
    from tests.support.text import word_piece_tokenizer
    from tests.support.tiny import build

    tokenizer = word_piece_tokenizer()
    folder = tmp_path_factory.mktemp("tiny-bert")
    build("bert", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
          max_position_embeddings=64).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _payload(page: Path) -> dict:
    return json.loads(re.search(r'id="viewer-data">(.*?)</script>', page.read_text()).group(1))


def test_writes_a_standalone_page_and_prints_the_roles(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "v.html"
    result = runner.invoke(app, ["view", str(checkpoint), "the cat sat on the mat", "--out", str(out)])
    assert result.exit_code == 0, result.output
    payload = _payload(out)
    assert payload["items"][0]["text"] == "the cat sat on the mat" and len(payload["heads"]) == 8
    assert payload["name"] == checkpoint.name
    assert "Roles of 8 heads" in result.output and f"wrote {out}" in result.output.replace("\n", "")


def test_the_flow_limit_is_an_option(checkpoint: Path, tmp_path: Path) -> None:
    """Flow is solved for texts within --flow-max-length pieces (the default limit takes this short one);
    0 turns it off, and a negative limit is refused before the model runs."""
    for option, solved in (([], True), (["--flow-max-length", "0"], False)):
        out = tmp_path / f"v{len(option)}.html"
        result = runner.invoke(app, ["view", str(checkpoint), "the cat sat", "--out", str(out), *option])
        assert result.exit_code == 0, result.output
        payload = _payload(out)
        levels = [item[level] for item in payload["items"] for level in ("pieces", "words") if item[level]]
        assert levels and all((level["flow"] is not None) == solved for level in levels)
        assert payload["flowMaxLength"] == (0 if option else FLOW_MAX_LENGTH)
    refused = runner.invoke(app, ["view", str(checkpoint), "the cat", "--flow-max-length", "-1", "--out",
                                  str(tmp_path / "x.html")])
    assert refused.exit_code == 2 and "--flow-max-length" in refused.output and not (tmp_path / "x.html").exists()


def test_text_from_a_file_and_a_head_selection(checkpoint: Path, tmp_path: Path) -> None:
    text = tmp_path / "in.txt"
    text.write_text("a big red dog\nran on the mat\n", encoding="utf-8")
    out = tmp_path / "sub" / "v.html"
    result = runner.invoke(app, ["view", str(checkpoint), "--text", str(text), "--out", str(out), "--layers", "1",
                                 "--heads", "0,2"])
    assert result.exit_code == 0, result.output
    payload = _payload(out)
    assert payload["heads"] == [[1, 0], [1, 2]]
    assert payload["items"][0]["text"] == "a big red dog\nran on the mat\n"  # the whole file is one text


def test_json_prints_the_positions_and_each_heads_pattern_and_writes_no_page(
        checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default --out (view.html) would land here
    result = runner.invoke(app, ["view", str(checkpoint), "the cat sat", "--layers", "1", "--heads", "0,2", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(h["layer"], h["head"], h["axes"]) for h in document["heads"]] == [(1, 0, ["tokens", "tokens"]),
                                                                              (1, 2, ["tokens", "tokens"])]
    [item] = document["items"]
    tokens = item["positions"]["tokens"]
    assert item["text"] == "the cat sat" and tokens[0] == "[CLS]" and len(item["patterns"]) == 2
    for pattern in item["patterns"]:  # every row a distribution over the tokens, as the page draws it
        assert len(pattern) == len(tokens) and all(len(row) == len(tokens) for row in pattern)
        assert all(abs(sum(row) - 1) < len(tokens) / 255 for row in pattern)
    assert not list(tmp_path.iterdir())
    refused = runner.invoke(app, ["view", str(checkpoint), "the cat", "--json", "--serve"])
    assert refused.exit_code == 2 and "--json prints the data and writes no page" in refused.output


def test_truncation_is_printed(checkpoint: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["view", str(checkpoint), " ".join(["cat"] * 80), "--out", str(tmp_path / "v.html")])
    assert result.exit_code == 0, result.output
    assert "warning: 1 of 1 inputs are longer than max_length=64 pieces" in result.output.replace("\n", " ")


def test_serve_serves_the_written_file(checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import headlab.report.viewer.serve as serve_module

    calls = []
    monkeypatch.setattr(serve_module, "serve", lambda path, *, port, announce: calls.append((path, port)))
    out = tmp_path / "v.html"
    result = runner.invoke(app, ["view", str(checkpoint), "the cat", "--out", str(out), "--serve", "--port", "8123"])
    assert result.exit_code == 0, result.output
    assert calls == [(out, 8123)]


@pytest.mark.parametrize(("args", "message"), [
    (["view"], "give the text to view"),
    (["view", "a", "b", "c"], "expected [MODEL] TEXT, got 3 arguments"),
    (["view", "m", "x", "--text", "in.txt"], "with --text, give at most a MODEL"),
    (["view", "--text", "/no/such/file.txt"], "'/no/such/file.txt' does not exist"),
    (["view", "x", "--layers", "0,,1"], "'' is not a layer index ≥ 0 or a name"),
    (["view", "x", "--layers", "encoder,encoder"], "encoder is listed more than once"),
    (["view", "x", "--port", "70000"], "less than or equal to 65535"),
])
def test_bad_arguments_are_usage_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()), result.output


def test_a_layer_the_model_lacks_is_a_clear_error(checkpoint: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["view", str(checkpoint), "the cat", "--layers", "7", "--out",
                                 str(tmp_path / "v.html")])
    assert result.exit_code == 2 and "7" in result.output and "error" in result.output


@pytest.mark.parametrize(("args", "with_file", "expected"), [
    (["hello"], False, (None, "hello")),
    (["cats / dogs"], False, (None, "cats / dogs")),  # not an org/name id: spaces
    (["{dir}", "the cat"], False, ("{dir}", "the cat")),
    (["org/name", "the cat"], False, ("org/name", "the cat")),
    (["gpt2", "the cat"], False, ("gpt2", "the cat")),  # with a text after it, any first argument is the model
    ([], True, (None, "from the file\n")),
    (["org/name"], True, ("org/name", "from the file\n")),
    (["{dir}"], True, ("{dir}", "from the file\n")),
])
def test_which_argument_is_the_model_and_which_the_text(tmp_path: Path, args: list[str], with_file: bool,
                                                        expected: tuple[str | None, str]) -> None:
    from headlab.cli.view import _model_and_text

    (tmp_path / "in.txt").write_text("from the file\n", encoding="utf-8")
    fill = [None if a is None else a.replace("{dir}", str(tmp_path)) for a in expected]
    assert _model_and_text([a.replace("{dir}", str(tmp_path)) for a in args],
                           tmp_path / "in.txt" if with_file else None) == tuple(fill)


def test_help_states_the_argument_rule() -> None:
    output = runner.invoke(app, ["view", "--help"], env={"COLUMNS": "200"}).output
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())  # rich's help panels, without frame and breaks
    assert "A lone argument is the TEXT, unless it names a model (an existing directory or an org/name hub id)" in said
