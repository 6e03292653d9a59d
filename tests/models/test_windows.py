"""Windowed attention (Swin) on the patch grid: each layer's windows read from the model (stage grid, window side,
shift, padding); the image capture hands every layer's pattern scattered on its stage's grid, equal to a float64
reference built here from the eager model's ``output_attentions`` by unrolling the windows and the shift by hand; rows
sum to 1 over the window (less the weight on padding) and are 0 outside it; the analyses read it per layer.
"""

from __future__ import annotations

import math

import pytest
import torch

import headlab
from headlab.capture.images import capture_images, image_grid, on_first_grid
from headlab.models.images import PatchGrid
from headlab.models.windows import Windows
from tests.support.vision import vision_model

transformers = pytest.importorskip("transformers")
SIZES = [16, 20, 24]  # pixels a side: grids 4×4 → 2×2 (no padding), 5×5 → 3×3 (padded, shifted), 6×6 → 3×3


def _reference_windows(config, side_pixels: int) -> list[tuple[int, int, int]]:
    """Per block, in call order, ``(grid side, window side, shift)`` as the Swin paper states them: the first stage's
    grid is the input over the patch (rounded up), each later stage's half the one before (rounded up); every second
    block shifts by half a window; a grid no larger than the window is one unshifted window (for a model built for
    ``side_pixels``: transformers' Swin keeps that shrunk window for every later input, which headlab reads off)."""
    grid, out = -(-side_pixels // config.patch_size), []
    for stage, depth in enumerate(config.depths):
        if stage:
            grid = -(-grid // 2)
        for block in range(depth):
            window, shift = config.window_size, config.window_size // 2 if block % 2 else 0
            if grid <= window:
                window, shift = grid, 0
            out.append((grid, window, shift))
    return out


def _scatter_by_hand(windowed: torch.Tensor, grid: int, window: int, shift: int) -> torch.Tensor:
    """``(batch · windows, head, w², w²)`` → ``(batch, head, grid², grid²)`` float64, one window position at a time:
    pad the grid of patch numbers with -1, roll it, cut it into windows, and copy each (query, key) pair whose both
    ends are patches."""
    padded = -(-grid // window) * window
    numbers = torch.full((padded, padded), -1)
    numbers[:grid, :grid] = torch.arange(grid * grid).reshape(grid, grid)
    rolled = torch.roll(numbers, shifts=(-shift, -shift), dims=(0, 1))
    places = [[int(rolled[wr * window + a, wc * window + b]) for a in range(window) for b in range(window)]
              for wr in range(padded // window) for wc in range(padded // window)]
    n_windows = len(places)
    batch, heads = windowed.shape[0] // n_windows, windowed.shape[1]
    out = torch.zeros(batch, heads, grid * grid, grid * grid, dtype=torch.float64)
    for b in range(batch):
        for w, numbers_of_window in enumerate(places):
            for i, query in enumerate(numbers_of_window):
                for j, key in enumerate(numbers_of_window):
                    if query >= 0 and key >= 0:
                        out[b, :, query, key] = windowed[b * n_windows + w, :, i, j].double()
    return out


class _Patterns:
    def __init__(self) -> None:
        self.patterns: dict[int, list[torch.Tensor]] = {}

    def update(self, batch) -> None:
        for layer, taken in batch.layers.items():
            self.patterns.setdefault(layer, []).append(taken.pattern.clone())


def _captured(handle, pixels: torch.Tensor) -> tuple[dict[int, torch.Tensor], PatchGrid]:
    kept = _Patterns()
    _, grid = capture_images(handle, pixels, consumers=[kept], batch_size=2, progress=False)
    return {layer: torch.cat(parts) for layer, parts in kept.patterns.items()}, grid


@pytest.mark.parametrize("side", SIZES)
def test_the_windows_and_grids_are_read_from_the_model(side):
    model = vision_model("swin", size=side)
    handle = headlab.attach(model)
    grid = image_grid(handle, torch.randn(1, 3, side, side))
    expected = _reference_windows(model.config, side)
    assert len(grid.layers) == len(handle.sites) == len(expected) == 4
    assert (grid.rows, grid.columns, grid.special, grid.patch_size) == (expected[0][0], expected[0][0], (), (4, 4))
    for own, (n, window, shift) in zip(grid.layers, expected):
        assert own.windows == Windows(rows=n, columns=n, side=window, shift=shift)
        assert (own.rows, own.columns) == (n, n) and own.labels()[-1] == f"patch r{n - 1}c{n - 1}"
    assert grid.layers[2].stride == (2, 2) and grid.layers[2].patch_size == (8, 8)
    assert grid.to_dict()["layers"][1]["window"] == {"side": 2, "shift": 1}


@pytest.mark.parametrize("side", SIZES)
def test_scattered_patterns_equal_eager_attentions_unrolled_by_hand(side):
    """float64: the captured pattern of every layer is eager's windowed attention laid on the grid by hand."""
    pixels = torch.randn(3, 3, side, side, generator=torch.Generator().manual_seed(side), dtype=torch.float64)
    eager = vision_model("swin", size=side).to(torch.float64)
    eager.config._attn_implementation = "eager"
    with torch.no_grad():
        attentions = eager(pixel_values=pixels, output_attentions=True).attentions
    # transformers hands one attention per stage (its last block's): the stages' last blocks are layers 1 and 3
    handle = headlab.attach(vision_model("swin", size=side).to(torch.float64))
    patterns, grid = _captured(handle, pixels)
    blocks = _reference_windows(eager.config, side)
    for layer, windowed in zip((1, 3), attentions, strict=True):
        want = _scatter_by_hand(windowed, *blocks[layer])
        torch.testing.assert_close(patterns[layer], want, rtol=0, atol=3e-7)  # eager takes its softmax in float32
    for layer, pattern in patterns.items():
        n, window, shift = blocks[layer]
        assert pattern.shape == (3, handle.sites[layer].n_heads, n * n, n * n)
        # 0 outside each query's window: the window is the set of keys a hand-made all-ones window gives
        ones = torch.ones(grid.of(layer).windows.n_windows, 1, window * window, window * window)
        support = _scatter_by_hand(ones, n, window, shift)[0, 0] > 0
        assert not pattern[..., ~support].any()
        rows = pattern.sum(-1)
        if (-n) % window == 0:  # no padding: every row sums to 1 over its window
            torch.testing.assert_close(rows, torch.ones_like(rows), rtol=0, atol=1e-12)
        else:  # the weight on padded keys is no patch's: a row sums to at most 1 (1 where the shift's mask hid them)
            assert (rows <= 1 + 1e-12).all() and (rows > 0).all() and (shift or (rows < 1 - 1e-6).any())


def test_every_take_is_laid_on_the_grid_and_z_is_pattern_times_v():
    """On 24 × 24 pixels: the first stage (6×6) needs no padding, the second (3×3) does."""
    pixels = torch.randn(2, 3, 24, 24, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    handle = headlab.attach(vision_model("swin", size=24).to(torch.float64))
    seen = {}

    class Keep:
        def update(self, batch) -> None:
            seen.update(batch.layers)

    _, grid = capture_images(handle, pixels, take=("pattern", "z", "v"), consumers=[Keep()], progress=False)
    for layer, taken in seen.items():
        n = grid.of(layer).n_patches
        assert taken.z.shape[:3] == taken.v.shape[:3] == (2, handle.sites[layer].n_heads, n)
        if layer < 2:  # no padding: z is the pattern times the grid's v (with padding, the padded keys' v are dropped)
            torch.testing.assert_close(taken.pattern @ taken.v, taken.z, rtol=0, atol=1e-10)


def test_a_windowed_tensor_of_the_wrong_shape_is_refused_in_one_line():
    windows = Windows(rows=4, columns=4, side=2, shift=1)
    with pytest.raises(ValueError, match=r"shape \(3, 2, 4, 4\) does not hold images of 4 windows of 2×2") as caught:
        windows.scatter(torch.zeros(3, 2, 4, 4), square=True)
    assert "\n" not in str(caught.value)


def test_a_later_stage_laid_on_the_first_grid_keeps_its_rows_and_its_blocks():
    """``PatchGrid.onto``: a 3×3 stage over a 5×5 first grid (stride 2, the last row and column covering one patch)."""
    coarse = PatchGrid(rows=3, columns=3, special=(), patch_size=(8, 8), stride=(2, 2))
    grid = PatchGrid(rows=5, columns=5, special=(), patch_size=(4, 4), layers=(coarse,))
    pattern = torch.rand(1, 2, 9, 9, dtype=torch.float64)
    pattern /= pattern.sum(-1, keepdim=True)
    fine = grid.onto(pattern, 0)
    assert fine.shape == (1, 2, 25, 25)
    torch.testing.assert_close(fine.sum(-1), torch.ones(1, 2, 25, dtype=torch.float64))
    # fine patch r3c4 lies in coarse r1c2; the coarse key r2c0 covers fine r4c0 and r4c1, half its weight each
    assert fine[0, 1, 3 * 5 + 4, 4 * 5 + 1].item() == pytest.approx(pattern[0, 1, 1 * 3 + 2, 2 * 3 + 0].item() / 2)
    assert fine[0, 1, 3 * 5 + 4, 4 * 5 + 4].item() == pytest.approx(pattern[0, 1, 5, 8].item())  # covers one
    assert grid.of(0).distances()[0, 1].item() == 2.0 and coarse.distances()[0, 4].item() == pytest.approx(
        2 * math.sqrt(2))  # in first-stage patches


def test_patch_statistics_and_similarity_run_per_layer_on_swin():
    from headlab.analysis.images import analyze_images

    handle = headlab.attach(vision_model("swin", size=20))
    result = analyze_images(handle, torch.randn(3, 3, 20, 20), importance=False, progress=False)
    table, grid = result.surface, result.grid
    assert grid is not None and len(table) == 2 + 2 + 4 + 4 and "to_cls" not in table.columns
    assert "no [CLS]" in result.skipped["to_cls, to_special and the sink role"]
    for layer, head in table.heads:
        own = grid.of(layer)
        assert table.value("n_queries", layer, head) == 3 * own.n_patches
        assert table.value("uniform_entropy", layer, head) == pytest.approx(math.log(own.n_patches))
        assert table.value("entropy", layer, head) <= math.log(own.windows.side ** 2) + 1e-6  # within a window
    assert result.similarity.distances.shape == (12, 12)
    assert any("first-stage patches" in sentence for sentence in result.sentences())


def test_on_first_grid_is_the_consumer_itself_for_a_whole_image_grid():
    grid = PatchGrid(rows=2, columns=2, special=("[CLS]",), patch_size=(4, 4))
    consumer = _Patterns()
    assert on_first_grid(grid, consumer) is consumer


def test_labels_name_each_windowed_layers_stage_grid():
    handle = headlab.attach(vision_model("swin", size=16))
    pixels = {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))}
    [first, _] = handle.labels(pixels)
    assert first[:5] == ["patch r0c0", "patch r0c1", "patch r0c2", "patch r0c3", "patch r1c0"] and len(first) == 16
    stages = [handle.labels(pixels, layer=layer)[0] for layer in range(len(handle.sites))]
    assert [len(queries) for queries, _ in stages] == [16, 16, 4, 4]  # 4×4 patches, then 2×2 after the merging
    assert stages[2] == (["patch r0c0", "patch r0c1", "patch r1c0", "patch r1c1"],) * 2
