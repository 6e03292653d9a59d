"""Rollout and attention flow (Abnar & Zuidema 2020): rollout against explicit loops, the max-flow solver
against hand-built graphs and against every cut of small graphs (max-flow = min-cut), attention flow
against the min cut of the full layered graph."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from headlab.analysis.flow import FLOW_MAX_LENGTH, attention_flow, max_flow, mixed_attention, rollout, text_flow


def min_cut(n_nodes: int, edges, source: int, sink: int) -> float:
    """The smallest capacity of an s–t cut, by trying every side the other nodes may take."""
    others = [v for v in range(n_nodes) if v not in (source, sink)]
    best = float("inf")
    for sides in itertools.product((False, True), repeat=len(others)):
        near = {source} | {v for v, s in zip(others, sides) if s}
        best = min(best, sum(c for u, v, c in edges if u in near and v not in near))
    return best


def test_textbook_graph():
    # Cormen et al.'s flow network (Figure 26.1): s=0, v1..v4 = 1..4, t=5; its max flow is 23
    edges = [(0, 1, 16), (0, 2, 13), (2, 1, 4), (1, 3, 12), (3, 2, 9), (2, 4, 14), (4, 3, 7), (3, 5, 20), (4, 5, 4)]
    result = max_flow(6, edges, 0, 5)
    assert result.value == pytest.approx(23)
    _check_flow(6, edges, 0, 5, result)


def test_a_flow_that_must_undo_a_greedy_path():
    # the path 0→1→2→3 takes both middle edges' room; the maximum sends 1 through 0→1→3 and 1 through 0→2→3
    edges = [(0, 1, 1), (0, 2, 1), (1, 2, 1), (1, 3, 1), (2, 3, 1)]
    assert max_flow(4, edges, 0, 3).value == pytest.approx(2)
    assert max_flow(3, [(0, 1, 0.5), (1, 0, 3.0)], 0, 2).value == 0  # the sink unreachable


def _check_flow(n_nodes, edges, source, sink, result) -> None:
    net = np.zeros(n_nodes)
    for (u, v, c), f in zip(edges, result.flows):
        assert -1e-9 <= f <= c + 1e-9
        net[u] -= f
        net[v] += f
    assert net[sink] == pytest.approx(result.value, abs=1e-9) and net[source] == pytest.approx(-result.value, abs=1e-9)
    assert np.allclose(np.delete(net, [source, sink]), 0, atol=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_random_graphs_equal_their_min_cut(seed):
    rng = random.Random(seed)
    n = rng.randint(3, 9)
    edges = [(u, v, rng.choice([0.0, rng.random(), rng.randint(1, 4)])) for u in range(n) for v in range(n)
             if u != v and rng.random() < 0.45]
    result = max_flow(n, edges, 0, n - 1)
    assert result.value == pytest.approx(min_cut(n, edges, 0, n - 1), abs=1e-9)
    _check_flow(n, edges, 0, n - 1, result)


def _patterns(n_layers: int, n: int, seed: int, heads: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.softmax(torch.randn(heads, n, n, generator=g) * 3, -1) for _ in range(n_layers)]


def test_rollout_equals_the_product_written_out():
    patterns = _patterns(3, 4, seed=0, heads=3)
    mixed = []
    for p in patterns:
        a = [[sum(float(p[h, i, j]) for h in range(3)) / 3 + (i == j) for j in range(4)] for i in range(4)]
        mixed.append([[x / sum(row) for x in row] for row in a])
    np.testing.assert_allclose(mixed_attention(patterns), mixed, rtol=1e-12)
    expected = mixed[0]
    got = rollout(patterns)
    np.testing.assert_allclose(got[0], expected, rtol=1e-12)
    for layer in (1, 2):
        expected = [[sum(mixed[layer][i][k] * expected[k][j] for k in range(4)) for j in range(4)] for i in range(4)]
        np.testing.assert_allclose(got[layer], expected, rtol=1e-12)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_attention_flow_equals_the_min_cut_of_the_whole_layered_graph(seed):
    n_layers, n = 3, 3
    patterns = _patterns(n_layers, n, seed)
    mixed = mixed_attention(patterns).numpy()
    flow = attention_flow(patterns)
    np.testing.assert_allclose(flow[0], mixed[0], rtol=1e-12)
    for depth in range(1, n_layers):
        # every node of every boundary, the other inputs and outputs included: nothing is pruned here
        edges = [(layer * n + j, (layer + 1) * n + i, float(mixed[layer][i, j]))
                 for layer in range(depth + 1) for i in range(n) for j in range(n)]
        for i, j in itertools.product(range(n), range(n)):
            expected = min_cut((depth + 2) * n, edges, j, (depth + 1) * n + i)
            assert float(flow[depth, i, j]) == pytest.approx(expected, abs=1e-9)
    assert float(flow.max()) <= 1 + 1e-9


def test_attention_to_oneself_only_passes_each_token_to_its_own_position():
    n = 3
    identity = [torch.eye(n)[None] for _ in range(3)]  # every token attends to itself: Ã = I
    assert torch.equal(attention_flow(identity)[-1], torch.eye(n, dtype=torch.float64))
    assert torch.equal(rollout(identity)[-1], torch.eye(n, dtype=torch.float64))


def test_long_texts_and_bad_patterns_are_refused_with_the_limit_named():
    n = FLOW_MAX_LENGTH + 1
    with pytest.raises(ValueError,
                       match=f"attention flow is limited to {FLOW_MAX_LENGTH} positions .* this text has {n}"):
        attention_flow([torch.full((1, n, n), 1.0 / n)])
    with pytest.raises(ValueError, match=r"layer 1: pattern has shape \(2, 3, 4\); expected \(head, 3, 3\)"):
        rollout([torch.ones(2, 3, 3) / 3, torch.ones(2, 3, 4) / 4])
    with pytest.raises(ValueError, match="layer 0: attention weights must be finite and >= 0"):
        rollout([-torch.ones(1, 2, 2)])
    with pytest.raises(ValueError, match="no layer given"):
        rollout([])
    with pytest.raises(ValueError, match="source=4 is not a node; expected 0 <= source < n_nodes=3"):
        max_flow(3, [], 4, 0)
    with pytest.raises(ValueError, match=r"edge \(0, 1\) has capacity -1.0; expected a finite number >= 0"):
        max_flow(2, [(0, 1, -1.0)], 0, 1)


def test_text_flow_on_a_tiny_model():
    from tests.support.tiny import tiny

    result = text_flow(tiny("gpt2"), "the cat sat on the mat")
    n = len(result.tokens)
    assert result.rollout.shape == result.flow.shape == (2, n, n)
    assert torch.allclose(result.rollout[:, :, :].sum(-1), torch.ones(2, n, dtype=torch.float64))
    assert (result.rollout[-1].triu(1) == 0).all() and (result.flow[-1].triu(1) == 0).all()  # causal: no future
    assert text_flow(tiny("gpt2"), "the cat", max_length=2).flow is None
