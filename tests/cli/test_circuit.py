"""``headlab circuit`` on the command line: the packaged MiniLM with the similarity metric, a saved causal
checkpoint with a logit difference by every method, the files it writes, and one-line errors (those that need
no model before it loads)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from headlab.circuits.circuit import SCORING
from headlab.cli import app
from headlab.cli.circuit import FILES, METHODS

CLEAN, CORRUPT = "The cat sat on the mat.", "The dog sat on the mat."
CAUSAL = ["--clean", "the cat sat on the", "--corrupt", "the dog sat on the", "--answer", "mat", "--wrong", "cat"]


@pytest.fixture(scope="module")
def causal_checkpoint(tmp_path_factory):
    from tests.support.tiny import save_causal_checkpoint

    return save_causal_checkpoint(tmp_path_factory.mktemp("tiny-gpt2"))


def test_minilm_by_eap(tmp_path):
    result = CliRunner().invoke(app, ["circuit", "--clean", CLEAN, "--corrupt", CORRUPT, "--method", "eap",
                                      "--top", "5", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document == json.loads((tmp_path / "circuit.json").read_text())
    assert document["method"] == "eap" and document["size"] == 5 and document["scored"] == 6 * 12 * 3 * 31 + 73
    assert document["heads"] == [[12, 12]] * 6 and -1.0 < document["faithfulness"] <= 1.5
    details = document["details"]
    assert details["metric"] == "cosine similarity of the mean-pooled output to the clean text's"
    assert details["clean_metric"] == pytest.approx(1.0) and details["scoring"]["forwards"] == 2
    scores = [abs(edge["score"]) for edge in document["edges"]]
    assert scores == sorted(scores, reverse=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    assert len(json.loads((tmp_path / "scores.json").read_text())["edges"]) == document["scored"]
    assert (tmp_path / "circuit.png").read_bytes()[:4] == b"\x89PNG"
    assert ET.parse(tmp_path / "circuit.svg").getroot().tag.endswith("svg")


@pytest.mark.parametrize("method, name, forwards", [("eap", "eap", 2), ("eap-ig", "eap-ig", 2 + 2),
                                                    ("path", "path patching", 2 + 8 + 48 + 2 + 25),
                                                    ("exact", "edge patching", 2 + 81)])
def test_a_causal_checkpoint_by_every_method(causal_checkpoint, tmp_path, method, name, forwards):
    result = CliRunner().invoke(app, ["circuit", str(causal_checkpoint), *CAUSAL, "--method", method, "--steps", "2",
                                      "--top", "4", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["method"] == name and document["size"] == 4 and document["scored"] == 81
    assert document["details"]["metric"] == "logit('mat') − logit('cat') at the last position"
    assert document["details"]["scoring"]["forwards"] == forwards
    assert isinstance(document["faithfulness"], float)


def test_table_output(causal_checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["circuit", str(causal_checkpoint), *CAUSAL, "--method", "eap", "--top", "3",
                                      "--out", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    said = result.output
    assert "Circuit: the top 3 of 81 edges by eap" in said and "faithfulness " in said
    assert "eap: 2 forwards, 1 backwards" in said and str(tmp_path / "circuit.svg") in said
    assert said.count("→") >= 3


def test_the_methods_are_the_librarys():
    assert METHODS == SCORING


@pytest.mark.parametrize("extra, message", [
    (["--corrupt", CORRUPT, "--method", "acdc"], "--method: 'acdc' is not one of eap, eap-ig, path, exact"),
    (["--corrupt", CORRUPT, "--metric", "loss"], "--metric: 'loss' is not one of logit-diff, similarity"),
    (["--corrupt", CORRUPT, "--metric", "logit-diff"], "needs --answer"),
    (["--corrupt", ""], "--clean and --corrupt are both needed"),
    (["--corrupt", CORRUPT, "--top", "0"], "--top"),
    (["--corrupt", CORRUPT, "--steps", "0"], "--steps"),
])
def test_bad_input_is_one_line_before_the_model_loads(tmp_path, extra, message):
    # a model that does not exist: the error must come from the options, checked before loading
    result = CliRunner().invoke(app, ["circuit", str(tmp_path / "no-model"), "--clean", CLEAN, *extra,
                                      "--out", str(tmp_path / "out")])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output and message in said, result.output
    assert "no-model" not in said and not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, message", [
    (["--corrupt", "the dog sat"], "same shape to patch between them"),
    (["--corrupt", "the cat sat on the"], "score the same"),
    (["--corrupt", "the dog sat on the", "--answer", "matter"], "--answer='matter' is"),
])
def test_bad_input_of_a_loaded_model_is_one_line(causal_checkpoint, tmp_path, extra, message):
    options = {"--answer": "mat", "--wrong": "cat"}
    given = dict(zip(extra[::2], extra[1::2]))
    args = [a for option, value in {**options, **given}.items() for a in (option, value)]
    result = CliRunner().invoke(app, ["circuit", str(causal_checkpoint), "--clean", "the cat sat on the", *args,
                                      "--out", str(tmp_path / "out")])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output and message in said, result.output
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_logit_metric_on_a_model_without_logits_is_one_line(tmp_path):
    result = CliRunner().invoke(app, ["circuit", "--clean", CLEAN, "--corrupt", CORRUPT, "--metric", "logit-diff",
                                      "--answer", "mat", "--wrong", "cat", "--out", str(tmp_path / "out")])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "the logit-diff metric needs logits; BertModel outputs hidden states" in said


def test_a_missing_model_and_an_out_that_is_a_file_are_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    for args, message in ((["--out", str(tmp_path / "file")], "is a file; expected a folder"),
                          ([str(tmp_path / "missing"), "--out", str(tmp_path / "out")], "missing")):
        result = CliRunner().invoke(app, ["circuit", "--clean", CLEAN, "--corrupt", CORRUPT, *args])
        said = " ".join(result.output.split())
        assert result.exit_code == 2 and "Traceback" not in result.output and message in said, result.output


def test_the_progress_bar_counts_forwards():
    from headlab.cli.circuit import _forwards_bar

    with _forwards_bar(False, "exact") as bar:
        assert bar is None
    with _forwards_bar(True, "exact") as bar:
        assert bar is not None
        bar(1, 83)
        bar(83, 83)


def test_ctrl_c_mid_run_exits_1_and_leaves_the_old_output_as_it_was(causal_checkpoint, tmp_path, monkeypatch):
    import headlab.circuits.circuit as library

    out = tmp_path / "out"
    out.mkdir()
    (out / "circuit.json").write_text("old")

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(library, "faithfulness", interrupt)
    result = CliRunner().invoke(app, ["circuit", str(causal_checkpoint), *CAUSAL, "--method", "eap",
                                      "--out", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.strip().splitlines()[-1] == f"interrupted; {out} left as it was"
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and [p.name for p in out.iterdir()] == ["circuit.json"]
    assert (out / "circuit.json").read_text() == "old"


def test_help_lists_the_command_and_its_options():
    assert "circuit" in CliRunner().invoke(app, ["--help"]).output
    said = CliRunner().invoke(app, ["circuit", "--help"], env={"COLUMNS": "200"}).output
    assert all(option in said for option in ("--clean", "--corrupt", "--metric", "--method", "--steps", "--top",
                                             "--out", "--json"))
