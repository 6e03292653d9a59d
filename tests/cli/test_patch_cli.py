"""``headlab patch`` on the command line: MiniLM with the similarity metric, a saved causal
checkpoint with a logit difference, and one-line errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from headlab.cli import app

CLEAN, CORRUPT = "The cat sat on the mat.", "The dog sat on the mat."


def test_minilm_both_methods(tmp_path):
    result = CliRunner().invoke(app, ["patch", "--clean", CLEAN, "--corrupt", CORRUPT, "--out", str(tmp_path),
                                      "--layers", "4,5", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    exact, attribution = document["results"]
    assert (exact["method"], attribution["method"]) == ("activation", "attribution")
    assert exact["clean_metric"] == pytest.approx(1.0) and exact["corrupted_metric"] < 1.0
    assert {(r["layer"], r["head"]) for r in exact["heads"]["rows"]} == {(layer, h) for layer in (4, 5)
                                                                          for h in range(12)}
    assert (exact["forwards"], attribution["forwards"], attribution["backwards"]) == (26, 2, 1)
    assert -1.0 <= document["spearman"] <= 1.0
    assert json.loads((tmp_path / "patching.json").read_text()) == document
    assert (tmp_path / "patching.png").read_bytes()[:4] == b"\x89PNG"


def test_table_output(tmp_path):
    result = CliRunner().invoke(app, ["patch", "--clean", CLEAN, "--corrupt", CORRUPT, "--out", str(tmp_path),
                                      "--method", "attribution", "--top", "3"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "attribution effect" in result.output and "activation effect" not in result.output
    assert "2 forwards, 1 backwards" in result.output and "Spearman" not in result.output


@pytest.fixture(scope="module")
def causal_checkpoint(tmp_path_factory):
    from tests.support.tiny import save_causal_checkpoint

    return save_causal_checkpoint(tmp_path_factory.mktemp("tiny-gpt2"))


def test_a_causal_checkpoint_with_a_logit_difference(causal_checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["patch", str(causal_checkpoint), "--clean", "the cat sat on the",
                                      "--corrupt", "the dog sat on the", "--answer", "mat", "--wrong", "cat",
                                      "--method", "exact", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["metric"] == "logit('mat') − logit('cat') at the last position"
    assert len(document["results"][0]["heads"]["rows"]) == 8 and "spearman" not in document


@pytest.mark.parametrize("extra, message", [
    (["--corrupt", "The dog sat."], "same shape to patch between them"),
    (["--corrupt", ""], "--clean and --corrupt are both needed"),
    (["--corrupt", CORRUPT, "--metric", "loss"], "metric 'loss'; expected 'logit-diff'"),
    (["--corrupt", CORRUPT, "--metric", "logit-diff"], "needs --answer"),
    (["--corrupt", CORRUPT, "--method", "fast"], "--method: 'fast' is not one of exact, attribution, both"),
    (["--corrupt", CORRUPT, "--layers", "9"], "layers has layer 9, which does not exist"),
])
def test_bad_input_is_one_line(tmp_path, extra, message):
    result = CliRunner().invoke(app, ["patch", "--clean", CLEAN, *extra, "--out", str(tmp_path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output and message in said, result.output


def test_an_answer_of_several_tokens_is_named(causal_checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["patch", str(causal_checkpoint), "--clean", "the cat sat on the",
                                      "--corrupt", "the dog sat on the", "--answer", "matter", "--wrong", "cat",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--answer='matter' is" in " ".join(result.output.split())
