"""Causal models without a language-model head (``LlamaModel``, ``CLIPTextModel``), saved as a user's folder with
the packaged MiniLM's tokenizer: ``headlab analyze`` measures importance by a metric they have (the output
embedding's similarity) and says why; a logit metric is refused in one line before any work.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.cli import app
from tests.support.tiny import tiny_config

transformers = pytest.importorskip("transformers")

SENTENCES = "The cat sat on the mat.\nHeads attend to words.\nA dog ran home, fast.\n"
BASE_MODELS = ("llama", "clip_text_model")


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``base_model(name)``: the folder of a tiny ``name`` without a language-model head (saved once)."""
    from headlab.models import default_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    root = tmp_path_factory.mktemp("base-models")
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
               eos_token_id=tokenizer.sep_token_id, max_position_embeddings=130)

    def save(name: str) -> Path:
        folder = root / name
        if not folder.exists():
            if name == "clip_text_model":
                config = transformers.CLIPTextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                     num_attention_heads=4, projection_dim=16, **ids)
                model = transformers.CLIPTextModel(config)
            else:
                model = transformers.AutoModel.from_config(tiny_config(name, **ids))
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
        return folder

    return save


@pytest.mark.parametrize("name", BASE_MODELS)
def test_analyze_measures_importance_by_the_embedding(name, base_model, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(SENTENCES, encoding="utf-8")
    result = CliRunner().invoke(app, ["analyze", str(base_model(name)), "--quick", "--no-syntax", "--streaming",
                                      "--text", str(corpus), "--json", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    skipped = document["summary"]["skipped"]
    assert "no language-model head" in skipped["next-token importance"]
    assert "no language-model head" in skipped["retrieval and streaming heads"]
    assert "embedding cosine to the unpruned model" in document["pruning"]
    assert all(row["importance_gradient"] is not None for row in document["heads"])


@pytest.mark.parametrize("name", BASE_MODELS)
def test_a_logit_metric_is_refused_in_one_line(name, base_model):
    for command in ("patch", "circuit"):
        result = CliRunner().invoke(app, [command, str(base_model(name)), "--clean", "The cat sat on the mat",
                                          "--corrupt", "The dog sat on the mat", "--metric", "logit-diff",
                                          "--answer", "mat", "--wrong", "cat"])
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "needs logits" in lines[0] and "no language-model head" in lines[0], lines
