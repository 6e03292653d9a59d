import pytest

from headlab.capture import load_corpus, naive_batches, padding_stats, plan_batches, tokenize_corpus
from tests.support.minilm import minilm_tokenizer


def test_offsets_word_ids_and_special_tokens(tokenizer):
    tc = tokenize_corpus(tokenizer, ["the cats sat."])
    e = tc.encodings[0]
    assert e.tokens == ["[CLS]", "the", "cat", "##s", "sat", ".", "[SEP]"]
    assert e.word_ids == [None, 0, 1, 1, 2, 3, None]
    assert e.offsets[2:4] == [(4, 7), (7, 8)]
    assert e.special_tokens_mask == [1, 0, 0, 0, 0, 0, 1]
    assert tc.lengths == tc.full_lengths == [7] and tc.truncated == [] and tc.n_tokens == 7


def test_truncation_is_recorded(tokenizer, texts):
    tc = tokenize_corpus(tokenizer, texts, max_length=6)
    full = tokenize_corpus(tokenizer, texts)
    assert tc.full_lengths == full.lengths
    assert tc.truncated == [i for i, n in enumerate(full.lengths) if n > 6]
    assert len(tc.truncated) >= 3
    for i in tc.truncated:  # cut content, special tokens kept at both ends
        e = tc.encodings[i]
        assert len(e.ids) == 6 and e.tokens[0] == "[CLS]" and e.tokens[-1] == "[SEP]"
        assert e.tokens[1:5] == full.encodings[i].tokens[1:5]


def test_tokenizer_settings_are_not_ours(tokenizer):
    """A tokenizer configured to pad/truncate (as MiniLM's tokenizer.json is) does not leak into capture."""
    tokenizer.enable_truncation(4)
    tokenizer.enable_padding(length=30)
    settings = (tokenizer.truncation, tokenizer.padding)
    try:
        tc = tokenize_corpus(tokenizer, ["the big red dog sat on a mat"])
        assert (tokenizer.truncation, tokenizer.padding) == settings  # put back as they were
        with pytest.raises(TypeError):  # put back when encoding fails, too
            tokenize_corpus(tokenizer, [None])
        assert (tokenizer.truncation, tokenizer.padding) == settings
    finally:
        tokenizer.no_truncation()
        tokenizer.no_padding()
    assert tc.lengths == [10] and tc.truncated == []
    tokenize_corpus(tokenizer, ["a cat"])
    assert tokenizer.truncation is None and tokenizer.padding is None  # none set, none added


def test_errors(tokenizer):
    with pytest.raises(ValueError, match=r"max_length=2; expected an int > 2"):
        tokenize_corpus(tokenizer, ["a"], max_length=2)
    with pytest.raises(TypeError, match="fast tokenizer"):
        tokenize_corpus(object(), ["a"])


def test_minilm_matches_the_hf_tokenizer_with_truncation():
    tok = minilm_tokenizer()
    texts = list(load_corpus().texts)
    tc = tokenize_corpus(tok, texts, max_length=64)
    ref = tok(texts, truncation=True, max_length=64, return_offsets_mapping=True)
    assert [e.ids for e in tc.encodings] == ref["input_ids"]
    assert [e.offsets for e in tc.encodings] == [list(map(tuple, o)) for o in ref["offset_mapping"]]
    full = tok(texts)["input_ids"]
    assert tc.full_lengths == [len(ids) for ids in full]
    assert tc.truncated == [i for i, ids in enumerate(full) if len(ids) > 64]


@pytest.mark.parametrize("batch_size", [16, 32, 64])
def test_bucketing_pads_far_less_than_corpus_order_on_the_bundled_corpus(batch_size):
    lengths = tokenize_corpus(minilm_tokenizer(), load_corpus().texts, max_length=512).lengths
    naive = padding_stats(lengths, naive_batches(len(lengths), batch_size=batch_size))
    same_size = padding_stats(lengths, plan_batches(lengths, batch_tokens=None, max_batch_size=batch_size))
    default = padding_stats(lengths, plan_batches(lengths, max_batch_size=batch_size))
    assert naive.ratio > 3.0  # the corpus mixes lengths: corpus order pads a lot
    assert same_size.ratio < naive.ratio / 2
    assert default.ratio < 1.5
