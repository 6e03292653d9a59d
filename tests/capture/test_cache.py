"""run_with_cache: one call, stable names, only the asked heads, equal to eager attention and to
an explicit float64 computation."""

from __future__ import annotations

import copy

import pytest
import torch

import headlab
from headlab.capture import run_with_cache
from headlab.models import HeadedModel, headed
from tests.support.text import fake_tokenizer
from tests.support.tiny import ARCHITECTURES, batch, built

NAMES = ("pattern", "z", "result", "q", "k", "v")


@pytest.fixture(scope="module", params=["llama", "bert"])
def pair(request):
    """``(eager model, attached twin)`` of a tiny architecture (llama: causal, grouped-query)."""
    return built(request.param), headlab.attach(built(request.param)).model


def test_patterns_equal_transformers_eager_weights(pair):
    eager, attached = pair
    ids, mask = batch(padding="right")
    cache = run_with_cache(attached, {"input_ids": ids, "attention_mask": mask}, take="pattern")
    with torch.no_grad():
        expected = eager(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    real = (mask[:, None, :, None] * mask[:, None, None, :]).bool()
    for layer, weights in enumerate(expected):
        got = cache["pattern", layer]
        assert got.shape == weights.shape and cache[f"blocks.{layer}.attn.pattern"] is got
        assert float((got - weights).abs().masked_fill(~real, 0).max()) < 1e-5


def test_every_site_equals_an_explicit_float64_computation(pair):
    """In float64, from the cached q, k, v alone: pattern = softmax(q kᵀ · scaling + mask), z =
    pattern v, result = z W_O[h], and the results plus the output projection's bias are what the
    projection returned (read by a hook, apart from the cache)."""
    _, attached = pair
    model = copy.deepcopy(attached).double()  # sites come along with the copy
    ids, mask = batch(padding="right")
    site = headed(model).sites[1]
    seen = {}
    hook = site.out_proj.module.register_forward_hook(lambda m, a, out: seen.__setitem__("out", out))
    try:
        cache = run_with_cache(model, {"input_ids": ids, "attention_mask": mask}, take=NAMES, heads={1: None})
    finally:
        hook.remove()
    q, k, v = cache["q", 1], cache["k", 1], cache["v", 1]
    scores = q @ k.transpose(-1, -2) * site.module.scaling
    allowed = mask.bool()[:, None, None, :].expand_as(scores).clone()
    if site.causal:
        allowed &= torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    pattern = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    rows = mask.bool()  # padding queries are the model's business
    torch.testing.assert_close(cache["pattern", 1][rows[:, None].expand(-1, site.n_heads, -1)],
                               pattern[rows[:, None].expand(-1, site.n_heads, -1)], atol=1e-12, rtol=0)
    z = cache["pattern", 1] @ v
    torch.testing.assert_close(cache["z", 1], z, atol=1e-12, rtol=0)
    result = torch.einsum("bhqd,hdm->bhqm", z, site.W_O)
    torch.testing.assert_close(cache["result", 1], result, atol=1e-12, rtol=0)
    bias = site.out_proj.module.bias
    torch.testing.assert_close(result.sum(1) + (0 if bias is None else bias), seen["out"], atol=1e-12, rtol=0)


def test_only_the_asked_heads_are_kept(pair):
    _, attached = pair
    ids, _mask = batch(padding="none")
    cache = run_with_cache(attached, ids, take=("pattern", "z"), heads=[(1, 3), (0, 2), (1, 0)])
    # only what can be read: layers kept in part are listed head by head (their dotted names raise)
    assert cache.keys() == [("pattern", 0, 2), ("z", 0, 2), ("pattern", 1, 0), ("pattern", 1, 3), ("z", 1, 0),
                            ("z", 1, 3)]
    assert all(cache[key].shape[0] == ids.shape[0] for key in cache)
    every = run_with_cache(attached, ids, take="z", heads={1: None})
    assert every.keys() == ["blocks.1.attn.z"] and len(every) == 1
    assert cache.heads("z", 1) == [0, 3] and cache["z", 1, 3].shape[0] == ids.shape[0]
    full = run_with_cache(attached, ids, take="z")
    torch.testing.assert_close(cache["z", 1, 3], full["z", 1][:, 3])
    with pytest.raises(KeyError, match=r"only heads \[0, 3\] of layer 1's 4 were kept for 'z': ask for one"):
        cache["z", 1]
    with pytest.raises(KeyError, match=r"head 1 of layer 1 was not kept for 'z'; kept heads: \[0, 3\]"):
        cache["z", 1, 1]
    with pytest.raises(KeyError, match="'q' of layer 0 was not kept; this cache holds"):
        cache["q", 0]
    with pytest.raises(KeyError, match="is not a cache name"):
        cache["blocks.0.mlp"]
    assert ("z", 1, 3) in cache and "blocks.1.attn.q" not in cache and "blocks.1.attn.z" not in cache
    assert len(cache) == 6
    with pytest.raises(KeyError, match=r"the layout is \(batch, head, pos, …\), not its \(batch, pos, head, …\)"):
        cache["hook_z"]


def test_text_inputs_and_tokens():
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=fake_tokenizer(), pad_token="[PAD]")
    model = headlab.attach(built("bert")).model
    loaded = HeadedModel(model=model, tokenizer=tokenizer, source="tiny")
    cache = run_with_cache(loaded, ["the cat sat", "a dog"], heads={0: [1]})
    assert cache.tokens == [["[CLS]", "the", "cat", "sat", "[SEP]"], ["[CLS]", "a", "dog", "[SEP]"]]
    assert cache["pattern", 0, 1].shape == (2, 5, 5) and cache.output.last_hidden_state.shape[:2] == (2, 5)
    with pytest.raises(TypeError, match="text inputs need a tokenizer"):
        run_with_cache(model, "the cat")
    with pytest.raises(ValueError, match="empty or whitespace"):
        run_with_cache(loaded, ["the cat", " "])
    with pytest.raises(ValueError, match="take="):
        run_with_cache(loaded, "the cat", take=("pattern", "mlp_out"))


