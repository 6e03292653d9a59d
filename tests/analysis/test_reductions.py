"""The reductions shared by the accumulators of a batch: each one against its formula, computed once
per batch however many accumulators read it, and the accumulators' results unchanged by the sharing.

Axis legend: patterns ``(batch, head, query_pos, key_pos)``; rows ``(batch, head, query_pos)``; a stack's
reductions have a layer axis in front.
"""

from __future__ import annotations

import pytest
import torch

from headlab.analysis import HeadSimilarity, SurfaceStats, TaxonomyStats
from headlab.analysis.reductions import (
    COLUMNS,
    BatchReductions,
    StackReductions,
    column_masses,
    reductions,
    stack_layers,
)
from headlab.capture import LayerCapture
from tests.support.analysis import make_batch, sentence


def _random_batch(*, seed: int = 0, nan_padding: bool = True, dtype: torch.dtype = torch.float64):
    """Two layers of random row-stochastic patterns over ragged items; padded query rows NaN, padded keys 0."""
    g = torch.Generator().manual_seed(seed)
    tokens = [sentence(9), ["[CLS]", "a", ",", "b", ".", "c", "d", "[SEP]"], sentence(5)]
    pos = max(len(t) for t in tokens)
    layers = {}
    for layer, n_heads in ((0, 3), (2, 2)):
        scores = torch.randn(len(tokens), n_heads, pos, pos, generator=g, dtype=torch.float64)
        for row, t in enumerate(tokens):
            scores[row, :, :, len(t):] = float("-inf")
        p = scores.softmax(-1)
        if nan_padding:
            for row, t in enumerate(tokens):
                p[row, :, len(t):] = float("nan")
        layers[layer] = p.to(dtype)
    return make_batch(tokens, layers)


def test_one_reductions_object_per_batch_and_layer():
    batch = _random_batch()
    shared = reductions(batch)
    assert reductions(batch) is shared and isinstance(shared, BatchReductions)
    assert shared.stack(2) is shared.stack(2) and isinstance(shared.stack(2), StackReductions)
    assert [rows.layers for rows in shared.stacks] == [(0,), (2,)]  # other heads: a stack each
    assert reductions(_random_batch()) is not shared  # a new batch: new reductions


@pytest.mark.parametrize("group_cost", [None, 0], ids=["default groups", "every item its own group"])
def test_each_reduction_equals_its_formula(group_cost, monkeypatch):
    if group_cost is not None:
        monkeypatch.setattr("headlab.capture.batching.GROUP_COST", group_cost)
    batch = _random_batch()
    assert len(batch.length_groups()) == (1 if group_cost is None else len(batch))
    shared = reductions(batch)
    real = batch.attention_mask.bool()
    special = batch.special_tokens_mask.bool() & real
    for layer, taken in batch.layers.items():
        p, stack = taken.pattern, shared.stack(layer)
        rows = _Layer(stack, stack.layers.index(layer))
        ok = real[:, None, :].expand(p.shape[:-1])  # real query rows
        n = p.shape[-1]
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]

        def close(got, want, ok=ok):  # this layer's query rows, bound now
            torch.testing.assert_close(got[ok], want[ok], atol=1e-12, rtol=0)

        first = torch.zeros_like(special)
        first[:, 0] = special[:, 0]
        close(rows.mass("first_special"), (p * first[:, None, None, :]).sum(-1))
        close(rows.mass("other_special"), (p * (special & ~first)[:, None, None, :]).sum(-1))
        close(rows.mass("special"), (p * special[:, None, None, :]).sum(-1))
        punctuation = torch.tensor([[t in (",", ".") for t in ts] + [False] * (n - len(ts)) for ts in batch.tokens])
        close(rows.mass("punctuation"), (p * punctuation[:, None, None, :]).sum(-1))
        for offset in (-1, 0, 1):
            close(rows.diagonal(offset), (p * (j - i == offset)).sum(-1))
        close(rows.entropy, -(p * p.clamp_min(1e-300).log()).sum(-1))
        close(rows.distance, (p * (i - j).abs()).sum(-1))
        close(rows.confidence, p.amax(-1))
        want_sums = torch.where(real[:, None, :, None], p, 0.0).sum(-2)  # NaN padded rows left out
        torch.testing.assert_close(rows.key_sums, want_sums, atol=1e-12, rtol=0)
        segment_masses = rows.segment_masses
        assert segment_masses.shape[-1] == int(shared.segment.max()) + 1
        for s in range(segment_masses.shape[-1]):
            keys = (shared.segment == s) & shared.content
            close(segment_masses[..., s], (p * keys[:, None, None, :]).sum(-1))
    assert len(COLUMNS) == 4


