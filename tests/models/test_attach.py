"""headlab.attach / detach and the handle's sites: their life cycle, and the limits they state.

The per-architecture matrix is tests/models/test_architectures.py; this file checks what one
model suffices for: detaching, re-attaching, the config's ``output_attentions``, a pruning
refused (statically, or because it would not equal masking) without a trace, and a model
whose q/k/v layout headlab does not recognise.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import headlab
from headlab import heads
from headlab.capture.taps import tapped
from headlab.models import HeadedModel, headed
from headlab.models.layout import Layout
from tests.support.tiny import batch, build, built, first_output, max_diff_on_tokens


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def _outputs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return first_output(model(input_ids=ids, attention_mask=mask))


@pytest.mark.parametrize("previous", ["eager", "sdpa"])
def test_detach_restores_the_previous_implementation_and_removes_the_sites(previous):
    ids, mask = batch(padding="left")
    model = headlab.attach(built("llama", attn_implementation=previous)).model
    heads.mask(model, [(0, 1)])
    assert headlab.detach(model) is model
    assert model.config._attn_implementation == previous
    assert not any(hasattr(module, "headlab_site") for module in model.modules())
    with pytest.raises(ValueError, match="has no headlab attention"):
        headed(model)
    # The mask went with the sites: the model is transformers' own again, bit for bit.
    assert max_diff_on_tokens(built("llama", attn_implementation=previous), model, ids, mask) == 0.0


def test_attention_sites_of_a_model_not_attached_or_switched_away():
    model = built("bert")
    with pytest.raises(ValueError, match=r"BertModel has no headlab attention.*headlab\.attach"):
        _ = headed(model).sites
    headlab.attach(model)
    model.set_attn_implementation("sdpa")  # taps and gates would silently do nothing now
    with pytest.raises(ValueError, match="runs attn_implementation='sdpa' now, not headlab's"):
        _ = headed(model).sites
    headlab.attach(model)  # attaching again serves it
    assert len(headed(model).sites) == 2


def test_attaching_twice_changes_nothing():
    model = headlab.attach(built("gpt2")).model
    sites = headed(model).sites
    heads.scale(model, [(1, 2)], 2.0)
    assert headlab.attach(model).model is model and headlab.attach(model) is headed(model)
    assert all(a is b for a, b in zip(headed(model).sites, sites, strict=True))
    assert [(r["layer"], r["head"], r["scale"]) for r in heads.summary(model)] == [(1, 2, 2.0)]
    loaded = HeadedModel(model=model, tokenizer=None, source="tiny")
    assert headlab.attach(loaded) is loaded and headed(loaded).sites == sites


@pytest.mark.parametrize("name, padding", [("qwen2", "left"), ("bert", "right")])
def test_output_attentions_set_in_the_config(name, padding):
    ids, mask = batch(padding=padding)
    # As a checkpoint's config.json carries it: transformers refuses to set the attribute on a model
    # whose implementation is not "eager", but a config that has it keeps it through attach.
    model = headlab.attach(build(name, output_attentions=True)).model
    assert model.config.output_attentions and model.config._attn_implementation == "headlab"
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).attentions
        expected = built(name)(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    real = (mask[:, None, :, None] * mask[:, None, None, :]).bool()
    assert got is not None and len(got) == len(expected) == 2
    for g, e in zip(got, expected):
        assert g.shape == e.shape and float((g - e).abs().masked_fill(~real, 0).max()) < 1e-5


def test_pruning_across_a_norm_over_every_head_is_refused_without_a_trace():
    """OLMo 2 normalises the concatenated queries of all heads: a head's query depends on the others,
    so cutting one out would change the rest."""
    ids, mask = batch(padding="left")
    model = headlab.attach(built("olmo2")).model
    shapes, before = _shapes(model), _outputs(model, ids, mask)
    with pytest.raises(ValueError, match=r"'q_norm.weight' \(32,\) may span every head's dimensions.*mask the "
                                         r"heads instead"):
        heads.prune(model, {0: [1], 1: [2]})
    assert _shapes(model) == shapes and [s.n_heads for s in headed(model).sites] == [4, 4]
    assert torch.equal(_outputs(model, ids, mask), before)
    heads.mask(model, {0: [1], 1: [2]})  # what the message offers works
    assert not torch.equal(_outputs(model, ids, mask), before)


def test_a_pruning_that_would_differ_from_masking_is_refused_and_undone():
    """Simulate a layout headlab misread: the site's layout says heads 0 and 1 have each other's
    query rows. Cutting head 1 then keeps the wrong rows; the check against masking catches it."""
    ids, mask = batch(padding="left")
    model = headlab.attach(built("llama")).model
    site = headed(model).sites[0]
    swapped = {0: 1, 1: 0}
    site.layout = Layout(tuple(dataclasses.replace(p, segments=tuple(
        dataclasses.replace(s, head=swapped.get(s.head, s.head)) if s.role == "q" else s for s in p.segments))
        for p in site.layout.projections))
    state = dict(vars(site))
    shapes, before = _shapes(model), _outputs(model, ids, mask)
    with pytest.raises(ValueError, match=r"pruning layers \[0\] of LlamaForCausalLM does not reproduce the masked"):
        heads.prune(model, [(0, 1)])
    assert _shapes(model) == shapes and vars(site) == state
    assert torch.equal(_outputs(model, ids, mask), before)


def test_an_unrecognised_layout_still_serves_patterns_and_z():
    """DeepSeek-V3's attention (MLA) makes q from a low-rank projection and k, v from a shared latent:
    no rows of one projection are one head's query. Patterns, z and results do not need them."""
    ids, mask = batch(padding="left")
    model = headlab.attach(built("deepseek_v3")).model
    reference = built("deepseek_v3")
    assert max_diff_on_tokens(reference, model, ids, mask) < 1e-5
    site = headed(model).sites[0]
    assert (site.n_heads, site.d_head, site.d_head_v) == (4, 12, 6) and site.layout is None
    with pytest.raises(ValueError, match=r"layout, which was not recognised \(the projection 'q_a_proj' has 16"):
        _ = site.W_Q
    with pytest.raises(ValueError, match="not in a layout headlab can slice"):
        heads.prune(model, [(0, 1)])

    out_proj = reference.get_submodule(site.out_proj.name)
    projected = []
    handle = out_proj.register_forward_pre_hook(lambda _, args: projected.append(args[0]))
    taken = {}
    try:
        with torch.no_grad(), tapped(headed(model).sites, {0: [1, 3]}, ("pattern", "z", "result"),
                                     lambda layer, out: taken.__setitem__(layer, out)):
            expected = reference(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[0]
            model(input_ids=ids, attention_mask=mask)
    finally:
        handle.remove()
    real = mask.bool()
    z = projected[0].view(*ids.shape, 4, 6)[real][:, [1, 3]]  # (tokens, head, d_head_v)
    keys = (mask[:, None, :, None] * mask[:, None, None, :]).bool()
    assert float((taken[0].pattern - expected[:, [1, 3]]).abs().masked_fill(~keys, 0).max()) < 1e-5
    assert float((taken[0].z.transpose(1, 2)[real] - z).abs().max()) < 1e-5
    result = torch.einsum("thd,hdm->thm", z, out_proj.weight.detach().t().reshape(4, 6, -1)[[1, 3]])
    assert float((taken[0].result.transpose(1, 2)[real] - result).abs().max()) < 1e-5
