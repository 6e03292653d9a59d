"""from_torch / to_torch carry weights exactly; outputs and attention weights equal torch's.

PyTorch-style: random sizes, options and masks, the same call on a torch layer and on the layer
``from_torch`` made of it, every output compared — also with add_bias_kv and add_zero_attn.
"""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import headlab
from headlab.interop import attend_static, parity_suite
from tests.support.devices import DEVICES

TOLERANCE = {torch.float32: 1e-6, torch.float64: 1e-12}


def _torch_layer(d_model, n_heads, *, bias=True, kdim=None, vdim=None, batch_first=True, dtype=torch.float32,
                 device="cpu", add_bias_kv=False, add_zero_attn=False, dropout=0.0):
    mha = nn.MultiheadAttention(d_model, n_heads, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first,
                                add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn, dropout=dropout,
                                dtype=dtype, device=device).eval()
    with torch.no_grad():
        for name, p in mha.named_parameters():
            # torch starts these at zero; bias_k, bias_v are random
            if "bias" in name and name not in ("bias_k", "bias_v"):
                p.normal_(0, 0.2)
    return mha


def _masks(kind, batch, n_heads, q_len, k_len, dtype):
    masks = {}
    if "pad" in kind:
        pad = torch.rand(batch, k_len) < 0.3
        pad[:, 0] = False
        if "dead" in kind:
            pad[-1] = True  # a sequence whose every key is padding
        masks["key_padding_mask"] = pad if "bool" in kind else torch.zeros(batch, k_len, dtype=dtype).masked_fill(
            pad, float("-inf"))
    if "causal" in kind:
        masks["attn_mask"] = torch.ones(q_len, k_len, dtype=torch.bool).triu(k_len - q_len + 1)
    if "per-head" in kind:
        masks["attn_mask"] = torch.randn(batch * n_heads, q_len, k_len, dtype=dtype)
    if "float2d" in kind:
        masks["attn_mask"] = torch.randn(q_len, k_len, dtype=dtype)
    return masks


