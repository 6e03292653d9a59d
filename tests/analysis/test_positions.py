"""The (head × position) result of patching at each position: its labels, peaks, JSON, short display and plot;
on a model with a tokenizer (token labels) and on headlab's own TinyTransformer (causal, grouped-query)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import headlab
from headlab.analysis.patching import activation_patching, attribution_patching, plot_patching
from headlab.analysis.positions import PositionGrid, plot_positions
from headlab.experiments.model import TinyTransformer
from headlab.layer import AttentionConfig
from headlab.models import headed
from tests.support.tiny import tiny

CLEAN, CORRUPTED = "the cat sat on the mat", "the dog sat on the mat"


def _grid() -> PositionGrid:
    effect = np.array([[0.0, 0.5, -0.1], [0.2, np.nan, -0.9]])
    return PositionGrid([(0, 1), (2, 0)], "z", effect, effect * 2, tokens=["a", "cat", "sat"],
                        corrupted_tokens=["a", "dog", "sat"])


def test_a_grid_names_its_cells():
    grid = _grid()
    assert grid.labels() == ["0 a", "1 cat→dog", "2 sat"] and grid.row_labels() == ["L0 H1", "L2 H0"]
    assert grid.top(2) == [(2, 0, 2), (0, 1, 1)] and grid.value("change", 2, 0, 2) == pytest.approx(-1.8)
    assert all(type(i) is int for cell in grid.top() for i in cell)  # printed as plain numbers
    peaks = grid.peaks()
    assert peaks.heads == [(0, 1), (2, 0)] and list(peaks["position"]) == [1, 2]
    assert list(peaks["effect"]) == [0.5, -0.9] and list(peaks["change"]) == [1.0, -1.8]
    document = grid.to_dict()
    assert json.loads(json.dumps(document)) == document  # JSON-ready: NaN as None
    assert document["effect"][1] == [0.2, None, -0.9] and document["rows"][1] == {"layer": 2, "head": 0}
    assert document["tokens"] == ["a", "cat", "sat"] and document["unit"] == "head" and document["positions"] == 3
    row = grid.effect[:1]
    assert PositionGrid([(0, 0)], "k", row, row).row_labels() == ["L0 KV0"]
    assert PositionGrid([(0, 0)], "v", row, row).labels() == ["0", "1", "2"]


def test_a_grid_shows_its_largest_rows_only():
    rows = [(0, h) for h in range(20)]
    effect = np.arange(60, dtype=float).reshape(20, 3) / 60
    html = PositionGrid(rows, "z", effect, effect).html(rows=4)
    assert "the 4 of 20 rows of largest |effect|" in html and "L0 H19" in html and "L0 H15" not in html


@pytest.fixture(scope="module")
def texts():
    """A tiny causal model with a word-piece tokenizer, patched at each position from two texts."""
    model = tiny("gpt2")
    metric = headlab.analysis.logit_difference(5, 7)
    exact = activation_patching(model, CLEAN, CORRUPTED, metric, positions="each", heads={1: None})
    atp = attribution_patching(model, CLEAN, CORRUPTED, metric, positions="each", heads={1: None})
    return exact, atp


def test_a_text_grid_carries_the_tokens(texts):
    exact, atp = texts
    tokens = ["[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]"]
    assert exact.grid.tokens == tokens and exact.grid.corrupted_tokens[2] == "dog"
    assert exact.grid.labels()[2] == "2 cat→dog" and exact.grid.effect.shape == (4, len(tokens))
    assert atp.grid.heads == exact.grid.heads and atp.grid.labels() == exact.grid.labels()
    document = exact.to_dict()
    assert document["positions"] == "each" and document["grid"]["tokens"] == tokens
    assert document["heads"]["columns"] == ["effect", "change", "position"]
    html = exact._repr_html_()
    assert "2 cat→dog" in html and "effect by position (every row)" in html
    assert "at each of 8 positions" in repr(exact) and "@ " in repr(exact) and "z at each position" in repr(exact)


def test_plot_draws_a_head_by_position_heatmap(texts, tmp_path):
    path = plot_patching(list(texts), tmp_path / "positions.png", title="cat → dog")
    assert path.read_bytes()[:4] == b"\x89PNG"
    whole = activation_patching(tiny("gpt2"), CLEAN, CORRUPTED, headlab.analysis.logit_difference(5, 7),
                                heads={1: [0]})
    with pytest.raises(ValueError, match="apart from whole-sequence ones"):
        plot_patching([texts[0], whole], tmp_path / "mixed.png")
    with pytest.raises(ValueError, match="at least one grid"):
        plot_positions([], tmp_path / "none.png")


# --- headlab's own model ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def own():
    """The experiments' TinyTransformer (causal), one grouped-query layer and one rotary layer, attached."""
    torch.manual_seed(0)
    configs = [AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2), AttentionConfig(d_model=16, n_heads=2,
                                                                                     rotary=True)]
    model = TinyTransformer(vocab_sizes=[11], n_classes=5, max_len=12, layers=configs).double().eval()
    headlab.attach(model)
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 11, (2, 6, 1), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 1] = (clean[:, 1] + 1) % 11

    def metric(output):  # class 0 against class 1 at position 3
        return (output.logits[:, 3, 0] - output.logits[:, 3, 1]).mean()

    return model, clean, corrupted, metric


