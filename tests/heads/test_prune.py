"""Physical pruning: the same outputs as masking, fewer weights, grouped-query aware."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from headlab import heads
from headlab.interop import swap
from headlab.models import attention_layers, attention_modules
from tests.interop.hf_models import batch, build, config, first_output


def _model(kind, **overrides):
    model_class = transformers.BertModel if kind == "bert" else transformers.LlamaForCausalLM
    return swap(build(model_class, config(kind, **overrides), attn_implementation="sdpa"))


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
    layers = attention_layers(model)
    assert kept == {0: [h for h in range(4) if (0, h) not in selection],
                    1: [h for h in range(4) if (1, h) not in selection]}
    assert [m.head_ids for m in attention_modules(model)] == [kept[0], kept[1]]
    assert all(layer.config.n_heads == 4 - len(
        [1 for (li, _) in selection if li == i]) for i, layer in enumerate(layers))
    if kind == "bert":  # a head owns 4·d_head·d_model weights (W_Q, W_K, W_V, W_O) and 3·d_head biases
        assert before - _n_params(model) == len(selection) * (4 * 8 * 32 + 3 * 8)


def test_grouped_query_key_value_heads_go_only_with_all_their_query_heads():
    model = _model("llama")  # 4 query heads, 2 key/value heads: groups {0, 1} and {2, 3}
    heads.prune(model, [(0, 0), (1, 2), (1, 3)])
    layer0, layer1 = attention_layers(model)
    assert (layer0.config.n_heads, layer0.config.n_kv_heads, layer0.config.kv_head_of) == (3, 2, (0, 1, 1))
    assert (layer1.config.n_heads, layer1.config.n_kv_heads, layer1.config.kv_head_of) == (2, 1, (0, 0))


def test_pruning_keeps_interventions_and_renumbers_heads():
    model = _model("bert")
    heads.scale(model, [(0, 3)], 2.0)
    masked = copy.deepcopy(model)
    heads.mask(masked, [(0, 0)])
    heads.prune(model, [(0, 0)])
    torch.testing.assert_close(_run(model), _run(masked), atol=1e-5, rtol=1e-5)
    assert heads.summary(model) == [{"layer": 0, "head": 2, "scale": 2.0, "shifted": False, "kind": "scaled"}]
    heads.prune(model, [(0, 2)])  # current numbering: original head 3
    assert attention_modules(model)[0].head_ids == [1, 2]


def test_pruning_refuses_to_empty_a_layer_and_changes_nothing():
    model = _model("bert")
    before = _run(model)
    with pytest.raises(ValueError, match="every head of layer 1"):
        heads.prune(model, [(0, 0)] + [(1, h) for h in range(4)])
    assert attention_layers(model)[0].config.n_heads == 4
    torch.testing.assert_close(_run(model), before)


def test_pruning_makes_the_layers_smaller():
    model = _model("bert")
    heads.prune(model, {0: [0, 1], 1: [2]})
    shapes = [tuple(layer.projection.in_proj_weight.shape) for layer in attention_layers(model)]
    assert shapes == [(3 * 2 * 8, 32), (3 * 3 * 8, 32)]
    assert [tuple(layer.projection.out_proj.weight.shape) for layer in attention_layers(model)] == [(32, 16), (32, 24)]