GRID = list(itertools.product(
    [(32, 4), (48, 6), (16, 1), (64, 16)],
    [True, False],  # bias
    [None, (12, 20)],  # kdim, vdim
    [True, False],  # batch_first
    ["none", "pad-bool", "pad-float", "causal", "per-head", "pad-bool+per-head"],
))


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")  # torch warns on bool+float
@pytest.mark.parametrize("case", random.Random(0).sample(GRID, 40))
def test_outputs_and_weights_equal_torch(case):
    (d_model, n_heads), bias, dims, batch_first, kind = case
    kdim, vdim = dims or (None, None)
    mha = _torch_layer(d_model, n_heads, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first)
    layer = headlab.from_torch(mha).eval()
    batch, q_len = 3, 7
    k_len = 9 if dims else q_len
    query = torch.randn(batch, q_len, d_model)
    key = torch.randn(batch, k_len, kdim) if dims else query
    value = torch.randn(batch, k_len, vdim) if dims else query
    masks = _masks(kind, batch, n_heads, q_len, k_len, torch.float32)
    t_args = (query, key, value) if batch_first else tuple(x.transpose(0, 1) for x in (query, key, value))
    with torch.no_grad():
        t_out, t_weights = mha(*t_args, **masks, average_attn_weights=False)
        t_fast, _ = mha(*t_args, **masks, need_weights=False)
        if not batch_first:
            t_out, t_fast = t_out.transpose(0, 1), t_fast.transpose(0, 1)
        out = layer(query, key if dims else None, value if dims else None, **masks, return_pattern=True)
        fast = layer(query, key if dims else None, value if dims else None, **masks)
    torch.testing.assert_close(out.output, t_out, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(out.pattern, t_weights, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(fast, t_fast, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dims", [None, (12, 20)])
@pytest.mark.parametrize("bias", [True, False])
def test_round_trip_is_exact(device, dims, bias):
    kdim, vdim = dims or (None, None)
    mha = _torch_layer(32, 4, bias=bias, kdim=kdim, vdim=vdim, device=device)
    layer = headlab.from_torch(mha)
    assert layer.config.kdim == (kdim or 32) and layer.config.bias is bias
    back = headlab.to_torch(layer, batch_first=False)
    assert back.batch_first is False
    for (name, a), (name_b, b) in zip(mha.state_dict().items(), back.state_dict().items(), strict=True):
        assert name == name_b and torch.equal(a, b) and a.device == b.device
    # the copy is independent: training one does not move the other
    with torch.no_grad():
        layer.W_Q[0].add_(1.0)
    assert not torch.equal(layer.projection.q_weight, mha.state_dict()["in_proj_weight" if not dims else
                                                                        "q_proj_weight"][: 32])


def test_gradients_equal_torch():
    mha = _torch_layer(32, 4).train()
    layer = headlab.from_torch(mha)
    assert layer.training
    x = torch.randn(2, 6, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    mha(x, x, x, key_padding_mask=pad, need_weights=False)[0].square().sum().backward()
    layer(x, key_padding_mask=pad).square().sum().backward()
    t_grads = dict(mha.named_parameters())
    for name, p in layer.projection.named_parameters():
        torch.testing.assert_close(p.grad, t_grads[name].grad, atol=1e-5, rtol=1e-5)


def test_from_torch_rejects_what_is_not_torchs_layer():
    with pytest.raises(TypeError, match="Linear"):
        headlab.from_torch(nn.Linear(4, 4))


# --- add_bias_kv and add_zero_attn ---------------------------------------------------------------

EXTRA_GRID = list(itertools.product(
    [(32, 4), (48, 6), (16, 1), (64, 16)],
    [True, False],  # bias
    [None, (12, 20)],  # kdim, vdim
    [True, False],  # batch_first
    [(True, False), (False, True), (True, True)],  # add_bias_kv, add_zero_attn
    ["none", "pad-bool", "pad-float", "causal", "per-head", "pad-bool+per-head", "pad-bool-dead", "float2d+pad-float"],
    [torch.float32, torch.float64],
))


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")  # torch warns on bool+float
@pytest.mark.parametrize("case", random.Random(1).sample(EXTRA_GRID, 60), ids=str)
def test_extra_positions_equal_torch(case):
    (d_model, n_heads), bias, dims, batch_first, (add_bias_kv, add_zero_attn), kind, dtype = case
    kdim, vdim = dims or (None, None)
    mha = _torch_layer(d_model, n_heads, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first, dtype=dtype,
                       add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
    layer = headlab.from_torch(mha).eval()
    assert (layer.config.add_bias_kv, layer.config.add_zero_attn) == (add_bias_kv, add_zero_attn)
    batch, q_len = 3, 7
    k_len = 9 if dims else q_len
    query = torch.randn(batch, q_len, d_model, dtype=dtype)
    key = torch.randn(batch, k_len, kdim, dtype=dtype) if dims else query
    value = torch.randn(batch, k_len, vdim, dtype=dtype) if dims else query
    masks = _masks(kind, batch, n_heads, q_len, k_len, dtype)
    t_args = (query, key, value) if batch_first else tuple(x.transpose(0, 1) for x in (query, key, value))
    with torch.no_grad():
        t_out, t_weights = mha(*t_args, **masks, average_attn_weights=False)
        _, t_mean = mha(*t_args, **masks)  # average_attn_weights=True: the mean over heads
        t_fast, _ = mha(*t_args, **masks, need_weights=False)
        if not batch_first:
            t_out, t_fast = t_out.transpose(0, 1), t_fast.transpose(0, 1)
        out = layer(query, key if dims else None, value if dims else None, **masks, return_pattern=True)
        fast = layer(query, key if dims else None, value if dims else None, **masks)
    extra = add_bias_kv + add_zero_attn
    assert out.pattern.shape == t_weights.shape == (batch, n_heads, q_len, k_len + extra)
    tol = TOLERANCE[dtype]
    for mine, theirs in ((out.output, t_out), (fast, t_fast), (out.pattern, t_weights), (out.pattern.mean(1), t_mean)):
        assert torch.isfinite(theirs).all()  # the extra positions are always allowed: no row is blind
        torch.testing.assert_close(mine, theirs, atol=tol, rtol=0)


@pytest.mark.parametrize("dims", [None, (12, 20)])
@pytest.mark.parametrize(("add_bias_kv", "add_zero_attn"), [(True, False), (False, True), (True, True)])
def test_round_trip_with_extra_positions_is_exact(dims, add_bias_kv, add_zero_attn):
    kdim, vdim = dims or (None, None)
    mha = _torch_layer(32, 4, kdim=kdim, vdim=vdim, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn)
    layer = headlab.from_torch(mha)
    if add_bias_kv:
        assert torch.equal(layer.extra_kv.bias_k, mha.bias_k.view(4, 8))
    back = headlab.to_torch(layer)
    assert (back.bias_k is not None, back.add_zero_attn) == (add_bias_kv, add_zero_attn)
    for (name, a), (name_b, b) in zip(mha.state_dict().items(), back.state_dict().items(), strict=True):
        assert name == name_b and torch.equal(a, b)


def test_headlab_layer_with_extra_positions_exports_exactly():
    layer = headlab.MultiHeadAttention(headlab.AttentionConfig(d_model=24, n_heads=3, add_bias_kv=True,
                                                               add_zero_attn=True)).double().eval()
    mha = headlab.to_torch(layer)
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [True] * 5])  # the second sequence sees only the extra positions
    with torch.no_grad():
        out = layer(x, key_padding_mask=pad, return_pattern=True)
        t_out, t_weights = mha(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    torch.testing.assert_close(out.output, t_out, atol=1e-12, rtol=0)
    torch.testing.assert_close(out.pattern, t_weights, atol=1e-12, rtol=0)
    assert (out.pattern[1, ..., :5] == 0).all() and torch.allclose(out.pattern[1, ..., 5:].sum(-1), torch.ones(3, 5,
                                                                                                           dtype=torch.float64))


def test_gradients_with_extra_positions_equal_torch():
    mha = _torch_layer(32, 4, add_bias_kv=True, add_zero_attn=True, dtype=torch.float64).train()
    layer = headlab.from_torch(mha)
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    mha(x, x, x, key_padding_mask=pad, need_weights=False)[0].square().sum().backward()
    layer(x, key_padding_mask=pad).square().sum().backward()
    torch.testing.assert_close(layer.extra_kv.bias_k.grad, mha.bias_k.grad.view(4, 8), atol=1e-12, rtol=0)
    torch.testing.assert_close(layer.extra_kv.bias_v.grad, mha.bias_v.grad.view(4, 8), atol=1e-12, rtol=0)
    t_grads = dict(mha.named_parameters())
    for name, p in layer.projection.named_parameters():
        torch.testing.assert_close(p.grad, t_grads[name].grad, atol=1e-12, rtol=0)


# --- need_weights in training with dropout: headlab's pattern is taken before dropout ---------------

@pytest.mark.parametrize("add_bias_kv", [False, True])
def test_dropout_weights_are_torchs_after_dropout_and_headlabs_before(add_bias_kv):
    p = 0.3
    mha = _torch_layer(32, 4, dropout=p, add_bias_kv=add_bias_kv).train()
    layer = headlab.from_torch(mha)
    assert layer.training and layer.config.dropout == p
    x = torch.randn(2, 6, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    torch.manual_seed(7)
    out = layer(x, key_padding_mask=pad, return_pattern=True)
    torch.manual_seed(7)
    t_out, t_weights = mha(x, x, x, key_padding_mask=pad, average_attn_weights=False)
    torch.manual_seed(7)
    dropped = F.dropout(out.pattern, p)  # the same draw of the same dropout, applied to headlab's pattern
    # Documented behaviour: the same outputs; torch's weights are headlab's pattern after dropout.
    torch.testing.assert_close(out.output, t_out, atol=1e-6, rtol=0)
    torch.testing.assert_close(t_weights, dropped, atol=1e-6, rtol=0)
    torch.testing.assert_close(out.pattern.sum(-1), torch.ones(2, 4, 6), atol=1e-6, rtol=0)  # a distribution
    assert (t_weights == 0).any() and not torch.allclose(t_weights.sum(-1), torch.ones(2, 4, 6))
    with torch.no_grad():  # in evaluation the two coincide
        torch.testing.assert_close(layer.eval()(x, key_padding_mask=pad, return_pattern=True).pattern,
                                   mha.eval()(x, x, x, key_padding_mask=pad, average_attn_weights=False)[1],
                                   atol=1e-6, rtol=0)


# --- static_k / static_v: the functional's precomputed keys, through attend_static ----------------

@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("add_zero_attn", [False, True])
@pytest.mark.parametrize("kind", ["none", "pad-bool", "per-head", "pad-bool-dead+float2d"])
def test_attend_static_equals_torchs_static_k_and_v(dtype, add_zero_attn, kind):
    mha = _torch_layer(32, 4, add_zero_attn=add_zero_attn, dtype=dtype)
    layer = headlab.from_torch(mha).eval()
    batch, q_len, k_len, n_heads, d_head = 3, 5, 8, 4, 8
    query = torch.randn(batch, q_len, 32, dtype=dtype)
    static_k = torch.randn(batch * n_heads, k_len, d_head, dtype=dtype)
    static_v = torch.randn(batch * n_heads, k_len, d_head, dtype=dtype)
    masks = _masks(kind, batch, n_heads, q_len, k_len, dtype)
    key = torch.randn(k_len, batch, 32, dtype=dtype)  # torch checks mask widths against key; its projection is unused
    with torch.no_grad():
        t_out, t_weights = F.multi_head_attention_forward(
            query.transpose(0, 1), key, key, 32, n_heads, mha.in_proj_weight, mha.in_proj_bias, None, None,
            add_zero_attn, 0.0, mha.out_proj.weight, mha.out_proj.bias, training=False,
            static_k=static_k, static_v=static_v, average_attn_weights=False, **masks)
        out, pattern = attend_static(layer, query, static_k, static_v, **masks, return_pattern=True)
    live = torch.isfinite(t_out.transpose(0, 1)).all(-1)  # torch: NaN where a row sees no key; headlab: zeros
    torch.testing.assert_close(out[live], t_out.transpose(0, 1)[live], atol=TOLERANCE[dtype], rtol=0)
    torch.testing.assert_close(pattern[live[:, None].expand_as(pattern[..., 0])],
                               t_weights[live[:, None].expand_as(pattern[..., 0])], atol=TOLERANCE[dtype], rtol=0)
    assert torch.isfinite(out).all()


def test_attend_static_names_what_it_cannot_take():
    layer = headlab.from_torch(_torch_layer(16, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="add_bias_kv=True"):
        attend_static(layer, torch.randn(1, 3, 16), torch.randn(2, 4, 8), torch.randn(2, 4, 8))
    layer = headlab.from_torch(_torch_layer(16, 2))
    with pytest.raises(ValueError, match=r"static_k \(3, 4, 8\)"):
        attend_static(layer, torch.randn(1, 3, 16), torch.randn(3, 4, 8), torch.randn(3, 4, 8))


@pytest.mark.parametrize("opts, field", [
    (dict(n_kv_heads=2), "n_kv_heads=2"),
    (dict(d_head=5), "d_head=5"),
    (dict(d_head_v=2), "d_head_v=2"),
    (dict(rotary=True), "rotary=True"),
    (dict(talking_heads=True), "talking_heads=True"),
    (dict(projection="shared"), "projection='shared'"),
    (dict(causal=True), "causal=True"),
    (dict(scale=0.1), "scale=0.1"),
])
def test_to_torch_names_what_torch_lacks(opts, field):
    layer = headlab.MultiHeadAttention(headlab.AttentionConfig(d_model=16, n_heads=4, **opts))
    with pytest.raises(ValueError, match=field):
        headlab.to_torch(layer)


def test_parity_suite_passes_and_reports_real_differences():
    cases = parity_suite(seed=1, quick=True)
    assert len(cases) >= 12 and all(c.passed for c in cases)
    assert all(c.output_max_abs < c.tolerance and c.reference_max_abs > 0 for c in cases)
    assert {"self-attention", "one head"} <= {c.name for c in cases}
    extra = [c for c in cases if "add_bias_kv" in c.name or "add_zero_attn" in c.name]
    assert {(c.settings.get("add_bias_kv", False), c.settings.get("add_zero_attn", False)) for c in extra} == {
        (True, False), (False, True), (True, True)}
    assert any(c.settings.get("padding") == "dead" for c in extra)
    assert all(set(c.to_dict()) >= {"name", "settings", "output_max_abs", "passed"} for c in cases)
