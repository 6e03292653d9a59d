"""Composition scores: one pair equals the definition done by hand in float64 (TransformerLens' orientation), a
planted K-composition is found far above the random baseline, grouped-query and headlab's own layers work, the
result shows itself and bad arguments are refused by value."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import headlab
from headlab.circuits.composition import CompositionScores, composition_scores, plot_composition
from headlab.experiments.model import TinyTransformer
from headlab.layer import AttentionConfig
from tests.support.tiny import ARCHITECTURES, built

A, B = (0, 1), (1, 2)  # the planted sender and receiver


def _by_hand(site_s, h_s, site_r, h_r, kind):
    """The score from the full d_model × d_model matrices, float64 (rows are vectors: x ↦ x W_OV)."""
    def ov(site, h):
        return site.W_V[site.kv_head_of[h]].detach().double() @ site.W_O[h].detach().double()

    def qk(site, h):
        return site.W_Q[h].detach().double() @ site.W_K[site.kv_head_of[h]].detach().double().T

    receiver = {"q": qk(site_r, h_r), "k": qk(site_r, h_r).T, "v": ov(site_r, h_r)}[kind]
    sender = ov(site_s, h_s)
    return float(torch.linalg.norm(sender @ receiver) / (torch.linalg.norm(sender) * torch.linalg.norm(receiver)))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_every_pair_equals_the_definition_by_hand(name):
    handle = headlab.attach(built(name))
    result = composition_scores(handle, samples=4)
    sites = handle.sites
    for kind in ("q", "k", "v"):
        for h_s, h_r in ((0, 0), (1, 3), (3, 2)):
            expected = _by_hand(sites[0], h_s, sites[1], h_r, kind)
            assert result.scores[kind][0, h_s, 1, h_r] == pytest.approx(expected, rel=1e-5), (kind, h_s, h_r)
    # only later receivers: the same layer and earlier ones are NaN
    assert np.isnan(result.scores["k"][1, :, 0]).all() and np.isnan(result.scores["k"][0, :, 0]).all()
    assert np.isfinite(result.scores["k"][0, :, 1]).all()


def _planted() -> TinyTransformer:
    """Head A (layer 0) writes only into features 0–3; head B (layer 1) reads its keys only from them. Every other
    layer-0 head writes elsewhere and every other layer-1 key reads elsewhere. (d_model 64 for heads of 4: two
    random rank-4 maps of a 16-wide stream overlap by chance half as much as a planted pair can.)"""
    torch.manual_seed(0)
    configs = [AttentionConfig(d_model=64, n_heads=4, d_head=4, bias=False)] * 2
    model = TinyTransformer(vocab_sizes=[11], n_classes=3, max_len=8, layers=configs).eval()
    first, second = (m for m in model.attention)
    with torch.no_grad():
        for h in range(4):
            first.W_O[h].copy_(torch.randn(4, 64))
            second.W_K[h].copy_(torch.randn(64, 4))
            if h == A[1]:
                first.W_O[h, :, 4:] = 0
            else:
                first.W_O[h, :, :4] = 0
            if h == B[1]:
                second.W_K[h, 4:] = 0
            else:
                second.W_K[h, :4] = 0
    return model


def test_a_planted_k_composition_is_found_far_above_chance():
    result = composition_scores(headlab.attach(_planted()), kinds="k", samples=16)
    (edge,) = result.top("k", 1, receiver=B)
    assert edge.sender == A and edge.receiver == B
    assert edge.z > 10 and edge.ratio > 3  # measured: z 17.5, 4.4 × chance
    others = [e for e in result.edges("k") if e.receiver == B and e.sender != A]
    assert len(others) == 3 and max(e.score for e in others) < 1e-6  # orthogonal subspaces: no composition
    assert result.top("k", 1)[0].sender == A  # the strongest edge of the whole model


def test_grouped_query_heads_read_their_key_value_head():
    handle = headlab.attach(built("mistral"))  # one key/value head for four query heads
    result = composition_scores(handle, kinds=("K", "v"), samples=4)
    assert result.kinds == ("k", "v")
    sender, receiver = handle.sites
    assert receiver.n_kv_heads == 1 and receiver.kv_head_of == (0, 0, 0, 0)
    for kind in ("k", "v"):
        for h in range(4):
            expected = _by_hand(sender, 2, receiver, h, kind)
            assert result.scores[kind][0, 2, 1, h] == pytest.approx(expected, rel=1e-5)


def test_the_baseline_is_seeded_and_reads_as_chance():
    handle = headlab.attach(built("gpt2"))
    one, same, other = (composition_scores(handle, kinds="q", samples=8, seed=s) for s in (0, 0, 1))
    assert one.baseline_mean["q"][0, 1] == same.baseline_mean["q"][0, 1] != other.baseline_mean["q"][0, 1]
    mean, std = one.baseline_mean["q"][0, 1], one.baseline_std["q"][0, 1]
    assert 0 < std < mean < 1 and np.isnan(one.baseline_mean["q"][1, 0])
    # random weights compose at chance: their z-scores are small
    assert np.nanmax(np.abs(one.zscores("q"))) < 5


def test_the_result_shows_itself_and_writes_json_and_a_plot(tmp_path):
    result = composition_scores(headlab.attach(_planted()), samples=4)
    assert isinstance(result, CompositionScores)
    text = repr(result)
    assert text.startswith("CompositionScores: Q, K, V between 8 heads in 2 layers")
    assert "K-composition: top L0 H1 → L1 H2" in text
    assert "<table" in result._repr_html_()
    data = json.loads(json.dumps(result.to_dict()))
    assert len(data["edges"]) == 3 * 16 and set(data["baseline"]) == {"q", "k", "v"}
    path = plot_composition(result, tmp_path / "composition.png")
    assert path.read_bytes().startswith(b"\x89PNG")


def test_bad_arguments_are_refused_by_value():
    handle = headlab.attach(built("gpt2"))
    with pytest.raises(ValueError, match=r"kinds=\('q', 'x'\)"):
        composition_scores(handle, kinds=("q", "x"))
    with pytest.raises(ValueError, match="samples=0"):
        composition_scores(handle, samples=0)
    result = composition_scores(handle, kinds="q", samples=2)
    with pytest.raises(ValueError, match=r"kind 'v' was not computed"):
        result.top("v")
    with pytest.raises(ValueError, match=r"receiver=\(2, 0\): the model has layers 0–1"):
        result.top("q", receiver=(2, 0))


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture_scores_within_bounds(name):
    handle = headlab.attach(built(name))
    result = composition_scores(handle, samples=2)
    for kind in ("q", "k", "v"):
        edges = result.scores[kind][0, :, 1]
        assert np.isfinite(edges[:, : handle.n_heads[1]]).all() and (edges <= 1).all() and (edges > 0).all()
