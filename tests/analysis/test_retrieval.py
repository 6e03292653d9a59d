"""Retrieval scores (Wu et al. 2024): a hand-built case against counts worked out by hand; a tiny causal
model against an explicit loop over transformers' own attention weights; a planted head that attends to
every copied token scores 1; sums merge; encoders and bad sizes are refused in one line."""

from __future__ import annotations

import pytest
import torch

from headlab.analysis.retrieval import CopyCase, RetrievalScores, copy_cases, retrieval_scores
from tests.support.tiny import tiny

pytest.importorskip("transformers")

# [bos, hay, hay] + needle (12, 13, 12, 14) at 3…6 + [hay, hay] + the copy at 9…12.
HAND = CopyCase((1, 10, 11, 12, 13, 12, 14, 20, 21, 12, 13, 12, 14), needle_start=3, copy_start=9, length=4)


def _hand_patterns():
    """Layer 0 with 2 heads, layer 1 with 1; each copy query's most-attended key set by hand."""
    tops = {(0, 0): [4, 5, 2], (0, 1): [10, 3, 6], (1, 0): [4, 3, 6]}  # keys for queries 9, 10, 11
    patterns = {0: torch.full((1, 2, 13, 13), 0.01), 1: torch.full((1, 1, 13, 13), 0.01)}
    for (layer, head), keys in tops.items():
        for query, key in zip((9, 10, 11), keys):
            patterns[layer][0, head, query, key] = 0.9
    return patterns


def test_a_hand_built_case_counts_what_the_definition_says():
    queries, targets, allowed = HAND.steps()
    assert queries.tolist() == [9, 10, 11] and targets.tolist() == [13, 12, 14]
    assert [row.nonzero().flatten().tolist() for row in allowed] == [[4], [3, 5], [6]]  # 12 sits at 3 and 5
    predicted = torch.zeros(1, 13, dtype=torch.long)
    predicted[0, 9:12] = torch.tensor([13, 99, 14])  # the model copies steps 1 and 3, not step 2
    scores = RetrievalScores([2, 1])
    scores.add_copies([HAND], _hand_patterns(), predicted)
    result = scores.result()
    # (0, 0) attends at steps 1, 2 (key 5 holds 12 too); (0, 1) at 2, 3; (1, 0) at all three.
    assert result.table["attended"].tolist() == [2 / 3, 2 / 3, 1.0]
    assert result.table["retrieved"].tolist() == [1, 1, 2]
    assert result.table["score"].tolist() == [1 / 3, 1 / 3, 2 / 3]
    assert (result.needles, result.steps, result.copied) == (1, 3, 2)
    assert result.copy_accuracy == 2 / 3
    assert result.top(1) == [(1, 0)] and result.retrieval_heads() == [(1, 0), (0, 0), (0, 1)]
    assert result.to_dict()["retrieval_heads"] == [[1, 0], [0, 0], [0, 1]]


def test_copy_cases_hold_a_needle_and_its_copy():
    model = tiny("gpt2")
    cases = copy_cases(model.tokenizer, ["the cat sat on the mat", "a big red dog ran"], needles=5,
                       needle_length=3, haystack_length=4, seed=3)
    assert len(cases) == 5 and len({c.input_ids for c in cases}) > 1
    for case in cases:
        assert case.input_ids[0] == model.tokenizer.bos_token_id and len(case.input_ids) == 1 + 4 + 2 * 3
        assert case.input_ids[-3:] == case.needle
    assert copy_cases(model.tokenizer, ["the cat sat on the mat"], needles=2, needle_length=2, haystack_length=3,
                      seed=1) == copy_cases(model.tokenizer, ["the cat sat on the mat"], needles=2, needle_length=2,
                                            haystack_length=3, seed=1)


def _reference(model, cases):
    """Explicit loops over transformers' ``output_attentions`` (the eager path) and the model's argmax."""
    sites_heads = None
    attended, retrieved, steps = {}, {}, 0
    for case in cases:
        with torch.no_grad():
            out = model.model(input_ids=torch.tensor([case.input_ids]), output_attentions=True)
        sites_heads = [a.shape[1] for a in out.attentions]
        needle = case.needle
        for i in range(1, case.length):
            query, target = case.copy_start + i - 1, needle[i]
            copied = int(out.logits[0, query].argmax()) == target
            steps += 1
            for layer, pattern in enumerate(out.attentions):
                for head in range(pattern.shape[1]):
                    top = int(pattern[0, head, query].argmax())
                    hit = case.needle_start <= top < case.needle_start + case.length and case.input_ids[top] == target
                    attended[layer, head] = attended.get((layer, head), 0) + hit
                    retrieved[layer, head] = retrieved.get((layer, head), 0) + (hit and copied)
    return sites_heads, attended, retrieved, steps


