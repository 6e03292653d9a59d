"""HeadSums holds each batch's sums where they were made and folds them later: when, and how, must not
change a result."""

from __future__ import annotations

import pickle

import pytest
import torch

from headlab.analysis import SurfaceStats
from headlab.analysis.sinks import SinkShare
from tests.support.analysis import make_batch, sentence


def random_batches(n: int, seed: int = 0) -> list:
    """``n`` batches of 2–3 items of 5–9 pieces, two layers of 3 heads, random rows over the real keys."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        lengths = torch.randint(5, 10, (int(torch.randint(2, 4, (1,), generator=g)),), generator=g).tolist()
        pos = max(lengths)
        real = torch.zeros(len(lengths), pos, dtype=torch.bool)
        for row, length in enumerate(lengths):
            real[row, :length] = True
        layers = {}
        for layer in (0, 1):
            logits = torch.randn(len(lengths), 3, pos, pos, generator=g, dtype=torch.float64)
            layers[layer] = logits.masked_fill(~real[:, None, None, :], -torch.inf).softmax(-1)
        batches.append(make_batch([sentence(length) for length in lengths], layers))
    return batches


def fed(accumulator, batches):
    for batch in batches:
        accumulator.update(batch)
    return accumulator


@pytest.mark.parametrize("fold_every", [1, 2, 64])
def test_the_result_does_not_depend_on_when_the_held_batches_are_folded(monkeypatch, fold_every):
    batches = random_batches(5)
    reference = fed(SurfaceStats(), batches).result()  # folded once, on reading
    monkeypatch.setattr("headlab.analysis.per_head.FOLD_EVERY", fold_every)
    accumulator = fed(SurfaceStats(), batches[:3])
    assert bool(accumulator._held) == (fold_every > 3)  # held until FOLD_EVERY batches of a layer are
    _ = accumulator.sums  # reading folds
    assert not accumulator._held
    table = fed(accumulator, batches[3:]).result()
    assert table.heads == reference.heads
    for name in reference.columns:
        assert table[name] == pytest.approx(reference[name], rel=1e-12, abs=1e-15), name


def test_an_accumulator_holding_batches_pickles_and_merges_as_the_whole():
    batches = random_batches(6, seed=1)
    whole = fed(SinkShare(n_sink=1), batches).result().table
    first, second = fed(SinkShare(n_sink=1), batches[:4]), fed(SinkShare(n_sink=1), batches[4:])
    assert first._held and second._held
    shipped = pickle.loads(pickle.dumps(second))  # as a Ray worker sends it back
    assert not shipped._held and not second._held  # folded before pickling, nothing left on a device
    merged = first.merge(shipped).result().table
    for name in whole.columns:
        assert merged[name] == pytest.approx(whole[name], rel=1e-12, abs=1e-15, nan_ok=True), name
