import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headlab.capture import (
    WordMap,
    batch_word_ids_from_spans,
    collate,
    pattern_to_words,
    tokenize_corpus,
    unit_labels,
    whitespace_spans,
    word_ids_from_spans,
    word_units,
)

# [CLS] the cat ##s [SEP]: "cats" is two pieces; [CLS] and [SEP] are units of their own.
PATTERN = torch.tensor([
    [0.2, 0.2, 0.2, 0.2, 0.2],
    [0.1, 0.3, 0.2, 0.2, 0.2],
    [0.0, 0.5, 0.25, 0.25, 0.0],
    [0.4, 0.0, 0.2, 0.2, 0.2],
    [1.0, 0.0, 0.0, 0.0, 0.0],
], dtype=torch.float64)
UNITS = torch.tensor([0, 1, 2, 2, 3])
# Keys of "cats" summed (columns 2+3), queries of "cats" averaged (rows 2 and 3), by hand.
EXPECTED = torch.tensor([
    [0.2, 0.2, 0.4, 0.2],
    [0.1, 0.3, 0.4, 0.2],
    [0.2, 0.25, 0.45, 0.1],
    [1.0, 0.0, 0.0, 0.0],
], dtype=torch.float64)


def test_hand_computed_example():
    torch.testing.assert_close(pattern_to_words(PATTERN, UNITS), EXPECTED)
    heads = torch.stack([PATTERN, PATTERN.flip(-1)])  # (head, q, k) with shared units
    out = pattern_to_words(heads, UNITS)
    assert out.shape == (2, 4, 4)
    torch.testing.assert_close(out[0], EXPECTED)


def test_batched_with_padding_matches_items():
    # item 0: the example; item 1: [CLS] a b [SEP] + one padding position (its key weight is 0).
    p1 = torch.zeros(5, 5, dtype=torch.float64)
    p1[:, :4] = torch.softmax(torch.randn(5, 4, dtype=torch.float64), -1)
    patterns = torch.stack([PATTERN, p1])[:, None]  # (batch, head, q, k)
    units = torch.tensor([[0, 1, 2, 2, 3], [0, 1, 2, 3, -1]])
    out = pattern_to_words(patterns, units)
    assert out.shape == (2, 1, 4, 4)
    torch.testing.assert_close(out[0, 0], EXPECTED)
    torch.testing.assert_close(out[1, 0], p1[:4, :4])  # one piece per word: identity
    out5 = pattern_to_words(patterns, units, n_units=5)  # a unit nobody has: zero row and column
    assert out5[:, :, 4].abs().sum() == 0 and out5[..., 4].abs().sum() == 0


def test_word_units():
    word_ids = torch.tensor([[-1, 0, 1, 1, 2, -1, -1], [-1, 0, 0, -1, -1, 7, 7]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]])
    units, n_units = word_units(word_ids, mask)
    assert units.tolist() == [[0, 1, 2, 2, 3, 4, 5], [0, 1, 1, 2, -1, -1, -1]]  # specials in a row stay apart
    assert n_units.tolist() == [6, 3]
    units1, n1 = word_units(word_ids[0], mask[0])
    assert units1.tolist() == units[0].tolist() and int(n1) == 6
    with pytest.raises(ValueError, match="differ"):
        word_units(word_ids, mask[:, :3])


