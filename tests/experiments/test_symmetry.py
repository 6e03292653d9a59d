"""Symmetry: identical heads stay identical to float rounding; random and noisy heads do not."""

from __future__ import annotations

import json

import pytest
import torch

from headlab.experiments.symmetry import head_parameters, plot_symmetry, run_symmetry, tie_heads
from headlab.layer import AttentionConfig, MultiHeadAttention


@pytest.fixture(scope="module")
def result():
    return run_symmetry(seed=0, steps=40)


def test_identical_heads_stay_identical(result):
    assert result.identical_max_head_difference < 1e-6  # in practice exactly 0 on the CPU
    assert result.identical_max_pattern_difference < 1e-6
    identical = result.run("identical")
    assert len(identical.head_difference) == len(identical.history.steps) > 2
    assert max(identical.mean_pattern_distance) < 1e-6


def test_random_heads_are_apart_and_noise_grows(result):
    assert result.random_min_pairwise_distance > 0.1
    assert min(result.run("random").mean_pattern_distance) > 1e-3
    assert 0 < result.noise_initial_difference < 0.05
    assert result.noise_growth > 3 and result.noise_final_difference > 3 * result.noise_initial_difference


def test_reproducible_from_the_seed_whatever_the_callers_threads(result):
    before = torch.get_num_threads()  # the fixture ran with this many; the run itself uses one either way
    torch.set_num_threads(1 if before > 1 else 2)
    try:
        again = run_symmetry(seed=0, steps=40)
    finally:
        torch.set_num_threads(before)
    assert json.dumps(again.to_dict()) == json.dumps(result.to_dict())
    assert plot_symmetry(again) == plot_symmetry(result)


def test_table_sentences_and_plot(result):
    headers, rows = result.table()
    assert headers == ["claim", "value"] and len(rows) == 5
    text = " ".join(result.sentences())
    assert f"after {result.steps} steps" in text and "exactly equal" in text
    assert plot_symmetry(result).startswith(b"\x89PNG")
    assert result.to_dict()["experiment"] == "symmetry"


def test_tie_heads_copies_head_zero_and_adds_noise():
    layer = MultiHeadAttention(AttentionConfig(d_model=16, n_heads=4))
    tie_heads(layer)
    theta = head_parameters(layer)
    assert theta.shape == (4, 4 * 16 * 4 + 3 * 4) and (theta == theta[0]).all()
    tie_heads(layer, noise=1e-3, generator=torch.Generator().manual_seed(0))
    spread = (head_parameters(layer) - head_parameters(layer)[0]).abs().max()
    assert 0 < spread < 1e-2
    with pytest.raises(ValueError, match="wide layer"):
        tie_heads(MultiHeadAttention(AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2)))
    with pytest.raises(ValueError, match="noise=-1"):
        tie_heads(layer, noise=-1)
