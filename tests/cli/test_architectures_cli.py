"""``headlab analyze`` and ``headlab view`` on a saved tiny checkpoint of every architecture.

Each checkpoint is a tiny random model of ``tests.support.tiny.ARCHITECTURES`` saved with the
packaged MiniLM's WordPiece tokenizer beside it, so that the commands load it as a user's
folder: config, safetensors weights, tokenizer. A few architectures, one per kind of layout and
attention, run by default; the rest are marked slow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from tests.support.tiny import ARCHITECTURES, build

transformers = pytest.importorskip("transformers")

DEFAULT = ("gpt2", "llama", "gemma2", "gpt_bigcode", "bert", "distilbert")
CASES = [pytest.param(name, marks=() if name in DEFAULT else pytest.mark.slow) for name in ARCHITECTURES]
EVERY_HEAD = {(layer, head) for layer in range(2) for head in range(4)}  # the tiny models' 2 layers × 4 heads
SENTENCES = "The cat sat on the mat.\nHeads attend to words.\nA dog ran home, fast.\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``checkpoint(name)``: the folder of ``name``'s tiny model with MiniLM's tokenizer (saved once)."""
    from headlab.models import default_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    root = tmp_path_factory.mktemp("checkpoints")

    def save(name: str) -> Path:
        folder = root / name
        if not folder.exists():
            # Positions: room for the corpus and the causal probes; RoBERTa's start after the padding index.
            positions = "n_positions" if "n_embd" in ARCHITECTURES[name].config else "max_position_embeddings"
            model = build(name, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                          bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                          **{positions: 130})
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        return folder

    return save


@pytest.mark.parametrize("name", CASES)
def test_analyze_reports_every_head(name, checkpoint, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(SENTENCES, encoding="utf-8")
    result = CliRunner().invoke(app, ["analyze", str(checkpoint(name)), "--quick", "--no-syntax", "--text",
                                      str(corpus), "--json", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {(row["layer"], row["head"]) for row in document["heads"]} == EVERY_HEAD
    assert len(document["heads"]) == len(EVERY_HEAD) and document["summary"]["items"] == 3
    # The causal probes run exactly on the causal models: the command read the probe's causality.
    assert all(("induction_score" in row) == ARCHITECTURES[name].causal for row in document["heads"])


@pytest.mark.parametrize("name", CASES)
def test_view_shows_every_head(name, checkpoint, tmp_path):
    page = tmp_path / "view.html"
    result = CliRunner().invoke(app, ["view", str(checkpoint(name)), "The cat sat on the mat.", "--out", str(page)])
    assert result.exit_code == 0, result.output
    payload = json.loads(re.search(r'id="viewer-data">(.*?)</script>', page.read_text(encoding="utf-8")).group(1))
    assert {tuple(pair) for pair in payload["heads"]} == EVERY_HEAD and len(payload["heads"]) == 8
    assert "Roles of 8 heads" in result.output
    listed = set(re.findall(r"\bL(\d) H(\d)\b", result.output))  # the roles table names each head as L0 H1
    assert {(int(layer), int(head)) for layer, head in listed} == EVERY_HEAD