def test_layers_are_stacked_where_they_agree_in_heads_and_shape_and_copied_up_to_a_size(monkeypatch):
    batch = _random_batch()  # layer 0: 3 heads, layer 2: 2 heads
    assert stack_layers(batch) == [(0,), (2,)]  # other heads: not one stack
    p = batch.layers[2].pattern
    batch.layers = {layer: LayerCapture(layer=layer, heads=(0, 1), pattern=p.clone()) for layer in (0, 1, 3, 4, 7)}
    batch.layers[4].pattern = p.flip(0)  # another pattern of the same shape
    assert stack_layers(batch) == [(0, 1, 3, 4, 7)]  # a CPU: each layer read where it lies, so no size limit
    monkeypatch.setattr("headlab.analysis.reductions._GPU_STACK_BYTES", 2 * p.numel() * p.element_size())
    assert stack_layers(batch) == [(0, 1, 3, 4, 7)]
    [rows] = reductions(batch).stacks
    assert [layers for _, layers in rows.parts] == [slice(i, i + 1) for i in range(5)]
    assert rows.parts[3][0].data_ptr() == batch.layers[4].pattern.data_ptr()  # a view, no copy
    assert rows.shape == (5, *p.shape)
    batch.release_shared()
    monkeypatch.setattr("headlab.analysis.reductions.launch_bound", lambda device: True)  # as on a GPU
    assert stack_layers(batch) == [(0, 1), (3, 4), (7,)]
    stacks = reductions(batch).stacks
    assert [[layers for _, layers in rows.parts] for rows in stacks] == [[slice(0, 2)], [slice(0, 2)], [slice(0, 1)]]
    assert reductions(batch).stack(4) is stacks[1] and stacks[1].heads == (0, 1)
    torch.testing.assert_close(stacks[1].parts[0][0][1], batch.layers[4].pattern, rtol=0, atol=0, equal_nan=True)


def test_a_stack_read_layer_by_layer_equals_its_copy_read_at_once(monkeypatch):
    batch = _random_batch()
    p = batch.layers[2].pattern
    variants = [p, p.flip(1), p.sqrt() / p.sqrt().sum(-1, keepdim=True)]  # other heads' order, other weights
    batch.layers = {layer: LayerCapture(layer=layer, heads=(0, 1), pattern=variants[layer]) for layer in range(3)}

    def everything(joined):
        monkeypatch.setattr("headlab.analysis.reductions.launch_bound", lambda device: joined)
        batch.release_shared()
        [rows] = reductions(batch).stacks
        assert len(rows.parts) == (1 if joined else 3)
        return [rows.masses, rows.entropy, rows.distance, rows.confidence, rows.key_sums,
                *[rows.diagonal(offset) for offset in (-1, 0, 1)]]

    real = batch.attention_mask.bool()[None, :, None, :]  # the real query rows (and keys, for key_sums)
    for apart, joined in zip(everything(False), everything(True)):
        assert apart.shape == joined.shape and apart.shape[0] == 3
        ok = real.expand(apart.shape[:4])
        torch.testing.assert_close(apart[ok], joined[ok], rtol=0, atol=1e-12)


class _Layer:
    """One layer of a stack's reductions, read as ``(batch, head, …)``."""

    def __init__(self, stack: StackReductions, index: int) -> None:
        self.stack, self.index = stack, index

    def __getattr__(self, name):
        value = getattr(self.stack, name)
        return (lambda *args: value(*args)[self.index]) if callable(value) else value[self.index]


