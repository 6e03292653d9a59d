"""``headlab circuit`` and ``headlab patch`` on saved tiny models beyond the text decoders and encoders (MiniLM's
tokenizer beside them): ALBERT (one layer run in several) scores its circuit; a BART is patched head by head and
scores its circuit across its two streams. An image model's refusal by both commands is
tests/cli/test_vision_cli.py's."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from tests.support.families import FAMILIES

transformers = pytest.importorskip("transformers")
CLEAN, CORRUPT = "The cat sat on the mat.", "The dog sat on the mat."


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``checkpoint(name)``: the folder of the tiny ``name`` with MiniLM's tokenizer (saved once)."""
    from headlab.models import default_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    root = tmp_path_factory.mktemp("families")

    def save(name: str) -> Path:
        folder = root / name
        if not folder.exists():
            extra = {"decoder_start_token_id": tokenizer.cls_token_id} if name == "bart" else {}
            model = FAMILIES[name].build(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **extra)
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        return folder

    return save


def test_albert_scores_its_circuit(checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["circuit", str(checkpoint("albert")), "--clean", CLEAN, "--corrupt", CORRUPT,
                                      "--method", "eap", "--top", "5", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["size"] == 5 and document["heads"] == [[4, 4]] * 4
    assert -1.0 < document["faithfulness"] <= 1.5


def test_bart_is_patched_head_by_head(checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["patch", str(checkpoint("bart")), "--clean", CLEAN, "--corrupt", CORRUPT,
                                      "--method", "attribution", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["results"][0]["heads"]["rows"]) == 6 * 4


def test_bart_scores_its_circuit_across_its_two_streams(checkpoint, tmp_path):
    result = CliRunner().invoke(app, ["circuit", str(checkpoint("bart")), "--clean", CLEAN, "--corrupt", CORRUPT,
                                      "--method", "eap", "--top", "5", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["size"] == 5 and -1.0 < document["faithfulness"] <= 1.5
    senders = {edge["sender"] for edge in json.loads((tmp_path / "scores.json").read_text())["edges"]
               if isinstance(edge["sender"], str)}
    assert senders == {"input", "decoder input"}  # the source's and the target's streams
