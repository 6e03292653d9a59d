"""`headlab experiment` through typer's CliRunner: table, --json, --out, and bad arguments."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from headlab.cli.experiment import NAMES
from headlab.experiments import EXPERIMENTS

runner = CliRunner()


def test_help_lists_every_experiment():
    assert tuple(EXPERIMENTS) == NAMES
    result = runner.invoke(app, ["experiment", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert all(name in text for name in NAMES)


def test_json_is_one_document_with_the_claims(tmp_path):
    result = runner.invoke(app, ["experiment", "heads-vs-one", "--steps", "5", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["experiment"] == "heads-vs-one" and document["points"] == 6
    assert document["float32_check_equal"] is True
    assert json.loads((tmp_path / "heads-vs-one.json").read_text()) == document
    assert (tmp_path / "heads-vs-one.png").read_bytes().startswith(b"\x89PNG")


def test_table_and_sentences(tmp_path):
    result = runner.invoke(app, ["experiment", "symmetry", "--steps", "3", "--seed", "2", "--out", str(tmp_path)],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "identical init: max |head h − head 0| over the run" in result.stdout
    assert "after 3 steps" in result.stdout and "wrote" in result.stdout
    assert json.loads((tmp_path / "symmetry.json").read_text())["seed"] == 2


@pytest.mark.parametrize("args, message", [
    (["nope"], "unknown experiment 'nope'; expected one of: symmetry, heads-vs-one, variants, heads-count, induction"),
    (["symmetry", "--steps", "0"], "0 is not a positive int"),
    (["symmetry", "--steps", "-4"], "-4 is not a positive int"),
    (["symmetry", "--seed", "-1"], "-1 is not an int in [0, 2**63)"),
    (["heads-vs-one", "--steps", "2"], "heads-vs-one sweeps at least 3 logit scales"),
    (["symmetry", "--steps", "many"], "Invalid value for '--steps'"),
])
def test_bad_arguments_exit_2_with_a_clear_message(args, message):
    result = runner.invoke(app, ["experiment", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert message in " ".join(result.output.replace("│", " ").split())
