"""``headlab circuit`` and ``headlab patch`` on saved tiny models beyond the text decoders and encoders (MiniLM's
tokenizer beside them): ALBERT (one layer run in several) scores its circuit; a BART is patched head by head, and
its circuit is refused in one line, exit 2, before any forward (an encoder-decoder's two streams). An image model's
refusal by both commands is tests/cli/test_vision_cli.py's."""

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


def test_bart_circuit_is_refused_in_one_line_before_any_forward(checkpoint, tmp_path, monkeypatch):
    import headlab.analysis.patching

    def no_forward(*args, **kwargs):
        raise AssertionError("the metric's forward ran")

    monkeypatch.setattr(headlab.analysis.patching, "text_metric", no_forward)
    result = CliRunner().invoke(app, ["circuit", str(checkpoint("bart")), "--clean", CLEAN, "--corrupt", CORRUPT,
                                      "--out", str(tmp_path)])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and "BartModel is an encoder-decoder" in lines[0]
    assert "two residual streams" in lines[0]
