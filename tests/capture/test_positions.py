"""The longest input a model takes, read from its position table: a RoBERTa-style table numbers positions
from just after its padding index, so it holds fewer positions than ``max_position_embeddings`` says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import headlab
from headlab.capture import TruncationWarning, capture, model_max_length
from headlab.models.handle import truncation_message
from tests.support.text import fake_tokenizer
from tests.support.tiny import build

transformers = pytest.importorskip("transformers")

POSITIONS = 24
LONG = "the cat sat on the mat and the big red dog ran " * 4  # far more than POSITIONS pieces


@pytest.fixture(scope="module")
def roberta(tmp_path_factory: pytest.TempPathFactory):
    """A saved tiny RoBERTa whose tokenizer sets no length limit, loaded back with ``headlab.load``."""
    folder = Path(tmp_path_factory.mktemp("roberta"))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=fake_tokenizer(), pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
        sep_token="[SEP]", bos_token="[CLS]", eos_token="[SEP]")
    build("roberta", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
          max_position_embeddings=POSITIONS).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return headlab.load(str(folder))


def test_the_limit_counts_the_rows_after_the_padding_index(roberta) -> None:
    padding_idx = roberta.model.embeddings.position_embeddings.padding_idx
    assert roberta.tokenizer.model_max_length > 10**20 and roberta.model.config.max_position_embeddings == POSITIONS
    limit = model_max_length(roberta.model, roberta.tokenizer)
    assert limit == POSITIONS - padding_idx - 1
    ids = torch.full((1, limit), 5)
    roberta.model(input_ids=ids)  # the longest input runs
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        roberta.model(input_ids=torch.full((1, limit + 1), 5))  # one more piece is past the table


def test_a_model_without_a_padded_position_table_keeps_its_configured_limit() -> None:
    assert model_max_length(build("bert", max_position_embeddings=POSITIONS)) == POSITIONS
    assert model_max_length(build("gpt2", n_positions=POSITIONS)) == POSITIONS


def test_capture_analyze_and_view_truncate_a_long_text_with_the_usual_warning(roberta) -> None:
    from headlab.analysis.analyze import analyze
    from headlab.report.viewer import view_data

    limit = model_max_length(roberta.model, roberta.tokenizer)
    with pytest.warns(TruncationWarning, match=f"max_length={limit} pieces"):
        run = capture(roberta, corpus=[LONG, "the cat sat"], progress=False)
    assert run.truncated == [0] and run.max_length == limit
    with pytest.warns(TruncationWarning, match=f"max_length={limit} pieces"):
        result = analyze(roberta, [LONG, "the cat sat"], quick=True, syntax=False, progress=False)
    assert result.capture.truncated == [0] and result.pruning  # importance ran on pairs cut to the limit too
    with pytest.warns(TruncationWarning, match=f"max_length={limit} pieces"):
        data = view_data(roberta, LONG)
    assert data.items[0].truncated and data.items[0].pieces.n == limit
    assert data.notes == [truncation_message([0], 1, limit)]


def test_a_multimodal_model_takes_its_text_limit_not_its_vision_towers():
    """Gemma 3 with a vision tower: the text's limit is the text config's positions, not the vision tower's
    table of image patches (4 here)."""
    transformers = pytest.importorskip("transformers")
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, vocab_size=300, max_position_embeddings=64, sliding_window=4)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=16,
                  patch_size=8)
    config = transformers.AutoConfig.for_model("gemma3", text_config=text, vision_config=vision, mm_tokens_per_image=4)
    model = transformers.Gemma3ForConditionalGeneration(config)
    assert model.model.vision_tower.embeddings.position_embedding.num_embeddings == 4
    assert model_max_length(model) == 64
