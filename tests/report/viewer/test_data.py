"""view_data: what the viewer shows equals the model's patterns, its statistics equal the analysis's."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from headlab.analysis.roles import label_heads
from headlab.analysis.surface import FIXED_WHEN_CAUSAL, STATISTICS, surface_stats
from headlab.analysis.taxonomy import classify, taxonomy_stats
from headlab.capture import TruncationWarning, pattern_to_words
from headlab.heads import Heads
from headlab.models import HeadedModel
from headlab.models.handle import truncation_message
from headlab.report.viewer import view_data
from tests.support.reference import captured_patterns
from tests.support.tiny import tiny

TEXTS = ["the cat sat on the mat, and the dog ran!", "a big xyz dog ran. the red cat sat"]


def _within_quantisation(encoded: np.ndarray, exact: torch.Tensor) -> None:
    exact = exact.numpy()
    step = exact.max(axis=1, keepdims=True) / 510 + 1e-6
    assert encoded.shape == exact.shape
    assert (np.abs(encoded - exact) <= step).all(), float(np.abs(encoded - exact).max())


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_every_head_at_both_levels_is_the_model_pattern(kind: str) -> None:
    model = tiny(kind)
    data = view_data(model, TEXTS)
    assert data.causal == (kind == "gpt2")
    assert data.heads == [(layer, h) for layer in range(2) for h in range(4)] and len(data.info) == 8
    for k, text in enumerate(TEXTS):
        patterns, units = captured_patterns(model, text)
        item = data.items[k]
        assert item.pieces.n == patterns[0].shape[-1] and not item.truncated
        assert item.words is not None  # "xyz" and "and" are unknown words: several pieces
        words = {layer: pattern_to_words(p.double(), units).float() for layer, p in patterns.items()}
        for i, (layer, head) in enumerate(data.heads):
            _within_quantisation(item.pieces.patterns[i].values(), patterns[layer][head])
            _within_quantisation(item.words.patterns[i].values(), words[layer][head])
        if data.causal:
            assert all(np.triu(p.values(), 1).max() == 0 for p in item.pieces.patterns)


@pytest.mark.parametrize("level", ["pieces", "words"])
def test_labels_and_gaps_give_back_the_text(level: str) -> None:
    text = "  Un xyzzy\tword, then   more words... end  "
    data = view_data(tiny("bert"), [text])
    lv = getattr(data.items[0], level)
    assert lv is not None
    content = [gap + label for gap, label, special in zip(lv.gaps, lv.labels, lv.special) if not special]
    assert "".join(content) + lv.tail == text
    assert lv.special[0] and lv.special[-1] and lv.labels[0] == "[CLS]" and lv.labels[-1] == "[SEP]"
    assert sum(lv.pieces) == data.items[0].pieces.n


def test_byte_level_bpe_labels_leave_the_leading_space_to_the_gap() -> None:
    """GPT-2-style offsets include the space before a piece ("Ġcat" spans " cat"); the label is "cat"."""
    import headlab
    from tests.support.text import byte_level_tokenizer
    from tests.support.tiny import build

    tokenizer = byte_level_tokenizer()
    model = headlab.attach(build("gpt2", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)).model
    text = "The cat sat on  the mat."
    pieces = view_data(HeadedModel(model=model, tokenizer=tokenizer, source="tiny bpe"), [text]).items[0].pieces
    assert "cat" in pieces.labels and not any(label != label.strip() for label in pieces.labels if label.strip())
    assert " " in pieces.gaps
    assert "".join(g + label for g, label in zip(pieces.gaps, pieces.labels)) + pieces.tail == text


def test_word_labels_join_their_pieces() -> None:
    data = view_data(tiny("bert"), ["the xyzzy cat"])
    words = data.items[0].words
    assert words.labels == ["[CLS]", "the", "xyzzy", "cat", "[SEP]"]
    assert words.pieces == [1, 1, 5, 1, 1]


def test_statistics_and_roles_are_the_analysis_of_the_viewed_texts() -> None:
    model = tiny("gpt2")
    data = view_data(model, TEXTS)
    surface = surface_stats(model, TEXTS, progress=False)
    roles = label_heads(surface)
    taxonomy = taxonomy_stats(model, TEXTS, progress=False)
    classes = classify(taxonomy)
    assert [(info.layer, info.head) for info in data.info] == surface.heads
    for info in data.info:
        for name in STATISTICS:
            if name in FIXED_WHEN_CAUSAL:  # gpt2 is causal: left out (see the next test)
                continue
            assert info.stats[name] == pytest.approx(surface.value(name, info.layer, info.head), rel=1e-9, abs=1e-12)
        for name in ("special", "band", "top_columns"):
            assert info.stats[name] == pytest.approx(taxonomy.value(name, info.layer, info.head), rel=1e-9, abs=1e-12)
        assert info.roles == roles[(info.layer, info.head)]
        assert info.pattern_class == classes[(info.layer, info.head)] and info.corpus is None
        assert "band" in info.stats and all(v == v for v in info.stats.values())  # no NaN


def test_selected_heads_only_and_corpus_rows_attached() -> None:
    rows = [{"layer": 1, "head": 3, "roles": "sink", "entropy": 1.5}]
    data = view_data(tiny("bert"), "the cat", heads=Heads(layers=[1], heads=[0, 3]), corpus_rows=rows)
    assert data.heads == [(1, 0), (1, 3)] and data.head_index(1, 3) == 1
    assert data.info[1].corpus == rows[0] and data.info[0].corpus is None
    assert len(data.items[0].pieces.patterns) == 2
    with pytest.raises(KeyError, match="layer 0, head 0"):
        data.head_index(0, 0)


def test_to_dict_is_json_ready() -> None:
    from headlab.report.viewer.encoding import script_json

    payload = view_data(tiny("bert"), TEXTS).to_dict()
    assert payload["format"] == 1 and payload["nHeads"] == [4, 4] and len(payload["items"]) == 2
    script_json(payload)  # strict JSON: no NaN anywhere


def test_truncation_is_on_the_record_and_noted() -> None:
    base = tiny("bert")
    tokenizer = copy.deepcopy(base.tokenizer)
    tokenizer.model_max_length = 8
    model = HeadedModel(model=base.model, tokenizer=tokenizer, source=base.source)
    text = "the cat sat on the mat and the dog ran on the mat"
    with pytest.warns(TruncationWarning):
        data = view_data(model, [text, "the cat"])
    item = data.items[0]
    full = len(base.tokenizer(text)["input_ids"])
    assert full > 8 and item.truncated and item.pieces.n == 8 and item.full_length == full
    assert item.pieces.tail == " and the dog ran on the mat"  # the text the model did not see
    assert not data.items[1].truncated
    assert data.notes == [truncation_message([0], 2, 8)]  # the sentence every entry point says


def test_bad_input_gets_clear_errors() -> None:
    model = tiny("bert")
    with pytest.raises(ValueError, match="no text"):
        view_data(model, [])
    with pytest.raises(ValueError, match="text 1 is empty"):
        view_data(model, ["the cat", "   "])
    with pytest.raises(ValueError, match="max_entries=100"):
        view_data(model, "the cat sat on the mat", max_entries=100)
    with pytest.raises(ValueError, match="layer"):
        view_data(model, "the cat", heads=Heads(layers=[5]))
    no_tokenizer = HeadedModel(model=model.model, tokenizer=None, source="x")
    with pytest.raises(TypeError, match="tokenizer"):
        view_data(no_tokenizer, "the cat")


def test_a_causal_model_shows_no_next_token_share() -> None:
    """Nothing attends to the next token in a causal model: the viewer leaves the statistic out, on
    the texts and from the corpus rows alike."""
    rows = [{"layer": 0, "head": 0, "to_next": 0.0, "to_prev": 0.5}]
    data = view_data(tiny("gpt2"), "the cat sat on the mat", corpus_rows=rows)
    assert all("to_next" not in info.stats and "to_prev" in info.stats for info in data.info)
    assert data.info[0].corpus == {"layer": 0, "head": 0, "to_prev": 0.5}
    assert all("to_next" in info.stats for info in view_data(tiny("bert"), "the cat sat").info)