def test_a_tiny_causal_model_matches_an_explicit_loop():
    model = tiny("gpt2")
    result = retrieval_scores(model, corpus=["the cat sat on the mat while the dog ran to a big red mat"],
                              needles=12, needle_length=5, haystack_length=3, batch_size=5, seed=2)
    cases = copy_cases(model.tokenizer, ["the cat sat on the mat while the dog ran to a big red mat"], needles=12,
                       needle_length=5, haystack_length=3, seed=2)
    n_heads, attended, retrieved, steps = _reference(model, cases)
    assert (result.needles, result.steps) == (12, steps) and n_heads == [4, 4]
    for (layer, head), count in attended.items():
        assert result.table.value("attended", layer, head) * steps == pytest.approx(count)
        assert result.table.value("retrieved", layer, head) == retrieved[layer, head]
    assert sum(attended.values()) > 0  # some random head does land on the needle: the check is not vacuous


def test_a_planted_head_that_attends_to_every_copied_token_scores_one():
    from headlab.capture import run_with_cache

    model = tiny("gpt2")
    cases = copy_cases(model.tokenizer, ["the cat sat on a big red mat while the dog ran"], needles=6,
                       needle_length=4, haystack_length=6, seed=0)
    cache = run_with_cache(model, torch.tensor([c.input_ids for c in cases]), take=("pattern",))
    patterns = {layer: cache["pattern", layer].clone() for layer in range(2)}
    predicted = cache.output.logits.argmax(-1)
    for b, case in enumerate(cases):  # plant: head L1 H2 puts all its weight on the token being copied,
        queries, targets, _ = case.steps()  # and the model predicts it
        patterns[1][b, 2, queries] = 0.0
        patterns[1][b, 2, queries, case.needle_start + torch.arange(1, case.length)] = 1.0
        predicted[b, queries] = targets
    scores = RetrievalScores([4, 4])
    scores.add_copies(cases, patterns, predicted)
    result = scores.result()
    assert result.table.value("score", 1, 2) == 1.0 and result.table.value("attended", 1, 2) == 1.0
    assert result.top(1) == [(1, 2)] and (1, 2) in result.retrieval_heads()
    assert result.copy_accuracy == 1.0


def test_scores_merge_across_batches():
    model = tiny("gpt2")
    cases = copy_cases(model.tokenizer, ["the cat sat on a big red mat while the dog ran"], needles=4,
                       needle_length=4, haystack_length=5, seed=0)
    from headlab.capture import run_with_cache

    def scored(part):
        cache = run_with_cache(model, torch.tensor([c.input_ids for c in part]), take=("pattern",))
        scores = RetrievalScores([4, 4])
        scores.add_copies(part, {layer: cache["pattern", layer] for layer in range(2)}, cache.output.logits.argmax(-1))
        return scores

    whole, merged = scored(cases).result(), scored(cases[:1]).merge(scored(cases[1:])).result()
    assert merged.to_dict() == whole.to_dict()
    with pytest.raises(ValueError, match=r"cannot merge retrieval scores of heads \[4\] into \[4, 4\]"):
        RetrievalScores([4, 4]).merge(RetrievalScores([4]))


def test_an_encoder_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="need a causal language model; tiny random bert attends both ways"):
        retrieval_scores(tiny("bert"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(needles=0), r"needles=0: expected an int >= 1"),
    (dict(needle_length=1), r"needle_length=1: expected an int >= 2"),
    (dict(haystack_length=-1), r"haystack_length=-1: expected an int >= 0"),
    (dict(batch_size=0), r"batch_size=0: expected an int >= 1"),
    (dict(corpus=["the cat"], haystack_length=10), r"the corpus has 2 tokens; a needle of 12 and a haystack of 10"),
    (dict(haystack_length=2500), r"a copy case is 2525 tokens; tiny random gpt2 takes 2100: lower haystack_length"),
])
def test_bad_sizes_are_one_line_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        retrieval_scores(tiny("gpt2"), **kwargs)


def test_a_copy_case_that_does_not_copy_is_refused():
    with pytest.raises(ValueError, match="the copy at 4 is not the needle at 1"):
        CopyCase((1, 5, 6, 7, 5, 9), needle_start=1, copy_start=4, length=2)
    with pytest.raises(ValueError, match="needle of >= 2 tokens ending before its copy"):
        CopyCase((1, 5, 5), needle_start=1, copy_start=2, length=1)
