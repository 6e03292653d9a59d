"""Interventions on heads of attached transformers models, checked against weight surgery."""

from __future__ import annotations

import copy

import pytest
import torch

import headlab
from headlab import heads
from headlab.models import headed
from tests.support.tiny import batch, built, first_output


@pytest.fixture(params=["bert", "llama"])
def model(request):
    return headlab.attach(built(request.param, attn_implementation="sdpa")).model


def _run(model):
    ids, mask = batch(padding="right")
    with torch.no_grad():
        return first_output(model(input_ids=ids, attention_mask=mask))[mask.bool()]


def _surgery(model, layer, head, *, factor=0.0, add=None):
    """A copy of ``model`` whose head's output columns of W_O are multiplied by factor, and b_O += add."""
    twin = copy.deepcopy(model)
    target = headed(twin).sites[layer]
    with torch.no_grad():
        target.W_O[head].mul_(factor)  # a view of the output projection's weight
        if add is not None:
            target.out_proj.module.bias.add_(add)
    return twin


def test_mask_equals_zeroing_the_heads_output_weights(model):
    expected = _run(_surgery(_surgery(model, 0, 1), 1, 3))
    heads.mask(model, [(0, 1), (1, 3)])
    torch.testing.assert_close(_run(model), expected, atol=1e-5, rtol=1e-5)
    assert {(r["layer"], r["head"], r["kind"]) for r in heads.summary(model)} == {(0, 1, "zero-ablated"),
                                                                                   (1, 3, "zero-ablated")}


def test_scale_equals_scaling_the_heads_output_weights(model):
    expected = _run(_surgery(model, 1, 2, factor=2.5))
    heads.scale(model, {1: [2]}, 2.5)
    torch.testing.assert_close(_run(model), expected, atol=1e-5, rtol=1e-5)
    assert heads.summary(model) == [{"layer": 1, "head": 2, "scale": 2.5, "shifted": False, "kind": "scaled"}]


def test_mean_ablation_replaces_the_head_by_a_constant(model):
    site = headed(model).sites[0]
    mean = torch.randn(site.n_heads, site.d_head_v)
    expected = _run(_surgery(model, 0, 2, add=mean[2] @ site.W_O[2].detach()))
    heads.mean_ablate(model, [(0, 2)], {0: mean})
    torch.testing.assert_close(_run(model), expected, atol=1e-5, rtol=1e-5)
    assert heads.summary(model)[0]["kind"] == "mean-ablated"


def test_restore_undoes_everything(model):
    before = _run(model)
    heads.mask(model, [(0, 0)])
    heads.scale(model, [(1, 1)], -1.0)
    assert not torch.allclose(_run(model), before)
    heads.restore(model, [(0, 0)])
    assert [r["head"] for r in heads.summary(model)] == [1]
    heads.restore(model)
    torch.testing.assert_close(_run(model), before)
    assert heads.summary(model) == []
    assert all(site.idle for site in headed(model).sites)  # restored heads run the fused kernel again


def test_interventions_compose_and_a_refused_call_changes_nothing(model):
    heads.mask(model, [(0, 0)])
    heads.scale(model, [(0, 0), (0, 1)], 3.0)  # scaling a masked head keeps it at zero
    kinds = {(r["head"], r["kind"]) for r in heads.summary(model)}
    assert kinds == {(0, "zero-ablated"), (1, "scaled")}
    state = heads.summary(model)
    with pytest.raises(ValueError, match="no mean z for layer 1"):
        heads.mean_ablate(model, [(0, 2), (1, 0)], {0: torch.zeros(4, headed(model).sites[0].d_head_v)})
    assert heads.summary(model) == state


@pytest.mark.parametrize("selection, error, message", [
    ([(2, 0)], ValueError, r"has layer 2, which does not exist: expected layers 0..1"),
    ([(0, 4)], ValueError, r"the heads of layer 0 has head 4, which does not exist: expected heads 0..3"),
    ([(0, -1)], ValueError, r"has head -1, which does not exist"),
    ([], ValueError, "the head selection is empty"),
    ([(0,)], TypeError, r"\(layer, head\) pairs"),
    ("0,1", TypeError, "got '0,1'"),
])
def test_bad_selections_are_named(model, selection, error, message):
    with pytest.raises(error, match=message):
        heads.mask(model, selection)


def test_bad_factor_is_named(model):
    with pytest.raises(ValueError, match="factor=nan"):
        heads.scale(model, [(0, 0)], float("nan"))
