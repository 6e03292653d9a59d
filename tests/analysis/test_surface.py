"""SurfaceStats: exact values on hand-built patterns, merge == whole, the table's rows and lookups, and a
slow loop on real MiniLM patterns."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headlab.analysis import STATISTICS, SurfaceStats
from headlab.analysis.reductions import is_punctuation
from headlab.capture import CaptureBatch, capture
from headlab.heads import Heads
from tests.support.analysis import make_batch, patterns_of, sentence


def one_head(kind: str, n: int) -> CaptureBatch:
    return make_batch([sentence(n)], {0: patterns_of(kind, n)[None, None]})


def only(table, name: str) -> float:
    """The value of column ``name`` of a one-head table (head 0.0)."""
    assert table.heads == [(0, 0)]
    return table.value(name, 0, 0)


def test_punctuation_rule():
    assert [is_punctuation(t) for t in [".", ",", "##.", "Ġ,", "▁!", "...", "a.", "[CLS]", "##", "", "ĠThe"]] == \
        [True, True, True, True, True, True, False, False, False, False, False]


@pytest.mark.parametrize("n", [3, 9])
def test_identity(n):
    stats = SurfaceStats()
    stats.update(one_head("identity", n))
    r = stats.result()
    assert only(r, "to_self") == 1 and only(r, "entropy") == 0 and only(r, "distance") == 0
    assert only(r, "confidence") == 1
    assert only(r, "to_prev") == 0 and only(r, "to_next") == 0
    assert only(r, "to_cls") == pytest.approx(1 / n) and only(r, "to_sep") == pytest.approx(1 / n)
    assert only(r, "to_punct") == pytest.approx(1 / n)
    assert only(r, "uniform_entropy") == pytest.approx(math.log(n))
    assert only(r, "n_queries") == n


def test_previous_and_next():
    n = 8
    stats = SurfaceStats()
    stats.update(one_head("previous", n))
    r = stats.result()
    assert only(r, "to_prev") == 1  # every query with a previous token puts all its mass there
    assert only(r, "to_self") == pytest.approx(1 / n)  # only query 0
    assert only(r, "distance") == pytest.approx((n - 1) / n)
    stats = SurfaceStats()
    stats.update(one_head("next", n))
    r = stats.result()
    assert only(r, "to_next") == 1 and only(r, "to_prev") == 0


def test_uniform():
    n = 7
    stats = SurfaceStats()
    stats.update(one_head("uniform", n))
    r = stats.result()
    assert only(r, "entropy") == pytest.approx(math.log(n)) and only(r, "uniform_entropy") == pytest.approx(math.log(n))
    assert only(r, "confidence") == pytest.approx(1 / n)
    # Σ_i Σ_j |i−j| / n² for a uniform row
    assert only(r, "distance") == pytest.approx(sum(abs(i - j) for i in range(n) for j in range(n)) / n**2)


@pytest.mark.parametrize(("kind", "field"), [("cls", "to_cls"), ("sep", "to_sep"), ("punct", "to_punct")])
def test_columns(kind, field):
    stats = SurfaceStats()
    stats.update(one_head(kind, 6))
    r = stats.result()
    assert only(r, field) == 1
    assert sum(only(r, f) for f in ("to_cls", "to_sep", "to_punct")) == 1


def test_causal_uniform_entropy_and_padding_ignored():
    n = 5
    p = torch.tril(torch.ones(n, n)) / torch.arange(1, n + 1)[:, None]  # uniform over the allowed keys
    padded = torch.zeros(1, 1, n + 2, n + 2)
    padded[0, 0, :n, :n] = p
    padded[0, 0, n:] = float("nan")  # padded query rows may hold anything
    tokens = [sentence(n), sentence(n + 2)]
    full = torch.stack([padded[0], torch.eye(n + 2)[None]])
    stats = SurfaceStats(causal=True)
    stats.update(make_batch(tokens, {0: full}))
    r = stats.result()
    logs = [math.log(i + 1) for i in range(n)] + [math.log(i + 1) for i in range(n + 2)]
    assert only(r, "uniform_entropy") == pytest.approx(sum(logs) / len(logs))
    assert only(r, "entropy") == pytest.approx(sum(math.log(i + 1) for i in range(n)) / len(logs))
    assert only(r, "n_queries") == 2 * n + 2


def test_merge_equals_whole_and_rows():
    torch.manual_seed(0)
    batches = []
    for n in (5, 9, 12):
        layers = {layer: torch.softmax(torch.randn(2, 3, n, n), -1) for layer in (1, 4)}
        batches.append(make_batch([sentence(n), sentence(n)], layers))
    whole, first, second = SurfaceStats(), SurfaceStats(), SurfaceStats()
    for b in batches:
        whole.update(b)
    first.update(batches[0])
    second.update(batches[1])
    second.update(batches[2])
    merged = first.merge(second).result()
    expected = whole.result()
    assert merged.heads == expected.heads == [(layer, h) for layer in (1, 4) for h in range(3)]
    for name in STATISTICS:
        np.testing.assert_allclose(merged[name], expected[name], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(merged["n_queries"], expected["n_queries"])
    rows = expected.rows()
    assert len(rows) == 6 and set(rows[0]) == {"layer", "head", "n_queries", *STATISTICS}
    assert list(expected.columns) == ["n_queries", *STATISTICS] and expected.layers == [1, 4]


def test_each_row_holds_its_own_heads_means():
    """A head's row equals the slow loops over that head's patterns, heads captured in any order."""
    torch.manual_seed(2)

    def padded(n_heads: int, n: int) -> torch.Tensor:  # item 1 is 2 pieces shorter: no mass on its padding
        scores = torch.randn(2, n_heads, n, n)
        scores[1, :, :, n - 2:] = -math.inf
        return torch.softmax(scores, -1)

    batches = [make_batch([sentence(n), sentence(n - 2)], {0: padded(2, n), 3: padded(3, n)},
                          heads={0: (5, 1), 3: (2, 0, 7)}) for n in (6, 10)]
    stats = SurfaceStats()
    for b in batches:
        stats.update(b)
    r = stats.result()
    assert r.heads == [(0, 1), (0, 5), (3, 0), (3, 2), (3, 7)]
    for layer, head in r.heads:
        totals, counts = dict.fromkeys(STATISTICS, 0.0), {"queries": 0, "positions": 0, "prev": 0, "next": 0}
        for batch in batches:
            slot = batch.layers[layer].heads.index(head)
            for b in range(len(batch)):
                n = int(batch.lengths[b])
                p = batch.layers[layer].pattern[b, slot, :n, :n].tolist()
                sums, seen = slow_statistics(batch.tokens[b], batch.special_tokens_mask[b, :n].tolist(), p)
                totals = {k: totals[k] + sums[k] for k in totals}
                counts = {k: counts[k] + seen[k] for k in counts}
        assert r.value("n_queries", layer, head) == counts["queries"]
        for name, count in STATISTICS.items():
            assert r.value(name, layer, head) == pytest.approx(totals[name] / counts[count], rel=1e-6, abs=1e-9)


def test_heads_differ_and_uncaptured_heads_have_no_row():
    p = torch.softmax(torch.randn(1, 2, 4, 4), -1)
    stats = SurfaceStats()
    stats.update(make_batch([sentence(4)], {0: p, 1: p}, heads={0: (0, 1), 1: (2, 3)}))
    r = stats.result()
    assert r.heads == [(0, 0), (0, 1), (1, 2), (1, 3)] and not np.isnan(r["to_self"]).any()
    assert r.value("to_self", 1, 2) == r.value("to_self", 0, 0)  # the same pattern, as head 0.2 and 1.2
    with pytest.raises(KeyError, match=r"\(layer 0, head 2\) is not in this table"):
        r.value("to_self", 0, 2)
    grid = r.grid("to_self")  # the heatmap layout: NaN where a head was not captured
    assert math.isnan(grid[0, 2]) and grid[1, 2] == r.value("to_self", 1, 2)
    with pytest.raises(ValueError, match="heads"):
        stats.update(make_batch([sentence(4)], {0: p}, heads={0: (1, 2)}))
    with pytest.raises(ValueError, match="no data"):
        SurfaceStats().result()


def slow_statistics(tokens, special, p):
    """Plain loops over one item's (q, k) pattern: the per-row statistics, summed; and counts."""
    n = len(tokens)
    sums = dict.fromkeys(STATISTICS, 0.0)
    counts = {"queries": 0, "positions": 0, "prev": 0, "next": 0}
    for i in range(n):
        row = [float(p[i][j]) for j in range(n)]
        counts["queries"] += 1
        counts["positions"] += 1  # queries and keys of one text
        sums["to_cls"] += row[0] if special[0] else 0.0
        sums["to_sep"] += sum(row[j] for j in range(1, n) if special[j])
        sums["to_punct"] += sum(row[j] for j in range(n) if is_punctuation(tokens[j]) and not special[j])
        sums["to_self"] += row[i]
        if i > 0:
            sums["to_prev"] += row[i - 1]
            counts["prev"] += 1
        if i < n - 1:
            sums["to_next"] += row[i + 1]
            counts["next"] += 1
        sums["entropy"] -= sum(x * math.log(x) for x in row if x > 0)
        sums["uniform_entropy"] += math.log(n)
        sums["distance"] += sum(x * abs(i - j) for j, x in enumerate(row))
        sums["confidence"] += max(row)
    return sums, counts


