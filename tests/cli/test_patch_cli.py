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
    assert "(one run; headlab bench compares the methods' speed, interleaved)" in " ".join(result.output.split())


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
    (["--corrupt", CORRUPT, "--metric", "logit-diff", "--answer", "cat", "--wrong", "dog"],
     "the logit-diff metric needs logits; BertModel outputs hidden states"),
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


def test_each_position_of_k_noised(causal_checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["patch", str(causal_checkpoint), "--clean", "the cat sat on the",
                                      "--corrupt", "the dog sat on the", "--answer", "mat", "--wrong", "cat",
                                      "--positions", "each", "--take", "k", "--direction", "noise",
                                      "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert (document["positions"], document["take"], document["direction"]) == ("each", "k", "noise")
    exact, attribution = document["results"]
    grid = exact["grid"]
    assert grid["tokens"] == ["[CLS]", "the", "cat", "sat", "on", "the", "[SEP]"]
    assert grid["corrupted_tokens"][2] == "dog" and exact["unit"] == "kv_head"
    assert len(grid["rows"]) == 8 and all(len(row) == 7 for row in grid["effect"])
    assert (exact["forwards"], attribution["forwards"]) == (2 + 8 * 7, 2) and -1 <= document["spearman"] <= 1
    assert (tmp_path / "patching.png").read_bytes()[:4] == b"\x89PNG"


def test_positions_patched_together_and_the_grid_table(causal_checkpoint, tmp_path):
    args = ["patch", str(causal_checkpoint), "--clean", "the cat sat on the", "--corrupt", "the dog sat on the",
            "--answer", "mat", "--wrong", "cat", "--method", "exact", "--out", str(tmp_path)]
    together = CliRunner().invoke(app, [*args, "--positions", "2,-1", "--take", "pattern", "--json"])
    assert together.exit_code == 0, together.output
    document = json.loads(together.stdout)
    assert document["positions"] == [2, 6] and "grid" not in document["results"][0]
    table = CliRunner().invoke(app, [*args, "--positions", "each", "--top", "3"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "Heads and positions by |effect| of z" in table.output and "position" in table.output
    assert table.output.count("activation effect") == 1


@pytest.mark.parametrize("extra, message", [
    (["--take", "o"], "--take: 'o' is not one of z, q, k, v, pattern"),
    (["--direction", "up"], "--direction: 'up' is not one of denoise, noise"),
    (["--positions", "1,x"], "'x' is not a position (got --positions='1,x'; expected each, or positions"),
    (["--take", "pattern"], "--take: pattern has no attribution estimate; use --method exact"),
])
def test_bad_position_options_are_one_line_before_the_model_loads(tmp_path, extra, message):
    result = CliRunner().invoke(app, ["patch", "no-such-model", "--clean", CLEAN, "--corrupt", CORRUPT, *extra,
                                      "--out", str(tmp_path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output and message in said, result.output


def test_a_position_out_of_range_is_one_line(causal_checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["patch", str(causal_checkpoint), "--clean", "the cat sat on the",
                                      "--corrupt", "the dog sat on the", "--answer", "mat", "--wrong", "cat",
                                      "--positions", "7", "--out", str(tmp_path)])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "error: position 7 is out of range: these inputs have 7 query positions" in said


def test_one_head_by_both_methods_has_no_rank_agreement(causal_checkpoint, tmp_path):
    """A Spearman of one value is undefined: left out, not an error."""
    result = CliRunner().invoke(app, ["patch", str(causal_checkpoint), "--clean", "the cat sat on the",
                                      "--corrupt", "the dog sat on the", "--answer", "mat", "--wrong", "cat",
                                      "--layers", "1", "--heads", "2", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [len(r["heads"]["rows"]) for r in document["results"]] == [1, 1] and "spearman" not in document
