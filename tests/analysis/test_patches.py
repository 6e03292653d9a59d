"""``PatchStats`` (``headlab.analysis.patches``): an image model's heads on hand-made patterns over a known grid, where
every statistic can be worked out by hand; merging halves gives the whole; the roles follow their thresholds; and
``analyze`` of a tiny ViT on images runs them with the text-only parts skipped, each with its reason.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headlab.analysis.patches import LOCAL, PatchStats, image_statistics, patch_roles, patch_sentences
from headlab.capture import LayerCapture
from headlab.capture.images import image_batch
from headlab.heads import HeadTable
from headlab.models.images import PatchGrid

GRID = PatchGrid(rows=2, columns=3, special=("[CLS]", "reg 0"), patch_size=(4, 4))  # positions: [CLS], reg 0, 6 patches


def _batch(pattern: torch.Tensor, first: int = 0):
    """An image batch of ``pattern`` ``(batch, head, 8, 8)`` as layer 0, heads 0…"""
    batch = image_batch(GRID, [f"image {i}" for i in range(first + len(pattern))], range(first, first + len(pattern)))
    batch.layers = {0: LayerCapture(layer=0, heads=tuple(range(pattern.shape[1])), pattern=pattern)}
    return batch


def _patterns() -> torch.Tensor:
    """Two heads on one image: head 0 puts half on [CLS] and half on the patch to its right (or left, in the last
    column); head 1 spreads evenly over every position."""
    n = GRID.n_positions
    p = torch.zeros(1, 2, n, n, dtype=torch.float64)
    for r in range(GRID.rows):
        for c in range(GRID.columns):
            q = GRID.position(r, c)
            p[0, 0, q, 0] = 0.5
            p[0, 0, q, GRID.position(r, c + 1 if c + 1 < GRID.columns else c - 1)] = 0.5
    p[0, 0, :2, 0] = 1.0  # the special tokens' own rows: left out of every statistic
    p[0, 1] = 1 / n
    return p


def test_every_statistic_as_worked_out_by_hand():
    stats = PatchStats(grid=GRID)
    stats.update(_batch(_patterns()))
    table = stats.result()
    n, uniform = GRID.n_positions, 1 / GRID.n_positions
    assert table.value("n_queries", 0, 0) == GRID.n_patches
    # head 0: its patches are one step away; half its attention on [CLS], none on the register
    assert table.value("patch_distance", 0, 0) == pytest.approx(1.0)
    assert table.value("to_cls", 0, 0) == pytest.approx(0.5) and table.value("to_special", 0, 0) == pytest.approx(0.5)
    assert table.value("entropy", 0, 0) == pytest.approx(math.log(2))
    assert table.value("to_self", 0, 0) == 0 and table.value("confidence", 0, 0) == pytest.approx(0.5)
    # head 1: uniform, so its distance among the patches is the grid's mean distance
    assert table.value("patch_distance", 0, 1) == pytest.approx(float(GRID.distances().mean()))
    assert table.value("to_special", 0, 1) == pytest.approx(2 * uniform)
    assert table.value("entropy", 0, 1) == pytest.approx(math.log(n)) == table.value("uniform_entropy", 0, 1)
    # a step on a 2 × 3 grid is more than half of even attention's distance (1.2 patches): not local
    assert patch_roles(table, GRID) == {(0, 0): (), (0, 1): ("broad",)}
    assert image_statistics(table) == ("entropy", "patch_distance", "to_cls", "to_special", "to_self", "confidence")


def test_merged_halves_give_the_whole():
    p = torch.cat([_patterns(), _patterns().flip(1)])  # the second image: heads swapped
    whole, first, second = PatchStats(grid=GRID), PatchStats(grid=GRID), PatchStats(grid=GRID)
    whole.update(_batch(p))
    first.update(_batch(p[:1]))
    second.update(_batch(p[1:], first=1))
    merged = first.merge(second).result()
    for name in whole.result().columns:
        np.testing.assert_allclose(merged[name], whole.result()[name], rtol=1e-12)
    with pytest.raises(ValueError, match="cannot merge"):
        PatchStats(grid=GRID).merge(PatchStats(grid=PatchGrid(rows=1, columns=1, special=(), patch_size=(4, 4))))


def test_patterns_over_other_positions_are_refused():
    with pytest.raises(ValueError, match=r"over \(5, 5\) positions; the grid has 8"):
        PatchStats(grid=GRID).update(_batch(torch.full((1, 1, 5, 5), 0.2)))


def test_sentences_cite_the_table():
    heads = [(0, 0), (0, 1)]
    table = HeadTable(heads, {"entropy": np.array([0.5, 2.0]), "uniform_entropy": np.array([2.0, 2.0]),
                              "patch_distance": np.array([0.8, 3.0]), "to_cls": np.array([0.6, 0.1]),
                              "to_special": np.array([0.7, 0.1])})
    big = PatchGrid(rows=4, columns=4, special=("[CLS]",), patch_size=(4, 4))
    near = LOCAL * float(big.distances().mean())
    roles = patch_roles(table, big)
    assert roles == {(0, 0): ("sink", "local"), (0, 1): ("broad",)} and 0.8 <= near < 3.0
    said = " ".join(patch_sentences(table, roles, big, {}))
    assert f"1 are local (mean distance attended ≤ {near:.2f} patches" in said
    assert "1 broad and 1 special-token sinks" in said
    assert "Head L0 H0 looks nearest (0.80 patches" in said and "head L0 H1 farthest (3.00)" in said
    assert f"would give {float(big.distances().mean()):.2f}" in said and "70% of head L0 H0's" in said