def test_key_sums_without_nan_take_the_matmul():
    batch = _random_batch(nan_padding=False, dtype=torch.float32)
    p = batch.layers[0].pattern
    real = batch.attention_mask.bool()
    want = torch.where(real[:, None, :, None], p, 0.0).sum(-2)
    torch.testing.assert_close(reductions(batch).stack(0).key_sums[0], want, atol=1e-6, rtol=0)


def test_a_layer_without_patterns_is_named():
    batch = _random_batch()
    batch.layers[0].pattern = None
    with pytest.raises(ValueError, match="layer 0 was captured without patterns"):
        _ = reductions(batch).stacks
    with pytest.raises(ValueError, match=r"layer 5 was not captured; the batch holds the layers \[0, 2\]"):
        reductions(_random_batch()).stack(5)


def test_each_reduction_is_computed_once_for_every_accumulator(monkeypatch):
    counts = {"matmul": 0, "amax": 0}
    real_matmul, real_amax = torch.matmul, torch.Tensor.amax

    def matmul(*args, **kwargs):
        counts["matmul"] += 1
        return real_matmul(*args, **kwargs)

    def amax(self, *args, **kwargs):
        counts["amax"] += 1
        return real_amax(self, *args, **kwargs)

    batch = _random_batch()
    monkeypatch.setattr(torch, "matmul", matmul)
    monkeypatch.setattr(torch.Tensor, "amax", amax)
    SurfaceStats().update(batch)
    after_surface = dict(counts)
    TaxonomyStats().update(batch)
    SurfaceStats().update(batch)
    layer_state = reductions(batch).stack(0).__dict__
    assert {"masses", "_entropy_and_distance", "confidence"} <= layer_state.keys()
    # the taxonomy adds only what surface statistics did not need (the key sums and the segments' masses); a second
    # surface adds nothing
    assert counts["amax"] == after_surface["amax"]
    assert counts["matmul"] - after_surface["matmul"] <= 2 * len(batch.layers)


def test_sharing_leaves_every_result_as_it_is_alone():
    def run(accumulators, *, shared: bool):
        for seed in range(3):
            batch = _random_batch(seed=seed, dtype=torch.float32)
            for accumulator in accumulators:
                accumulator.update(batch if shared else _random_batch(seed=seed, dtype=torch.float32))
        return [a.result() for a in accumulators]

    def make():
        return [SurfaceStats(), TaxonomyStats(), HeadSimilarity()]

    got = run(make(), shared=True)
    alone = [run([a], shared=False)[0] for a in make()]
    for g, a in zip(got, alone):
        assert g.to_dict() == a.to_dict()


@pytest.mark.parametrize("groups", [[(slice(0, 3), 9)], [(slice(0, 1), 9), (slice(1, 3), 8)],
                                    [(slice(0, 1), 9), (slice(1, 2), 8), (slice(2, 3), 5)]],
                         ids=["one group", "two groups", "every item its own"])
def test_column_masses_of_a_stack_equal_the_products(groups):
    batch = _random_batch()  # items of 9, 8 and 5 tokens; padded query rows NaN
    p = batch.layers[0].pattern
    stack = torch.stack([p, p.flip(1)])  # two layers, (layer, batch, head, query, key)
    columns = torch.rand(3, 5, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = column_masses(stack, columns, groups)
    want = torch.einsum("lbhqk,bck->lbhqc", torch.nan_to_num(stack), columns)
    assert got.shape == want.shape
    for items, pos in groups:
        rows = stack[:, items, :, :pos].isfinite().all(-1)  # the real rows of the group's items
        torch.testing.assert_close(got[:, items, :, :pos][rows], want[:, items, :, :pos][rows], rtol=0, atol=1e-12)
        assert (got[:, items, :, pos:] == 0).all()  # past the group's longest item: 0


def test_column_masses_of_cross_attention_read_the_whole_pattern():
    p = torch.rand(1, 2, 3, 4, 6, dtype=torch.float64)  # 4 queries, 6 keys
    columns = torch.rand(2, 3, 6, dtype=torch.float64)
    got = column_masses(p, columns, [(slice(0, 1), 6), (slice(1, 2), 2)])
    torch.testing.assert_close(got, torch.einsum("lbhqk,bck->lbhqc", p, columns), rtol=0, atol=1e-12)
