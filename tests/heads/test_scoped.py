"""Scoped interventions: the same effect as the persistent forms inside the block, the exact state
and outputs after it, on exit and on exception; patching a head with its own z changes nothing."""

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


def _run(model, padding="right", seed=1):
    ids, mask = batch(padding=padding, seed=seed)
    with torch.no_grad():
        return first_output(model(input_ids=ids, attention_mask=mask))


def _state(model):
    """The weights and every site's gates, to compare exactly."""
    gates = [{name: getattr(site, name) for name in ("scale", "shift", "head_mask", "replacement", "delta")}
             for site in headed(model).sites]
    return {k: v.clone() for k, v in model.state_dict().items()}, gates


def _assert_same_state(before, after):
    (weights_a, gates_a), (weights_b, gates_b) = before, after
    assert weights_a.keys() == weights_b.keys() and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    for a, b in zip(gates_a, gates_b):
        assert a.keys() == b.keys()
        for name in a:
            assert (a[name] is None) == (b[name] is None), name
            if isinstance(a[name], torch.Tensor):
                assert torch.equal(a[name], b[name]), name


def _scopes(model):
    site = headed(model).sites[0]
    means = {0: torch.randn(site.n_heads, site.d_head_v)}
    return {
        "masked": (lambda: heads.masked(model, {0: [1]}), lambda m: heads.mask(m, {0: [1]})),
        "scaled": (lambda: heads.scaled(model, {1: [2]}, -0.5), lambda m: heads.scale(m, {1: [2]}, -0.5)),
        "mean_ablated": (lambda: heads.mean_ablated(model, {0: [3]}, means),
                         lambda m: heads.mean_ablate(m, {0: [3]}, means)),
    }


@pytest.mark.parametrize("scope", ["masked", "scaled", "mean_ablated"])
def test_a_scope_acts_like_the_persistent_form_and_restores_exactly(model, scope):
    heads.scale(model, {0: [0]}, 2.0)  # an intervention already there must survive the scope
    enter, persistent = _scopes(model)[scope]
    before, outputs = _state(model), _run(model)
    twin = copy.deepcopy(model)
    persistent(twin)
    with enter():
        inside = _run(model)
    torch.testing.assert_close(inside, _run(twin), atol=0, rtol=0)
    assert not torch.equal(inside, outputs)
    _assert_same_state(before, _state(model))
    torch.testing.assert_close(_run(model), outputs, atol=0, rtol=0)


@pytest.mark.parametrize("scope", ["masked", "scaled", "mean_ablated"])
def test_a_scope_restores_on_exception(model, scope):
    enter, _ = _scopes(model)[scope]
    before, outputs = _state(model), _run(model)
    with pytest.raises(RuntimeError, match="inside"), enter():  # noqa: PT012 - a run, then a raise inside the scope
        _run(model)
        raise RuntimeError("inside")
    _assert_same_state(before, _state(model))
    torch.testing.assert_close(_run(model), outputs, atol=0, rtol=0)
    assert all(site.idle for site in headed(model).sites)  # and the fused kernel is back


def test_patching_a_head_with_its_own_z_changes_nothing(model):
    ids, mask = batch(padding="right")
    inputs = {"input_ids": ids, "attention_mask": mask}
    clean = headlab.run_with_cache(model, inputs, take="z")
    with heads.patched(model, None, clean):  # every head of every layer, from the same run
        again = headlab.run_with_cache(model, inputs, take="z")
    torch.testing.assert_close(first_output(again.output), first_output(clean.output), atol=1e-6, rtol=0)
    assert all(site.replacement is None for site in headed(model).sites)


def test_patching_moves_the_output_toward_the_source_run(model):
    clean_ids, _mask = batch(padding="none", seed=1)
    corrupt_ids, _ = batch(padding="none", seed=2)
    clean = headlab.run_with_cache(model, clean_ids, take="z")
    with torch.no_grad():
        corrupt = first_output(model(input_ids=corrupt_ids))
    last = len(headed(model).sites) - 1
    with heads.patched(model, {last: None}, clean):
        with torch.no_grad():
            patched = first_output(model(input_ids=corrupt_ids))
        assert headed(model).sites[last].replacement is not None
    # The last layer's heads now carry the clean run's z: the output moves toward the clean one.
    clean_out = first_output(clean.output)
    assert float((patched - clean_out).norm()) < float((corrupt - clean_out).norm())
    with heads.patched(model, {0: [1]}, {0: clean["z", 0]}), torch.no_grad():  # a plain {layer: z} source serves too
        model(input_ids=corrupt_ids)
    with pytest.raises(KeyError, match="no z for layer 1"), heads.patched(model, {1: [0]}, {0: clean["z", 0]}):
        pass
    with (pytest.raises(ValueError, match=r"the replacement z has shape .* patch between inputs of the same shape"),
          heads.patched(model, {0: [1]}, clean), torch.no_grad()):
        model(input_ids=corrupt_ids[:, :5])
