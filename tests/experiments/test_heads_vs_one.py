"""Heads vs one head: different at moderate scale, equal at saturation on the shared check's uniform draw; the
number of heads changes the output only for heads that differ."""

from __future__ import annotations

import json

import pytest
import torch

from headlab.experiments.heads_vs_one import COINCIDE, plot_heads_vs_one, run_heads_vs_one, views


@pytest.fixture(scope="module")
def result():
    return run_heads_vs_one(seed=0, steps=9)  # α = 1e-8 … 1e4 in 1.5-decade steps, plus 1


def test_views_differ_at_moderate_scale_in_output_and_gradient(result):
    std = result.as_drawn["standard"]
    assert 0.1 < std.max_weight_multi < 0.9  # not saturated as drawn
    assert std.output_difference > 0.05 and std.gradient_difference > 0.05
    assert result.max_output_difference["uniform"] > 1e-3
    assert result.gradient_difference_at_max["uniform"] > 1e-3
    peak = result.max_difference_alpha["uniform"]
    point = next(p for p in result.sweeps["uniform"] if p.alpha == peak)
    assert point.max_weight_multi < 0.99  # the uniform draw differs where it is not saturated


def test_the_shared_torch_equal_check_passes_because_the_uniform_draw_saturates(result):
    uni = result.as_drawn["uniform"]
    assert uni.max_weight_multi > 0.999 and uni.max_weight_single > 0.999 and uni.same_key_share == 1.0
    assert uni.output_difference < COINCIDE
    assert result.float32_check_equal
    start = result.coincide_from_alpha["uniform"]
    assert start is not None and start <= 1.0
    assert all(p.output_difference < COINCIDE for p in result.sweeps["uniform"] if p.alpha >= start)
    # Headlab's initialisation saturates too at the top of the sweep, yet the views never coincide.
    assert result.coincide_from_alpha["standard"] is None
    top = result.sweeps["standard"][-1]
    assert top.max_weight_multi > 0.9 and top.output_difference > 0.1


def test_the_number_of_heads_changes_the_output_only_for_unequal_heads(result):
    t = result.by_heads
    assert list(t["random"]) == [2, 4, 8, 16]
    assert min(t["random"].values()) > 0.05
    assert max(t["constant"].values()) < 1e-12
    assert min(t["constant_small"].values()) > 1e-5
    assert max(t["constant_small_linear_scale"].values()) < 1e-12


def test_views_hold_the_same_weights():
    weights = torch.randn(3 * 32, 32, dtype=torch.float64)
    multi, single = views(weights, (4, 1))
    assert torch.equal(multi.W_Q.transpose(0, 1).reshape(32, 32), single.W_Q[0])
    assert torch.equal(multi.projection.in_proj_weight, single.projection.in_proj_weight)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    small = weights.clone()
    small[:32] *= 1e-9  # logits ≈ 0: both views average the values uniformly
    multi, single = views(small, (4, 1))
    assert torch.allclose(multi(x), single(x), atol=1e-8)


def test_reproducible_table_sentences_plot(result):
    again = run_heads_vs_one(seed=0, steps=9)
    assert json.dumps(again.to_dict(), allow_nan=False) == json.dumps(result.to_dict(), allow_nan=False)
    assert result.points == 10 and len(result.sweeps["uniform"]) == 10
    _headers, rows = result.table()
    assert any("float32" in row[0] and row[1] == "True" for row in rows)
    text = " ".join(result.sentences())
    assert "torch.equal in float32 returns True" in text and "the views coincide (difference < 1e-06) from" in text
    assert plot_heads_vs_one(result).startswith(b"\x89PNG")


def test_the_questions_are_in_words_not_references_a_reader_cannot_follow(result):
    shown = " ".join([*result.sentences(), *(" ".join(row) for row in result.table()[1]), *result.to_dict()])
    assert "thread" not in shown.lower()
    assert "Does the number of heads change the output?" in shown


def test_too_few_scales():
    with pytest.raises(ValueError, match="at least 3 logit scales"):
        run_heads_vs_one(steps=2)