def test_gradients_flow_when_asked():
    model = headlab.attach(built("bert")).model
    ids, _mask = batch(padding="none")
    cache = run_with_cache(model, ids, take="z", heads={0: [0]}, grad=True)
    assert cache["z", 0, 0].requires_grad
    cache.output.last_hidden_state.sum().backward()
    assert next(model.parameters()).grad is not None
    assert not run_with_cache(model, ids, take="z", heads={0: [0]})["z", 0, 0].requires_grad


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_architecture(name):
    """The cache on every architecture headlab serves: patterns equal the eager weights, and q, k,
    v have the per-head shapes (k and v per query head, grouped-query or not)."""
    eager, attached = built(name), headlab.attach(built(name)).model
    ids, mask = batch(padding="left" if ARCHITECTURES[name].causal else "right")
    cache = run_with_cache(attached, {"input_ids": ids, "attention_mask": mask}, take=NAMES, heads={1: [0, 3]})
    with torch.no_grad():
        expected = eager(input_ids=ids, attention_mask=mask, output_attentions=True).attentions[1][:, [0, 3]]
    real = (mask[:, None, :, None] * mask[:, None, None, :]).bool()
    got = torch.stack([cache["pattern", 1, 0], cache["pattern", 1, 3]], dim=1)
    assert float((got - expected).abs().masked_fill(~real, 0).max()) < 1e-5
    site = headed(attached).sites[1]
    size, length = ids.shape
    assert cache["q", 1, 3].shape == (size, length, site.d_head) == cache["k", 1, 3].shape
    assert cache["v", 1, 3].shape == (size, length, site.d_head_v) == cache["z", 1, 3].shape
    assert cache["result", 1, 3].shape == (size, length, site.out_proj.weight.shape[0])
