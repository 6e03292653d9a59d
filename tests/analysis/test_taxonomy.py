"""Kovaleva et al. classes: hand-built patterns land in their class; merge == whole; segments."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headlab.analysis import CLASSES, TaxonomyStats, class_shares, classify
from headlab.analysis.reductions import segments
from headlab.analysis.taxonomy import classify_head
from headlab.heads import Heads
from tests.support.analysis import make_batch, patterns_of, sentence

N = 16
STATS = ("special", "band", "block", "block_uniform", "top_columns")


def two_sentences() -> list[str]:
    return ["[CLS]", "a", "b", "c", "d", "e", "f", ".", "g", "h", "i", "j", "k", "l", "m", "[SEP]"]


def block_pattern(tokens: list[str]) -> torch.Tensor:
    """Uniform attention over the query's own sentence, band (|i−j| ≤ 1) and special tokens excluded."""
    batch = make_batch([tokens], {})
    segment, _ = segments(batch)
    n = len(tokens)
    p = torch.zeros(n, n)
    special = batch.special_tokens_mask[0]
    for i in range(n):
        keys = [j for j in range(n) if segment[0, j] == segment[0, i] and abs(i - j) > 1 and not special[j]]
        if keys and not special[i]:
            p[i, keys] = 1 / len(keys)
        else:
            p[i, 0] = 1
    return p


def test_segments():
    batch = make_batch([two_sentences(), sentence(5)], {})
    segment, n_content = segments(batch)
    assert segment[0].tolist() == [0] + [1] * 7 + [2] * 8  # [SEP] closes the second sentence
    assert n_content.tolist() == [2, 1]


def test_hand_built_classes():
    tokens = two_sentences()
    kinds = [patterns_of("cls", N), patterns_of("previous", N), patterns_of("identity", N),
             0.5 * patterns_of("cls", N) + 0.5 * patterns_of("previous", N), block_pattern(tokens),
             patterns_of("uniform", N)]
    stats = TaxonomyStats()
    stats.update(make_batch([tokens], {2: torch.stack(kinds)[None]}))
    result = stats.result()
    classes = classify(result)
    assert classes == {(2, 0): "vertical", (2, 1): "diagonal", (2, 2): "diagonal", (2, 3): "vertical+diagonal",
                       (2, 4): "block", (2, 5): "heterogeneous"}
    shares = class_shares(classes)
    assert set(shares) == set(CLASSES) and shares["diagonal"] == pytest.approx(2 / 6)
    assert result.heads == [(2, h) for h in range(6)] and list(result.columns) == list(STATS)


def test_vertical_on_a_non_special_column():
    p = torch.zeros(N, N)
    p[:, 3] = 1  # a stripe on a content token
    stats = TaxonomyStats()
    stats.update(make_batch([sentence(N)], {0: p[None, None]}))
    result = stats.result()
    assert result.value("special", 0, 0) == 0 and result.value("top_columns", 0, 0) == 1
    assert classify(result) == {(0, 0): "vertical"}
    with pytest.raises(KeyError, match=r"\(layer 0, head 1\) is not in this table"):
        classify_head(result, 0, 1)


def test_no_block_without_two_segments():
    stats = TaxonomyStats()
    stats.update(make_batch([sentence(N)], {0: patterns_of("uniform", N)[None, None]}))
    assert math.isnan(stats.result().value("block", 0, 0)) and stats.result().to_dict()["rows"][0]["block"] is None
    assert classify(stats.result()) == {(0, 0): "heterogeneous"}


def test_merge_equals_whole():
    torch.manual_seed(1)
    batches = [make_batch([two_sentences(), sentence(n)], {0: torch.softmax(torch.randn(2, 3, N, N), -1)})
               for n in (6, 11, N)]
    whole, first, second = TaxonomyStats(), TaxonomyStats(), TaxonomyStats()
    for b in batches:
        whole.update(b)
    first.update(batches[0])
    for b in batches[1:]:
        second.update(b)
    merged, expected = first.merge(second).result(), whole.result()
    assert merged.heads == expected.heads == [(0, h) for h in range(3)]
    for name in STATS:
        np.testing.assert_allclose(merged[name], expected[name], rtol=1e-12, atol=1e-12)


def test_matches_slow_loops_on_minilm():
    from headlab.analysis import taxonomy_stats
    from headlab.capture import capture
    from tests.support.minilm import minilm

    loaded = minilm()
    texts = ["The cat sat. Then it slept!", "One sentence only", "A first part. A second part. A third."]
    kept = []

    class Keep:
        def update(self, batch):
            kept.append(batch)

    stats = TaxonomyStats()
    capture(loaded, corpus=texts, heads=Heads(layers=[1, 4], heads=[2, 9]), consumers=[stats, Keep()], progress=False)
    result = stats.result()
    wrapped = taxonomy_stats(loaded, texts, heads=Heads(layers=[1, 4], heads=[2, 9]), progress=False)
    np.testing.assert_array_equal(wrapped["band"], result["band"])
    assert result.heads == [(layer, h) for layer in (1, 4) for h in (2, 9)]
    for layer, head in result.heads:
        hi = kept[0].layers[layer].heads.index(head)
        band = special = top = block = 0.0
        n_queries = n_items = n_block = 0
        for batch in kept:
            segment, n_content = segments(batch)
            for b in range(len(batch)):
                n = int(batch.lengths[b])
                is_special = batch.special_tokens_mask[b, :n].tolist()
                p = batch.layers[layer].pattern[b, hi, :n, :n].tolist()
                columns = [sum(p[i][j] for i in range(n)) / n for j in range(n)]
                top += sum(sorted(columns)[-2:])
                n_items += 1
                for i in range(n):
                    n_queries += 1
                    band += sum(p[i][j] for j in range(n) if abs(i - j) <= 1)
                    special += sum(p[i][j] for j in range(n) if is_special[j])
                    if n_content[b] >= 2 and not is_special[i]:
                        n_block += 1
                        block += sum(p[i][j] for j in range(n) if abs(i - j) > 1 and not is_special[j]
                                     and segment[b, j] == segment[b, i])
        # rows are reduced in float32 (the patterns' dtype), the corpus sums in float64
        assert result.value("band", layer, head) == pytest.approx(band / n_queries, rel=1e-6)
        assert result.value("special", layer, head) == pytest.approx(special / n_queries, rel=1e-6)
        assert result.value("top_columns", layer, head) == pytest.approx(top / n_items, rel=1e-6)
        assert result.value("block", layer, head) == pytest.approx(block / n_block, rel=1e-6, abs=1e-9)
    assert set(classify(result).values()) <= set(CLASSES)
