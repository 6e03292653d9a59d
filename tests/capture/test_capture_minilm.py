"""Capture on the packaged MiniLM (headlab.load()), checked against transformers' own attention."""

import pytest
import torch

from headlab.capture import (
    TruncationWarning,
    capture,
    load_corpus,
    naive_batches,
    padding_stats,
    pattern_to_words,
    tokenize_corpus,
)
from headlab.heads import Heads
from tests.support.minilm import minilm


@pytest.fixture(scope="module")
def loaded():
    return minilm()


@pytest.fixture(scope="module")
def texts():
    corpus = load_corpus().texts
    by_length = sorted(corpus, key=len)
    return [*by_length[:4], *corpus[:8], *by_length[-4:]]  # short, typical and truncated items


@pytest.fixture(scope="module")
def eager_reference(loaded, texts):
    """transformers' own MiniLM, eager attention: per item, every layer's (head, q, k) weights."""
    from transformers import AutoModel

    from headlab.models import default_model_path

    hf = AutoModel.from_pretrained(default_model_path(), attn_implementation="eager").eval()
    inputs = loaded.tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.inference_mode():
        out = hf(**inputs, output_attentions=True)
    lengths = inputs["attention_mask"].sum(-1).tolist()
    return [
        {"ids": inputs["input_ids"][i, :n].tolist(),
         "patterns": [a[i, :, :n, :n] for a in out.attentions]}
        for i, n in enumerate(lengths)
    ]


class Keep:
    def __init__(self):
        self.batches = []

    def update(self, batch):
        self.batches.append(batch)


def test_capture_matches_transformers_eager_attention(loaded, texts, eager_reference):
    keep = Keep()
    with pytest.warns(TruncationWarning, match="of 16 inputs are longer than max_length=64"):
        result = capture(loaded, corpus=texts, consumers=[keep], heads=Heads(layers=[0, 3, 5], heads=[0, 7, 11]),
                         max_length=64, batch_tokens=256, progress=False)
    assert result.layers == {0: [0, 7, 11], 3: [0, 7, 11], 5: [0, 7, 11]} and result.batches > 2
    seen = set()
    for batch in keep.batches:
        for row, i in enumerate(batch.corpus_indices.tolist()):
            seen.add(i)
            ref, n = eager_reference[i], int(batch.lengths[row])
            assert batch.input_ids[row, :n].tolist() == ref["ids"]
            assert batch.truncated[row] == (i in result.truncated)
            for layer, taken in batch.layers.items():
                got = taken.pattern[row, :, :n, :n]
                torch.testing.assert_close(got, ref["patterns"][layer][[0, 7, 11]], atol=1e-5, rtol=1e-4)
    assert seen == set(range(len(texts)))


def test_word_level_rows_sum_to_one_on_minilm(loaded):
    seen = []

    class Words:
        def update(self, batch):
            units, n_units = batch.word_units()
            words = pattern_to_words(batch.layers[2].pattern, units)  # (batch, head, word, word)
            for row, n in enumerate(n_units.tolist()):
                sums = words[row, :, :n].sum(-1)
                torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-5, rtol=0)
                seen.append(n < int(batch.lengths[row]))  # fewer words than pieces

    capture(loaded, corpus=["The unbelievably tall giraffe's neck.", "Tokenization splits words."],
            consumers=[Words()], heads=Heads(layers=[2]), progress=False)
    assert seen == [True, True]


def test_the_whole_bundled_corpus_one_head(loaded):
    counts = []

    class Count:
        def update(self, batch):
            counts.append(len(batch))
            assert batch.layers[4].pattern.shape[1] == 1

    corpus = load_corpus()
    full = tokenize_corpus(loaded.tokenizer, corpus.texts).lengths
    too_long = [i for i, n in enumerate(full) if n > 64]
    with pytest.warns(TruncationWarning, match=f"{len(too_long)} of {len(corpus)} inputs"):
        result = capture(loaded, consumers=[Count()], heads=Heads(layers=[4], heads=[5]), max_length=64, progress=False)
    assert sum(counts) == result.items == len(corpus)
    assert result.truncated == too_long and len(too_long) >= 15 and result.tokens_per_second > 0
    lengths = tokenize_corpus(loaded.tokenizer, load_corpus().texts, max_length=64).lengths
    naive = padding_stats(lengths, naive_batches(len(lengths), batch_size=max(counts)))
    assert result.tokens == naive.tokens and result.padded_tokens < 0.6 * naive.padded_tokens