@pytest.mark.parametrize("take", ["z", "q", "k", "v", "pattern"])
def test_headlabs_own_model_patches_at_each_position(own, take):
    model, clean, corrupted, metric = own
    result = activation_patching(model, clean, corrupted, metric, positions="each", take=take)
    rows = [(0, 0), (0, 1), (1, 0), (1, 1)] if take in ("k", "v") else [(0, h) for h in range(4)] + [(1, 0), (1, 1)]
    assert result.grid.heads == rows and result.grid.tokens is None
    assert (result.grid.change[:, 4:] == 0).all() and (result.grid.change[:, :4] != 0).any()  # causal: read at 3
    whole = activation_patching(model, clean, corrupted, metric, take=take)
    together = activation_patching(model, clean, corrupted, metric, take=take, positions=range(6))
    np.testing.assert_array_equal(together.table["change"], whole.table["change"])
    if take != "pattern":
        atp = attribution_patching(model, clean, corrupted, metric, positions="each", take=take, direction="noise")
        atp_whole = attribution_patching(model, clean, corrupted, metric, take=take, direction="noise")
        np.testing.assert_allclose(atp.grid.change.sum(axis=1), atp_whole.table["change"], rtol=1e-12, atol=1e-15)
    assert all(site.idle for site in headed(model).sites)


def test_a_pattern_patch_on_headlabs_own_layer_is_the_source_pattern_times_this_runs_values(own):
    """Layer 1, head 0 at position 2: z there = the clean pattern row @ the corrupted run's v, by the layer's math."""
    model, clean, corrupted, metric = own
    result = activation_patching(model, clean, corrupted, metric, positions=[2], take="pattern", heads={1: [0]})
    layer = model.attention[1]
    keep = {}
    hook = layer.register_forward_hook(lambda m, args, out: keep.__setitem__("x", args[0]))
    with torch.no_grad():
        model(clean)
        pattern = layer(keep["x"], return_pattern=True).pattern[:, 0]  # (batch, query_pos, key_pos), clean
        base = model(corrupted)
        x = keep["x"]
    hook.remove()
    _, _, v = layer.projection(x, x, x)  # (batch, kv_head, key_pos, d_head_v): the corrupted run's
    z = layer(x, return_z=True).z.clone()
    z[:, 0, 2] = (pattern[:, 2:3] @ v[:, layer.config.kv_head_of[0]])[:, 0]
    out = layer.projection.merge(z)
    patch = layer.register_forward_hook(lambda m, args, output: out)
    try:
        with torch.no_grad():
            expected = float(metric(model(corrupted)) - metric(base))
    finally:
        patch.remove()
    assert result.table.value("change", 1, 0) == pytest.approx(expected, rel=1e-10, abs=1e-14)
