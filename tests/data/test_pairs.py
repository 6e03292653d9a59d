"""The bundled sentence pairs (headlab/data/pairs.tsv)."""

from collections import Counter

import pytest

from headlab.data.pairs import LABELS, load_pairs

PAIRS = load_pairs()


def test_size_and_balance():
    assert 180 <= len(PAIRS) <= 220
    counts = Counter(p.label for p in PAIRS)
    assert set(counts) == set(LABELS)
    assert max(counts.values()) - min(counts.values()) <= 10


def test_no_duplicates_and_clean_text():
    assert len({(p.sentence_a, p.sentence_b) for p in PAIRS}) == len(PAIRS)
    for p in PAIRS:
        assert p.sentence_a != p.sentence_b
        for s in (p.sentence_a, p.sentence_b):
            assert s == s.strip() and s.isascii() and "\t" not in s


def test_near_misses_share_most_words():
    def words(s):
        return set(s.lower().strip(".").split())

    for p in load_pairs(labels=("near-miss",)):
        a, b = words(p.sentence_a), words(p.sentence_b)
        assert len(a & b) / len(a | b) >= 0.5, p


def test_label_filter_and_bad_label():
    assert {p.label for p in load_pairs(labels=("paraphrase",))} == {"paraphrase"}
    with pytest.raises(ValueError, match="subset"):
        load_pairs(labels=("similar",))
