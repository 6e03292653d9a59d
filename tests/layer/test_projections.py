"""Every projection variant keeps the layer's forward contract, trains, and converts exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import headlab.layer.config
from headlab import AttentionConfig, MultiHeadAttention
from headlab.layer.convert import output_change, to_bilinear, to_grouped, to_wide
from headlab.layer.projections import projection_for
from tests.support.reference import layer_reference

VARIANTS = {
    "wide": dict(d_model=16, n_heads=4),
    "grouped-query": dict(d_model=16, n_heads=4, n_kv_heads=2),
    "multi-query": dict(d_model=16, n_heads=4, n_kv_heads=1),
    "single head": dict(d_model=16, n_heads=1),
    "narrow": dict(d_model=16, n_heads=4, projection="narrow"),
    "shared": dict(d_model=16, n_heads=4, projection="shared"),
    "bilinear": dict(d_model=16, n_heads=4, projection="bilinear"),
    "collaborative": dict(d_model=16, n_heads=4, projection="collaborative", d_head=12),
    "talking-heads": dict(d_model=16, n_heads=4, talking_heads=True),
    "narrow, rotary, cross-attention": dict(d_model=16, n_heads=4, projection="narrow", kdim=8, vdim=12, rotary=True),
    "shared, no bias, d_head independent": dict(d_model=12, n_heads=3, projection="shared", bias=False, d_head=6),
    "bilinear, cross-attention": dict(d_model=16, n_heads=2, projection="bilinear", kdim=6, vdim=10),
    "collaborative, rotary": dict(d_model=16, n_heads=4, projection="collaborative", rotary=True, d_head=8),
    "talking-heads, grouped-query, narrow values": dict(d_model=16, n_heads=4, n_kv_heads=2, talking_heads=True,
                                                        d_head_v=3),
    # nn.MultiheadAttention's extra key/value positions, on every variant
    "wide, bias_kv, zero_attn": dict(d_model=16, n_heads=4, add_bias_kv=True, add_zero_attn=True),
    "grouped-query, rotary, bias_kv": dict(d_model=16, n_heads=4, n_kv_heads=2, rotary=True, add_bias_kv=True),
    "narrow, cross-attention, bias_kv": dict(d_model=16, n_heads=4, projection="narrow", kdim=8, vdim=12,
                                             add_bias_kv=True),
    "shared, zero_attn": dict(d_model=16, n_heads=4, projection="shared", add_zero_attn=True),
    "bilinear, zero_attn": dict(d_model=16, n_heads=4, projection="bilinear", add_zero_attn=True),
    "collaborative, bias_kv, zero_attn": dict(d_model=16, n_heads=4, projection="collaborative", d_head=12,
                                              add_bias_kv=True, add_zero_attn=True),
    "talking-heads, bias_kv": dict(d_model=16, n_heads=4, talking_heads=True, add_bias_kv=True),
}


def _layer(opts, dtype=torch.float64, seed=0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    layer = MultiHeadAttention(AttentionConfig(**opts)).to(dtype)
    with torch.no_grad():  # move every parameter off its special starting value (zero biases, identity mixings)
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return layer


def _inputs(layer, batch=2, q_len=5, k_len=7):
    c = layer.config
    query = torch.randn(batch, q_len, c.d_model, dtype=torch.float64)
    if (c.kdim, c.vdim) == (c.d_model, c.d_model):
        return query, None, None
    return query, torch.randn(batch, k_len, c.kdim, dtype=torch.float64), torch.randn(batch, k_len, c.vdim,
                                                                                       dtype=torch.float64)


def _close(a, b, tol=1e-10):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", VARIANTS)
def test_forward_contract_matches_reference(name):
    layer = _layer(VARIANTS[name])
    query, key, value = _inputs(layer)
    k_len = query.shape[1] if key is None else key.shape[1]
    kpm = torch.zeros(2, k_len, dtype=torch.bool)
    kpm[1] = True  # every row of sequence 1 sees no key
    kpm[0, -2:] = True
    attn_mask = torch.randn(query.shape[1], k_len, dtype=torch.float64)
    gate = torch.tensor([1.0, 0.0, 0.5, 2.0][: layer.config.n_heads], dtype=torch.float64)
    kwargs = dict(key_padding_mask=kpm, attn_mask=attn_mask, head_mask=gate, is_causal=True)
    expected, patterns, result = layer_reference(layer, query, key, value, causal=True, key_padding_mask=kpm,
                                                 attn_mask=attn_mask, head_mask=gate)
    _close(layer(query, key, value, **kwargs), expected)
    every = layer(query, key, value, **kwargs, return_pattern=True, return_result=True)
    _close(every.output, expected)
    _close(every.pattern, patterns)
    _close(every.result, result)
    heads = [layer.config.n_heads - 1, 0]
    some = layer(query, key, value, **kwargs, return_pattern=heads, return_result=heads)
    _close(some.pattern, patterns[:, heads])
    _close(some.result, result[:, heads])
    b_O = 0 if layer.b_O is None else layer.b_O
    _close(every.result.sum(dim=1) + b_O, every.output)
    assert torch.isfinite(every.output).all()
    extra = 0 if layer.extra_kv is None else layer.extra_kv.count
    assert every.pattern.shape[-1] == k_len + extra
    assert (every.pattern[1, ..., :k_len] == 0).all()  # sequence 1 sees none of its own keys
    if extra and not layer.config.talking_heads:  # ... only the extra positions, which every query sees (as in torch)
        _close(every.pattern[1].sum(-1), torch.ones_like(every.pattern[1, ..., 0]))


@pytest.mark.parametrize("name", [n for n in VARIANTS if "cross" not in n])
def test_decoding_with_cache_equals_full_pass(name):
    layer = _layer(VARIANTS[name] | dict(causal=True))
    x = torch.randn(2, 6, layer.config.d_model, dtype=torch.float64)
    full = layer(x)
    cache = layer.new_kv_cache(batch_size=2, max_len=6)
    steps = [layer(x[:, :3], kv_cache=cache)] + [layer(x[:, i : i + 1], kv_cache=cache) for i in range(3, 6)]
    _close(torch.cat(steps, dim=1), full)


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_trains(name):
    """A few Adam steps on regressing a random teacher layer's outputs: the loss falls."""
    opts = VARIANTS[name]
    torch.manual_seed(1)
    teacher = MultiHeadAttention(AttentionConfig(d_model=opts["d_model"], n_heads=2,
                                                 kdim=opts.get("kdim"), vdim=opts.get("vdim")))
    student = MultiHeadAttention(AttentionConfig(**opts))
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        query = torch.randn(8, 6, opts["d_model"])
        key = value = None
        if "kdim" in opts:
            key, value = torch.randn(8, 6, opts["kdim"]), torch.randn(8, 6, opts["vdim"])
        with torch.no_grad():
            target = teacher(query, key, value)
        loss = (student(query, key, value) - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5, losses


@pytest.mark.parametrize("name", [n for n in VARIANTS if n != "wide"])
def test_to_wide_is_exact(name):
    layer = _layer(VARIANTS[name])
    wide = to_wide(layer)
    assert wide.config.projection == "wide"
    query, key, value = _inputs(layer)
    _close(wide(query, key, value, is_causal=True), layer(query, key, value, is_causal=True))
    assert output_change(layer, wide) < 1e-12


@pytest.mark.parametrize("name", [n for n in VARIANTS if "rotary" not in n and "_kv" not in n and "zero_attn" not in n])
def test_to_bilinear_is_exact(name):
    layer = _layer(VARIANTS[name])
    bilinear = to_bilinear(layer)
    assert bilinear.config.projection == "bilinear"
    query, key, value = _inputs(layer)
    _close(bilinear(query, key, value), layer(query, key, value))
    _close(bilinear.QK.AB, layer.QK.AB)  # the same bilinear forms, now stored in full


def test_narrow_and_shared_convert_to_block_structured_wide_layers():
    shared = _layer(VARIANTS["shared"])
    W_Q = to_wide(shared).W_Q  # (n_heads, d_model, d_head)
    d_slice = 4
    for h in range(4):
        block = W_Q[h, h * d_slice : (h + 1) * d_slice]
        _close(block, shared.projection.q_weight[0])  # the same matrix in every head's slice
        outside = torch.cat([W_Q[h, : h * d_slice], W_Q[h, (h + 1) * d_slice :]])
        assert (outside == 0).all()


def test_to_grouped_is_approximate_and_exact_when_group_heads_agree():
    layer = _layer(VARIANTS["wide"])
    grouped = to_grouped(layer, 2)
    assert grouped.config.n_kv_heads == 2
    change = output_change(layer, grouped)
    assert 1e-3 < change < 10
    with torch.no_grad():  # make key/value heads 0,1 and 2,3 identical: pooling loses nothing
        for W in (layer.W_K, layer.W_V, layer.b_K, layer.b_V):
            W[1], W[3] = W[0], W[2]
    assert output_change(layer, to_grouped(layer, 2)) < 1e-12
    assert output_change(layer, to_grouped(layer, 4)) < 1e-12  # n_kv_heads unchanged: a copy


def test_conversion_errors_name_the_problem():
    with pytest.raises(ValueError, match="rotary=True"):
        to_bilinear(_layer(VARIANTS["collaborative, rotary"]))
    with pytest.raises(ValueError, match="add_bias_kv=True, add_zero_attn=True"):
        to_bilinear(_layer(VARIANTS["wide, bias_kv, zero_attn"]))
    with pytest.raises(ValueError, match="add_bias_kv=False, add_zero_attn=True"):
        to_bilinear(_layer(VARIANTS["shared, zero_attn"]))
    with pytest.raises(ValueError, match="projection='narrow'"):
        to_grouped(_layer(VARIANTS["narrow"]), 2)
    with pytest.raises(ValueError, match="n_kv_heads=3"):
        to_grouped(_layer(VARIANTS["wide"]), 3)


def test_per_head_views_say_what_is_shared():
    shared, narrow = _layer(VARIANTS["shared"]), _layer(VARIANTS["narrow"])
    W_Q = shared.W_Q
    assert all(torch.equal(W_Q[h, 4 * h : 4 * h + 4], W_Q[0, :4]) for h in range(4))
    assert not torch.equal(narrow.W_Q[1, 4:8], narrow.W_Q[0, :4])
    assert narrow.QK.rank.max() <= 4  # a head reads a 4-wide slice
    bilinear = _layer(VARIANTS["bilinear"])
    assert bilinear.QK.shape == (4, 16, 16) and (bilinear.QK.rank == 16).all()  # full rank, unlike d_head = 4
    _close(bilinear.QK.AB, bilinear.projection.qk_weight)
    assert (_layer(VARIANTS["wide"]).QK.rank == 4).all()


@pytest.mark.parametrize("opts, message", [
    (dict(d_model=18, n_heads=4, d_head=4, projection="narrow"), "n_heads=4 must divide d_model=18"),
    (dict(d_model=16, n_heads=4, kdim=10, projection="shared"), "n_heads=4 must divide kdim=10"),
    (dict(d_model=16, n_heads=4, n_kv_heads=2, projection="narrow"), "n_kv_heads=2 must equal n_heads=4"),
    (dict(d_model=16, n_heads=4, n_kv_heads=1, projection="collaborative"), "n_kv_heads=1 must equal n_heads=4"),
    (dict(d_model=16, n_heads=4, projection="bilinear", rotary=True), "rotary=True"),
    (dict(d_model=16, n_heads=4, talking_heads=1), "talking_heads=1"),
])
def test_variants_refuse_what_they_cannot_do_when_built(opts, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(AttentionConfig(**opts))


def test_the_config_is_data_and_the_variant_checks_its_sizes() -> None:
    # The config holds sizes a variant cannot use; building the layer (or projection_for) refuses them.
    config = AttentionConfig(d_model=18, n_heads=4, d_head=4, projection="narrow")
    with pytest.raises(ValueError, match="n_heads=4 must divide d_model=18"):
        projection_for(config)
    with pytest.raises(ValueError, match=r"projection='nope' is not one of \['bilinear', 'collaborative'"):
        MultiHeadAttention(AttentionConfig(d_model=8, n_heads=2, projection="nope"))
    config_source = (Path(headlab.layer.config.__file__)).read_text(encoding="utf-8")
    assert "projections" not in "".join(line for line in config_source.splitlines() if "import" in line)


def test_to_grouped_pools_the_learned_extra_position() -> None:
    layer = _layer(VARIANTS["wide, bias_kv, zero_attn"])
    grouped = to_grouped(layer, 2)
    _close(grouped.extra_kv.bias_k, layer.extra_kv.bias_k.view(2, 2, -1).mean(1))
    with torch.no_grad():  # equal key/value heads within each group: pooling loses nothing
        for W in (layer.W_K, layer.W_V, layer.b_K, layer.b_V, layer.extra_kv.bias_k, layer.extra_kv.bias_v):
            W[1], W[3] = W[0], W[2]
    assert output_change(layer, to_grouped(layer, 2)) < 1e-12
