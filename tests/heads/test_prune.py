"""Physical pruning: the same outputs as masking, fewer weights, grouped-query aware."""

from __future__ import annotations

import copy

import pytest
import torch

import headlab
from headlab import heads
from headlab.models import headed
from tests.support.tiny import batch, built, first_output


def _model(kind):
    return headlab.attach(built(kind, attn_implementation="sdpa")).model


def _run(model, padding="right"):
    ids, mask = batch(padding=padding)
    with torch.no_grad():
        return first_output(model(input_ids=ids, attention_mask=mask))[mask.bool()]


def _n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("kind, selection", [
    ("bert", [(0, 1), (1, 0), (1, 3)]),
    ("llama", [(0, 0), (1, 2), (1, 3)]),  # layer 0: kv head 0 keeps head 1; layer 1: kv head 1 goes
])
def test_pruning_equals_masking(kind, selection):
    model = _model(kind)
    masked = copy.deepcopy(model)
    heads.mask(masked, selection)
    before = _n_params(model)
    kept = heads.prune(model, selection)
    torch.testing.assert_close(_run(model), _run(masked), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(_run(model, "left"), _run(masked, "left"), atol=1e-5, rtol=1e-5)
    sites = headed(model).sites
    assert kept == {0: [h for h in range(4) if (0, h) not in selection],
                    1: [h for h in range(4) if (1, h) not in selection]}
    assert [site.head_ids for site in sites] == [kept[0], kept[1]]
    assert all(site.n_heads == 4 - len([1 for (li, _) in selection if li == i]) for i, site in enumerate(sites))
    if kind == "bert":  # a head owns 4·d_head·d_model weights (W_Q, W_K, W_V, W_O) and 3·d_head biases
        assert before - _n_params(model) == len(selection) * (4 * 8 * 32 + 3 * 8)


def test_grouped_query_key_value_heads_go_only_with_all_their_query_heads():
    model = _model("llama")  # 4 query heads, 2 key/value heads: groups {0, 1} and {2, 3}
    heads.prune(model, [(0, 0), (1, 2), (1, 3)])
    layer0, layer1 = headed(model).sites
    assert (layer0.n_heads, layer0.n_kv_heads, layer0.kv_head_of) == (3, 2, (0, 1, 1))
    assert (layer1.n_heads, layer1.n_kv_heads, layer1.kv_head_of) == (2, 1, (0, 0))
    attention = layer1.module
    assert (attention.k_proj.out_features, attention.num_key_value_groups) == (8, 2)  # one key head of size 8
    assert layer0.module.num_key_value_groups == 1  # uneven groups: headlab's attention gives each head its key


def test_pruning_keeps_interventions_and_renumbers_heads():
    model = _model("bert")
    heads.scale(model, [(0, 3)], 2.0)
    masked = copy.deepcopy(model)
    heads.mask(masked, [(0, 0)])
    heads.prune(model, [(0, 0)])
    torch.testing.assert_close(_run(model), _run(masked), atol=1e-5, rtol=1e-5)
    assert heads.summary(model) == [{"layer": 0, "head": 2, "scale": 2.0, "shifted": False, "kind": "scaled"}]
    heads.prune(model, [(0, 2)])  # current numbering: original head 3
    assert headed(model).sites[0].head_ids == [1, 2]


def test_pruning_refuses_to_empty_a_layer_and_changes_nothing():
    model = _model("bert")
    before = _run(model)
    with pytest.raises(ValueError, match="every head of layer 1"):
        heads.prune(model, [(0, 0)] + [(1, h) for h in range(4)])
    assert headed(model).sites[0].n_heads == 4
    torch.testing.assert_close(_run(model), before)


def test_pruning_makes_the_layers_smaller():
    model = _model("bert")
    heads.prune(model, {0: [0, 1], 1: [2]})
    sites = headed(model).sites
    shapes = [[tuple(m.weight.shape) for m in (s.module.query, s.module.key, s.module.value)] for s in sites]
    assert shapes == [[(2 * 8, 32)] * 3, [(3 * 8, 32)] * 3]
    assert [tuple(s.out_proj.module.weight.shape) for s in sites] == [(32, 16), (32, 24)]
    assert [s.module.all_head_size for s in sites] == [16, 24]