def test_shape_errors():
    with pytest.raises(ValueError, match=r"expected \(\.\.\., pos, pos\)"):
        pattern_to_words(torch.zeros(3, 4), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="units has shape"):
        pattern_to_words(torch.zeros(4, 4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="a batch of 2"):
        pattern_to_words(torch.zeros(3, 1, 4, 4), torch.zeros(2, 4, dtype=torch.long))


@st.composite
def segmented_patterns(draw):
    """Row-stochastic (batch, head, pos, pos) patterns over items of random word segmentations."""
    batch, heads = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    sizes = [draw(st.lists(st.integers(1, 4), min_size=1, max_size=6)) for _ in range(batch)]
    pos = max(sum(s) for s in sizes)
    units = torch.full((batch, pos), -1)
    for b, s in enumerate(sizes):
        units[b, :sum(s)] = torch.repeat_interleave(torch.arange(len(s)), torch.tensor(s))
    seed = draw(st.integers(0, 2**31 - 1))
    scores = torch.randn(batch, heads, pos, pos, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    scores = scores.masked_fill((units < 0)[:, None, None, :], float("-inf"))  # no weight on padding keys
    return torch.softmax(scores, -1), units, sizes


@given(segmented_patterns())
def test_row_sums_are_preserved(case):
    pattern, units, sizes = case
    out = pattern_to_words(pattern, units)
    for b, s in enumerate(sizes):
        rows = out[b, :, :len(s)].sum(-1)
        torch.testing.assert_close(rows, torch.ones_like(rows))
        assert out[b, :, len(s):].abs().sum() == 0  # units the item lacks
    # The batched call equals the call on one unpadded item.
    s, b = sizes[0], 0
    n = sum(s)
    direct = pattern_to_words(pattern[b, :, :n, :n], units[b, :n])
    torch.testing.assert_close(out[b, :, :len(s), :len(s)], direct)


@given(segmented_patterns())
def test_identity_when_every_word_is_one_piece(case):
    pattern, units, _sizes = case
    ones = (units >= 0).long().cumsum(-1) - 1  # every real piece its own unit
    ones = ones.masked_fill(units < 0, -1)
    out = pattern_to_words(pattern, ones, n_units=pattern.shape[-1])
    real = (units >= 0)[:, None, :, None] & (units >= 0)[:, None, None, :]
    torch.testing.assert_close(out * real, pattern * real)


def _summed(pattern: torch.Tensor, units: torch.Tensor, n_units: int) -> torch.Tensor:
    """The definition, one item at a time: each word's query rows summed then its key columns, in position
    order, then divided by the word's pieces (an independent loop)."""
    n_items, pos = units.shape
    p = pattern.reshape(n_items, -1, pos, pos)
    out = torch.zeros(n_items, p.shape[1], n_units, n_units, dtype=pattern.dtype)
    for i in range(n_items):
        for u in range(n_units):
            rows = [q for q in range(pos) if units[i, q] == u]
            if not rows:
                continue
            row = p[i, :, rows[0]].clone()
            for q in rows[1:]:
                row += p[i, :, q]
            for v in range(n_units):
                cols = [k for k in range(pos) if units[i, k] == v]
                if cols:
                    value = row[:, cols[0]].clone()
                    for k in cols[1:]:
                        value += row[:, k]
                    out[i, :, u, v] = value / len(rows)
    return out.view(*pattern.shape[:-2], n_units, n_units)


@given(segmented_patterns())
def test_word_map_equals_the_summed_definition_to_the_bit_in_float32(case):
    pattern, units, _ = case
    pattern = pattern.float()
    n_units = int(units.max()) + 1
    assert torch.equal(WordMap(units).apply(pattern), _summed(pattern, units, n_units))


@given(segmented_patterns(), st.integers(0, 2**31 - 1))
def test_best_keys_equal_the_first_largest_of_the_kept_columns(case, seed):
    pattern, units, sizes = case
    pattern = pattern.float()
    words = WordMap(units)
    keys = torch.rand(len(sizes), words.n_units, generator=torch.Generator().manual_seed(seed)) < 0.6
    keys[0] = False  # an item with no key to choose from gets unit 0
    present = torch.zeros(len(sizes), words.n_units, dtype=torch.bool)
    for b, s in enumerate(sizes):
        present[b, :len(s)] = True
    full = words.apply(pattern).masked_fill(~(present & keys)[:, None, None, :], float("-inf"))
    want = full.max(-1).indices
    taken = []
    got = words.best_keys(pattern, keys=keys, workspace=lambda shape: taken.append(shape) or torch.empty(shape))
    assert got.shape == want.shape and taken
    real_rows = present[:, None, :].expand_as(got)
    assert torch.equal(got[real_rows], want[real_rows])
    assert (got[0] == 0).all()
    # one map, many patterns: the same as a map of its own
    again = pattern.flip(-2)
    assert torch.equal(words.apply(again), WordMap(units).apply(again))
    # the key choice's plan is kept for the next pattern, and worked out anew for other keys
    assert torch.equal(words.best_keys(again, keys=keys), WordMap(units).best_keys(again, keys=keys))
    others = ~keys
    assert torch.equal(words.best_keys(again, keys=others), WordMap(units).best_keys(again, keys=others))
    # a block cut from a longer batch (rows further apart than its positions) is read in place, to the same result
    wider = torch.rand(*pattern.shape[:-2], pattern.shape[-2] + 3, pattern.shape[-1] + 3)
    wider[..., : pattern.shape[-2], : pattern.shape[-1]] = pattern
    block = wider[..., : pattern.shape[-2], : pattern.shape[-1]]
    assert block.stride(-2) == pattern.shape[-1] + 3  # a view of the wider rows
    assert torch.equal(words.best_keys(block, keys=keys), words.best_keys(pattern, keys=keys))


def test_word_map_refuses_units_of_the_wrong_shape():
    with pytest.raises(ValueError, match="expected \\(pos,\\) or \\(batch, pos\\)"):
        WordMap(torch.zeros(1, 2, 3, dtype=torch.long))


def test_with_a_real_tokenizer(tokenizer):
    text = "the cats sat."
    tc = tokenize_corpus(tokenizer, [text])
    batch = collate(tc, [0])
    units, n_units = batch.word_units()
    assert units[0].tolist() == [0, 1, 2, 2, 3, 4, 5] and n_units.tolist() == [6]
    labels = unit_labels(text, batch.tokens[0], batch.offsets[0].tolist(), units[0].tolist())
    assert labels == ["[CLS]", "the", "cats", "sat", ".", "[SEP]"]


def test_word_ids_from_spans(tokenizer):
    text = "the cats sat."
    batch = collate(tokenize_corpus(tokenizer, [text]), [0])
    spans = whitespace_spans(text)
    assert spans == [(0, 3), (4, 8), (9, 13)]
    word_ids = word_ids_from_spans(batch.offsets[0], spans, special_tokens_mask=batch.special_tokens_mask[0])
    assert word_ids.tolist() == [-1, 0, 1, 1, 2, 2, -1]  # "sat." is one whitespace word
    units, _ = word_units(word_ids, batch.attention_mask[0])
    labels = unit_labels(text, batch.tokens[0], batch.offsets[0].tolist(), units.tolist())
    assert labels == ["[CLS]", "the", "cats", "sat.", "[SEP]"]
    with pytest.raises(ValueError, match=r"pieces \[4, 5\] start outside"):
        word_ids_from_spans(batch.offsets[0], spans[:2], special_tokens_mask=batch.special_tokens_mask[0])


BATCH_TEXTS = ["The cat sat on  the mat.", "  leading spaces, then   runs", "x", "I don't know -- well-known (no!)",
               "end with space ", "a b c d e f g h i j k l m n o p"]


@pytest.mark.parametrize("with_text", [True, False])
@pytest.mark.parametrize("kind", ["wordpiece", "byte-level bpe"])
def test_a_batch_at_once_gives_what_each_item_alone_gives(tokenizer, kind, with_text):
    from tests.support.text import byte_level_tokenizer

    chosen = tokenizer if kind == "wordpiece" else byte_level_tokenizer()
    batch = collate(tokenize_corpus(chosen, BATCH_TEXTS), range(len(BATCH_TEXTS)))
    spans = [whitespace_spans(t) for t in BATCH_TEXTS]
    spans[3] = spans[3][:2]  # later pieces of item 3 lie outside every span: that item alone fails
    texts = BATCH_TEXTS if with_text else None
    got, orphans = batch_word_ids_from_spans(batch.offsets, batch.lengths.tolist(), spans,
                                             special_tokens_mask=batch.special_tokens_mask, texts=texts)
    for row, text in enumerate(BATCH_TEXTS):
        n = int(batch.lengths[row])
        one = {"offsets": batch.offsets[row, :n], "spans": spans[row],
               "special_tokens_mask": batch.special_tokens_mask[row, :n], "text": text if with_text else None}
        try:
            alone = word_ids_from_spans(one.pop("offsets"), one.pop("spans"), **one)
        except ValueError as err:  # either outcome is checked: the refusal here, the ids below
            assert orphans[row] and f"pieces {orphans[row][:10]}" in str(err)  # noqa: PT017 - see above
            continue
        assert not orphans[row] and got[row, :n].tolist() == alone.tolist()
        assert (got[row, n:] == -1).all()
    assert orphans[3]  # the item cut short is found whatever the tokenizer


def test_a_batch_needs_one_entry_per_item(tokenizer):
    batch = collate(tokenize_corpus(tokenizer, ["a b", "c"]), [0, 1])
    with pytest.raises(ValueError, match="spans has 1 entries for a batch of 2 items"):
        batch_word_ids_from_spans(batch.offsets, [4, 3], [[(0, 1)]], special_tokens_mask=batch.special_tokens_mask)


def test_byte_level_bpe_pieces_carry_their_leading_space_and_still_find_their_words():
    """GPT-2-style offsets (``trim_offsets=False``): "Ġcat" spans " cat", which starts between words."""
    from tests.support.text import byte_level_tokenizer

    text = "The cat sat on  the mat."
    batch = collate(tokenize_corpus(byte_level_tokenizer(), [text]), [0])
    tokens, offsets = batch.tokens[0], batch.offsets[0]
    assert tokens[1].startswith("Ġ") and text[offsets[1, 0]] == " "  # the space is inside the piece's span
    assert "Ġ" in tokens  # the double space leaves a piece of whitespace only
    spans = [(0, 3), (4, 7), (8, 11), (12, 14), (16, 19), (20, 23), (23, 24)]  # as spaCy splits it, "." apart
    special = batch.special_tokens_mask[0]
    with pytest.raises(ValueError, match="start outside every word span"):
        word_ids_from_spans(offsets, spans, special_tokens_mask=special)  # without the text: the old failure
    word_ids = word_ids_from_spans(offsets, spans, special_tokens_mask=special, text=text)
    words = [text[s:e] for s, e in spans]
    by_piece = [words[w] for w in word_ids.tolist()]
    # every piece's visible characters lie in its word; the lone space joins the word after it
    for (s, e), word in zip(offsets.tolist(), by_piece):
        assert text[s:e].strip() in word
    assert by_piece[tokens.index("Ġ")] == "the"
    units, _ = word_units(word_ids, batch.attention_mask[0])
    assert unit_labels(text, tokens, offsets.tolist(), units.tolist()) == words