def test_matches_slow_loops_on_minilm():
    from tests.support.minilm import minilm

    loaded = minilm()
    texts = ["The cat sat on the mat, and then it slept.", "Why?", "Attention heads (some of them) look at commas."]
    kept = []

    class Keep:
        def update(self, batch):
            kept.append(batch)

    stats = SurfaceStats()
    capture(loaded, corpus=texts, heads=Heads(layers=[0, 5], heads=[0, 3, 7]), consumers=[stats, Keep()],
            progress=False)
    r = stats.result()
    assert r.heads == [(layer, h) for layer in (0, 5) for h in (0, 3, 7)]
    for name in STATISTICS:
        for layer, head in r.heads:
            total, n = 0.0, 0
            for batch in kept:
                slot = batch.layers[layer].heads.index(head)
                for b in range(len(batch)):
                    length = int(batch.lengths[b])
                    special = batch.special_tokens_mask[b, :length].tolist()
                    p = batch.layers[layer].pattern[b, slot, :length, :length].tolist()
                    sums, counts = slow_statistics(batch.tokens[b], special, p)
                    total += sums[name]
                    n += counts[STATISTICS[name]]
            # rows are reduced in float32 (the patterns' dtype), the corpus sums in float64
            assert r.value(name, layer, head) == pytest.approx(total / n, rel=1e-6, abs=1e-9), (name, layer, head)


def test_surface_stats_runs_a_capture_and_reads_causality():
    from headlab.analysis import surface_stats
    from headlab.analysis.surface import is_causal
    from tests.support.minilm import minilm

    loaded = minilm()
    assert not is_causal(loaded)
    r = surface_stats(loaded, ["A short text, with a comma."], heads=Heads(layers=[2]), progress=False)
    assert r.layers == [2] and r.heads == [(2, h) for h in range(12)]
    assert np.all(r["entropy"] <= r["uniform_entropy"] + 1e-9) and np.all(r["confidence"] <= 1)
