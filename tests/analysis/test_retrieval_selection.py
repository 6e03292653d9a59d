"""Retrieval scores of a head selection and of long copy cases: a selection's rows equal the same heads'
rows of the every-head run, only its patterns are captured, a length sizes each whole case, and
mismatched selections or lengths that cannot hold a needle are one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headlab.capture
from headlab.analysis.retrieval import RetrievalScores, copy_cases, haystack_for, retrieval_scores
from tests.support.tiny import tiny

pytest.importorskip("transformers")

SELECTION = {1: [0, 1]}
SIZES = dict(needles=6, needle_length=4, haystack_length=10, batch_size=4, seed=1)


@pytest.fixture(scope="module")
def every_head():
    return retrieval_scores(tiny("llama"), **SIZES)


def test_a_selection_scores_exactly_the_same_heads_rows_of_the_every_head_run(every_head):
    part = retrieval_scores(tiny("llama"), heads=SELECTION, **SIZES)
    assert part.table.heads == [(1, 0), (1, 1)] and len(every_head.table) == 8
    for column in ("retrieved", "attended", "score"):
        np.testing.assert_array_equal(part.table[column], every_head.table.at(column, part.table.heads))
    assert (part.needles, part.steps, part.copied) == (every_head.needles, every_head.steps, every_head.copied)
    assert every_head.table["attended"].sum() > 0  # some head lands on the needle: the comparison is not vacuous


def test_only_the_selected_heads_patterns_are_captured(monkeypatch):
    run, kept = headlab.capture.run_with_cache, []

    def spy(*args, **kwargs):
        cache = run(*args, **kwargs)
        kept.append({layer: cache.heads("pattern", layer) for layer in (0, 1) if ("pattern", layer) in cache.store})
        return cache

    monkeypatch.setattr(headlab.capture, "run_with_cache", spy)
    retrieval_scores(tiny("llama"), heads=SELECTION, **SIZES)
    assert kept == [SELECTION, SELECTION]  # two batches of copies, layer 1's heads 0 and 1 only


def test_a_length_sizes_each_whole_case():
    tokenizer = tiny("llama").tokenizer
    texts = headlab.capture.load_corpus().texts
    assert haystack_for(tokenizer, length=300, needle_length=12) == 300 - 1 - 2 * 12  # [CLS] is the BOS here
    cases = copy_cases(tokenizer, texts, needles=3, needle_length=12, length=300, seed=4)
    assert [len(c.input_ids) for c in cases] == [300] * 3 and all(c.input_ids[-12:] == c.needle for c in cases)
    assert cases == copy_cases(tokenizer, texts, needles=3, needle_length=12, haystack_length=275, seed=4)
    result = retrieval_scores(tiny("llama"), heads={0: [3]}, needles=2, needle_length=5, length=400)
    assert result.table.heads == [(0, 3)] and result.steps == 2 * 4


@pytest.mark.parametrize("call, message", [
    (lambda tok: copy_cases(tok, ["the cat"], needles=1, needle_length=4, length=8),
     r"^length=8 cannot hold a needle of 4 tokens and its copy after a beginning-of-sequence token: expected >= 9$"),
    (lambda tok: copy_cases(tok, ["the cat"], needles=1, needle_length=4, length=10, haystack_length=1),
     r"^copy cases take exactly one of haystack_length and length; got haystack_length=1, length=10$"),
    (lambda tok: copy_cases(tok, ["the cat"], needles=1, needle_length=4),
     r"^copy cases take exactly one of haystack_length and length; got haystack_length=None, length=None$"),
    (lambda tok: copy_cases(tok, ["the cat"], needles=1, needle_length=4, length=0), r"^length=0: expected an int"),
    (lambda tok: retrieval_scores(tiny("gpt2"), length=5000), r"^length=5000: tiny random gpt2 takes at most 2100 "),
    (lambda tok: retrieval_scores(tiny("gpt2"), heads={2: [0]}), r"layer 2, which does not exist"),
])
def test_bad_lengths_and_selections_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call(tiny("llama").tokenizer)


def test_scores_of_different_selections_do_not_merge():
    every = r"\{0: \[0, 1, 2, 3\], 1: \[0, 1, 2, 3\]\}"
    with pytest.raises(ValueError, match=rf"^cannot merge retrieval scores of the heads {every} into scores of the "
                                         r"heads \{1: \[0, 1\]\}: the selections differ$"):
        RetrievalScores([4, 4], heads=SELECTION).merge(RetrievalScores([4, 4]))


def test_patterns_must_hold_the_selected_heads():
    case = copy_cases(tiny("llama").tokenizer, ["the cat sat on the mat"], needles=1, needle_length=2,
                      haystack_length=2)[0]
    n = len(case.input_ids)
    scores = RetrievalScores([4, 4], heads=SELECTION)
    with pytest.raises(ValueError, match=r"^patterns of layers \[1\] are missing; these scores count layers \[1\]$"):
        scores.add_copies([case], {0: torch.zeros(1, 4, n, n)}, torch.zeros(1, n, dtype=torch.long))
    with pytest.raises(ValueError, match=rf"layer 1's pattern has shape \(4, {n}, {n}\); this case and the heads "
                                         rf"\[0, 1\] need \(2, {n}, {n}\)"):
        scores.add_copies([case], {1: torch.zeros(1, 4, n, n)}, torch.zeros(1, n, dtype=torch.long))
