"""SinkShare (Xiao et al. 2023) against an explicit float64 loop: per bin of query position, per head, growth."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headlab.analysis.sinks import SinkShare, plot_sink_share
from tests.support.analysis import hand_batch, w_o

HEADS = {0: (0, 1), 1: (2,)}
EDGES = (0, 1, 2, 4, 8)


def reference(batches, n_sink: int, W_O=None):
    """{(layer, head): {"raw": ({bin: [shares]}, [(x, share)] past n_sink), "weighted": ...}} by loops."""
    out = {}
    for batch in batches:
        for layer, taken in batch.layers.items():
            for hi, head in enumerate(taken.heads):
                held = out.setdefault((layer, head), {"raw": ({}, []), "weighted": ({}, [])})
                for row in range(len(batch)):
                    n = int(batch.lengths[row])
                    norms = None
                    if W_O is not None:
                        w = W_O[layer][head].double()
                        norms = [float(torch.linalg.vector_norm(taken.v[row, hi, j].double() @ w)) for j in range(n)]
                    for i in range(n):
                        alpha = [float(taken.pattern[row, hi, i, j]) for j in range(n)]
                        shares = {"raw": sum(alpha[:n_sink])}
                        if norms is not None:
                            weighted = [a * m for a, m in zip(alpha, norms)]
                            shares["weighted"] = sum(weighted[:n_sink]) / sum(weighted)
                        b = max(k for k, e in enumerate(EDGES) if e <= i)
                        for kind, share in shares.items():
                            held[kind][0].setdefault(b, []).append(share)
                            if i >= n_sink:
                                held[kind][1].append((math.log2(i), share))
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_hand_built_batches_equal_the_loop_and_halves_merge(causal):
    W_O = w_o({0: 2, 1: 3})
    batches = [hand_batch([9, 4, 6], heads=HEADS, seed=0, causal=causal),
               hand_batch([12, 2], heads=HEADS, seed=1, causal=causal)]
    whole = SinkShare(n_sink=2, edges=EDGES, W_O=W_O)
    for b in batches:
        whole.update(b)
    result = whole.result()
    expected = reference(batches, 2, W_O)
    assert result.heads == [(0, 0), (0, 1), (1, 2)]
    for row, key in enumerate(result.heads):
        for kind, values in (("raw", result.raw), ("weighted", result.weighted)):
            by_bin, past = expected[key][kind]
            for b in range(len(EDGES)):
                if b in by_bin:
                    assert values[row, b] == pytest.approx(np.mean(by_bin[b]), rel=1e-6)
                else:
                    assert math.isnan(values[row, b])
            x, y = np.array(past).T
            assert result.table.value(f"{kind}_share", *key) == pytest.approx(y.mean(), rel=1e-6)
            slope = np.polyfit(x, y, 1)[0]
            assert result.table.value(f"{kind}_growth", *key) == pytest.approx(slope, rel=1e-5, abs=1e-9)
        assert result.table.value("n_queries", *key) == len(expected[key]["raw"][1])
        assert result.table.value("sink_head", *key) == float(result.table.value("raw_share", *key) >= 0.5)
    first, second = SinkShare(n_sink=2, edges=EDGES, W_O=W_O), SinkShare(n_sink=2, edges=EDGES, W_O=W_O)
    first.update(batches[0])
    second.update(batches[1])
    merged = first.merge(second).result()
    np.testing.assert_allclose(merged.raw, result.raw, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(merged.weighted, result.weighted, rtol=1e-12, equal_nan=True)
    for name in result.table.columns:
        np.testing.assert_allclose(merged.table[name], result.table[name], rtol=1e-10, equal_nan=True)


def test_value_weighted_and_sink_share_read_each_batchs_values_once_and_equal_their_runs_alone(monkeypatch):
    from headlab.analysis.norms import ValueProjections, ValueWeighted, value_reductions

    W_O = w_o({0: 2, 1: 3})

    def make():
        return [ValueWeighted(W_O), SinkShare(n_sink=1, edges=EDGES, W_O=W_O)]

    alone = []
    for accumulator in make():
        accumulator.update(hand_batch([9, 4, 6], heads=HEADS, seed=0))
        alone.append(accumulator)
    calls = []
    real_norms = ValueProjections.norms
    monkeypatch.setattr(ValueProjections, "norms",
                        lambda self, taken, **k: calls.extend(t.layer for t in taken) or real_norms(self, taken, **k))
    batch = hand_batch([9, 4, 6], heads=HEADS, seed=0)
    together = make()  # two ValueProjections of equal W_O: one key, so one ValueReductions per batch
    for accumulator in together:
        accumulator.update(batch)
    assert sorted(calls) == sorted(HEADS) and value_reductions(batch, together[1].projections) is \
        value_reductions(batch, together[0].projections)
    for name in alone[0].result().columns:
        np.testing.assert_array_equal(together[0].result()[name], alone[0].result()[name])
    np.testing.assert_array_equal(together[1].result().weighted, alone[1].result().weighted)
    other = ValueWeighted(w_o({0: 2, 1: 3}, seed=5))  # another W_O: its own reductions
    assert other.projections.key != together[0].projections.key


def test_a_causal_query_before_the_sink_ends_sees_only_sinks_and_a_sink_head_is_found():
    batch = hand_batch([10], heads={0: (0, 1)}, causal=True)
    p = batch.layers[0].pattern
    p[0, 1] = 0.0
    p[0, 1, :, 0] = 1.0  # head 1 puts everything on the first token
    acc = SinkShare(n_sink=4, edges=EDGES)
    acc.update(batch)
    result = acc.result()
    assert result.weighted is None and "weighted_share" not in result.table.columns
    assert np.allclose(result.raw[:, :3], 1.0)  # queries 0–3 see only the four sink positions
    assert result.sink_heads() == [(0, 1)] and result.table.value("raw_growth", 0, 1) == 0
    assert result.bin_labels() == ["0", "1", "2–3", "4–7", "8+"]
    assert result.to_dict()["bins"] == ["0", "1", "2–3", "4–7", "8+"]


def test_plot_is_written(tmp_path):
    acc = SinkShare(n_sink=1, edges=EDGES, W_O=w_o({0: 2, 1: 3}))
    acc.update(hand_batch([9, 4], heads=HEADS))
    plot_sink_share(acc.result(), tmp_path / "sinks.png")
    assert (tmp_path / "sinks.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"n_sink=0; expected an int >= 1"):
        SinkShare(n_sink=0)
    with pytest.raises(ValueError, match=r"edges=\(1, 2\); expected increasing positions starting at 0"):
        SinkShare(edges=(1, 2))
    batch = hand_batch([3], heads={0: (0,)})
    batch.layers[0].v = None
    with pytest.raises(ValueError, match="layer 0 was captured without v"):
        SinkShare(W_O={0: torch.ones(1, 3, 5)}).update(batch)
    with pytest.raises(ValueError, match=r"cannot merge SinkShare\(2, .*; expected the same type and settings"):
        SinkShare(n_sink=1).merge(SinkShare(n_sink=2))
