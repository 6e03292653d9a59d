"""MultiHeadAttention against the float64 per-head reference, in every option."""

from __future__ import annotations

import pytest
import torch

from headlab import AttentionConfig, AttentionOutput, MultiHeadAttention
from tests.support.devices import DEVICES
from tests.support.reference import layer_reference

CONFIGS = {
    "standard": dict(d_model=32, n_heads=4),
    "no-bias": dict(d_model=24, n_heads=3, bias=False),
    "grouped-query": dict(d_model=32, n_heads=8, n_kv_heads=2),
    "multi-query": dict(d_model=32, n_heads=4, n_kv_heads=1),
    "d_head independent": dict(d_model=20, n_heads=3, d_head=7, d_head_v=5),
    "cross-attention": dict(d_model=16, n_heads=2, kdim=12, vdim=9),
    "rotary": dict(d_model=32, n_heads=4, rotary=True),
    "partial rotary, GQA": dict(d_model=48, n_heads=6, n_kv_heads=3, rotary=True, rotary_dim=4, rotary_base=500.0),
    "causal, custom scale": dict(d_model=16, n_heads=4, causal=True, scale=0.7),
}


def _layer(opts: dict, dtype=torch.float64) -> MultiHeadAttention:
    layer = MultiHeadAttention(AttentionConfig(**opts)).to(dtype)
    with torch.no_grad():  # non-zero biases so that they are tested
        for name, p in layer.named_parameters():
            if "bias" in name:
                p.normal_(0, 0.5)
    return layer


def _inputs(layer: MultiHeadAttention, batch=2, q_len=5, k_len=None, dtype=torch.float64):
    c = layer.config
    cross = c.kdim != c.d_model or c.vdim != c.d_model
    query = torch.randn(batch, q_len, c.d_model, dtype=dtype)
    if not cross:
        return query, None, None
    k_len = k_len or q_len + 2
    return query, torch.randn(batch, k_len, c.kdim, dtype=dtype), torch.randn(batch, k_len, c.vdim, dtype=dtype)


@pytest.mark.parametrize("name", CONFIGS)
def test_fast_path_matches_float64_reference(name):
    layer = _layer(CONFIGS[name])
    query, key, value = _inputs(layer)
    expected, _, _ = layer_reference(layer, query, key, value)
    torch.testing.assert_close(layer(query, key, value), expected, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", CONFIGS)
def test_patterns_and_result_match_reference(name):
    layer = _layer(CONFIGS[name])
    query, key, value = _inputs(layer)
    out = layer(query, key, value, return_pattern=True, return_result=True)
    expected, patterns, result = layer_reference(layer, query, key, value)
    assert isinstance(out, AttentionOutput)
    torch.testing.assert_close(out.output, expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out.pattern, patterns, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out.result, result, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", ["standard", "grouped-query", "causal, custom scale"])
def test_masks_match_reference(name):
    layer = _layer(CONFIGS[name])
    c = layer.config
    batch, L = 3, 6
    query = torch.randn(batch, L, c.d_model, dtype=torch.float64)
    kpm = torch.zeros(batch, L, dtype=torch.bool)
    kpm[0, 4:] = True
    kpm[2, :] = True  # a sequence of padding only: every row sees no key
    attn_mask = torch.randn(batch * c.n_heads, L, L, dtype=torch.float64)
    attn_mask[1, 2, :] = float("-inf")  # one row of one head sees no key
    out = layer(query, key_padding_mask=kpm, attn_mask=attn_mask, return_pattern=True, return_result=True)
    expected, patterns, result = layer_reference(layer, query, key_padding_mask=kpm, attn_mask=attn_mask)
    torch.testing.assert_close(out.output, expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out.pattern, patterns, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out.result, result, atol=1e-10, rtol=1e-10)
    assert (out.pattern[2] == 0).all() and (out.result[2] == 0).all()
    fast = layer(query, key_padding_mask=kpm, attn_mask=attn_mask)
    torch.testing.assert_close(fast, expected, atol=1e-10, rtol=1e-10)


def test_is_causal_overrides_config():
    layer = _layer(dict(d_model=16, n_heads=2))
    query, _, _ = _inputs(layer, q_len=6)
    causal = layer(query, is_causal=True)
    torch.testing.assert_close(causal, layer_reference(layer, query, causal=True)[0], atol=1e-10, rtol=1e-10)
    assert not torch.allclose(causal, layer(query))
    causal_layer = _layer(dict(d_model=16, n_heads=2, causal=True))
    causal_layer.load_state_dict(layer.state_dict())
    torch.testing.assert_close(causal_layer(query), causal)
    torch.testing.assert_close(causal_layer(query, is_causal=False), layer(query))


def test_causal_cross_attention_aligns_queries_to_the_end_of_the_keys():
    layer = _layer(dict(d_model=16, n_heads=2, kdim=16, vdim=16, causal=True))
    query = torch.randn(2, 3, 16, dtype=torch.float64)
    memory = torch.randn(2, 7, 16, dtype=torch.float64)
    out = layer(query, memory, memory, return_pattern=True)
    # query i sits at key position 7 - 3 + i: it sees keys 0 .. 4 + i
    assert (out.pattern[..., 0, 5:] == 0).all() and (out.pattern[..., 0, :5] > 0).all()
    torch.testing.assert_close(out.output, layer_reference(layer, query, memory, memory)[0], atol=1e-10, rtol=1e-10)


def test_more_queries_than_keys_causal_rows_without_keys_are_zero():
    layer = _layer(dict(d_model=8, n_heads=2, causal=True))
    query = torch.randn(1, 5, 8, dtype=torch.float64)
    memory = torch.randn(1, 3, 8, dtype=torch.float64)
    out = layer(query, memory, memory, return_pattern=True, return_result=True)
    assert (out.pattern[:, :, :2] == 0).all() and (out.result[:, :, :2] == 0).all()
    torch.testing.assert_close(out.output, layer_reference(layer, query, memory, memory)[0], atol=1e-10, rtol=1e-10)
    assert torch.isfinite(layer(query, memory, memory)).all()


@pytest.mark.parametrize("heads", [[2], [3, 0], [1, 1, 5], [7, 6, 5, 4, 3, 2, 1, 0]])
def test_pattern_subset_equals_slice_of_all_patterns(heads):
    layer = _layer(CONFIGS["grouped-query"])
    query, _, _ = _inputs(layer, q_len=7)
    kpm = torch.zeros(2, 7, dtype=torch.bool)
    kpm[1, 5:] = True
    everything = layer(query, key_padding_mask=kpm, is_causal=True, return_pattern=True, return_result=True)
    subset = layer(query, key_padding_mask=kpm, is_causal=True, return_pattern=heads, return_result=heads)
    torch.testing.assert_close(subset.pattern, everything.pattern[:, heads], atol=1e-12, rtol=0)
    torch.testing.assert_close(subset.result, everything.result[:, heads], atol=1e-12, rtol=0)
    torch.testing.assert_close(subset.output, everything.output, atol=1e-12, rtol=0)


def test_plain_call_returns_tensor_and_only_asked_parts_are_filled():
    layer = _layer(CONFIGS["standard"])
    query, _, _ = _inputs(layer)
    assert isinstance(layer(query), torch.Tensor)
    only_patterns = layer(query, return_pattern=[1])
    assert only_patterns.result is None and only_patterns.pattern.shape == (2, 1, 5, 5)
    only_outputs = layer(query, return_result=True)
    assert only_outputs.pattern is None and only_outputs.result.shape == (2, 4, 5, 32)


def test_result_sum_to_output():
    layer = _layer(CONFIGS["d_head independent"], dtype=torch.float32)
    query, _, _ = _inputs(layer, dtype=torch.float32)
    out = layer(query, return_result=True)
    torch.testing.assert_close(out.result.sum(dim=1) + layer.b_O, out.output, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", ["per-head", "per-example"])
def test_head_mask_matches_reference_and_removes_heads(shape):
    layer = _layer(CONFIGS["grouped-query"])
    query, _, _ = _inputs(layer)
    gate = torch.tensor([1.0, 0.0, 0.5, 1.0, 2.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    if shape == "per-example":
        gate = torch.stack([gate, gate.flip(0)])
    out = layer(query, head_mask=gate, return_result=True)
    expected, _, result = layer_reference(layer, query, head_mask=gate)
    torch.testing.assert_close(out.output, expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(out.result, result, atol=1e-10, rtol=1e-10)
    ungated = layer(query, return_result=True).result
    removed = (gate == 0).expand(2, -1) if gate.dim() == 1 else gate == 0
    assert (out.result[removed] == 0).all() and ungated[removed].abs().sum() > 0


def test_head_mask_gradient_is_each_heads_contribution():
    """d(sum of output)/d(gate_h) at gate = 1 is the sum of head h's contribution (Michel et al. 2019)."""
    layer = _layer(CONFIGS["standard"])
    query, _, _ = _inputs(layer)
    gate = torch.ones(4, dtype=torch.float64, requires_grad=True)
    layer(query, head_mask=gate).sum().backward()
    result = layer(query, return_result=True).result
    torch.testing.assert_close(gate.grad, result.sum(dim=(0, 2, 3)), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("name", ["standard", "grouped-query", "rotary", "cross-attention"])
@pytest.mark.parametrize("explicit", [False, True], ids=["fast", "explicit"])
def test_input_gradients_match_reference(name, explicit):
    layer = _layer(CONFIGS[name])
    query, key, value = _inputs(layer)
    kpm = torch.zeros(2, query.shape[1] if key is None else key.shape[1], dtype=torch.bool)
    kpm[0, -1] = True
    inputs = [x.requires_grad_(True) for x in (query, key, value) if x is not None]
    weight = torch.randn(2, query.shape[1], layer.config.d_model, dtype=torch.float64)

    out = layer(query, key, value, key_padding_mask=kpm, return_pattern=explicit)
    out = out.output if explicit else out
    grads = torch.autograd.grad((out * weight).sum(), inputs)
    expected = layer_reference(layer, query, key, value, key_padding_mask=kpm)[0]  # weights detached inside
    ref_grads = torch.autograd.grad((expected * weight).sum(), inputs)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)


def test_parameter_gradients_pass_gradcheck():
    layer = _layer(dict(d_model=8, n_heads=2, n_kv_heads=1, rotary=True, causal=True))
    query = torch.randn(2, 4, 8, dtype=torch.float64)
    kpm = torch.tensor([[False, False, True, False], [True, True, True, True]])
    params = dict(layer.named_parameters())

    def fn(*flat):
        out = torch.func.functional_call(layer, dict(zip(params, flat)), (query,), {"key_padding_mask": kpm})
        return out

    assert torch.autograd.gradcheck(fn, tuple(p.detach().clone().requires_grad_() for p in params.values()))


def test_no_nan_gradient_through_rows_without_keys():
    layer = _layer(CONFIGS["standard"])
    query = torch.randn(2, 5, 32, dtype=torch.float64, requires_grad=True)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True
    for explicit in (False, True):
        out = layer(query, key_padding_mask=kpm, return_pattern=explicit)
        out = out.output if explicit else out
        grads = torch.autograd.grad(out.sum(), [query, *layer.parameters()])
        assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_dtypes_track_float64(device, dtype):
    layer64 = _layer(CONFIGS["grouped-query"])
    layer = _layer(CONFIGS["grouped-query"]).to(device=device, dtype=dtype)
    layer.load_state_dict(layer64.state_dict())
    query = torch.randn(2, 9, 32, dtype=torch.float64)
    kpm = torch.zeros(2, 9, dtype=torch.bool, device=device)
    kpm[0, 7:] = True
    want = layer64(query, key_padding_mask=kpm.cpu(), return_pattern=[0, 5])
    got = layer(query.to(device, dtype), key_padding_mask=kpm, return_pattern=[0, 5])
    tol = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 5e-3}[dtype]
    assert got.output.dtype == dtype and got.pattern.dtype == dtype
    torch.testing.assert_close(got.output.double().cpu(), want.output, atol=tol * 4, rtol=tol)
    torch.testing.assert_close(got.pattern.double().cpu(), want.pattern, atol=tol, rtol=tol)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("masked", [False, True])
def test_grouped_heads_on_cuda_are_read_by_the_kernel_only_where_flash_serves(masked, monkeypatch):
    # Unmasked, the flash kernel (sm80 and up) reads each key/value head for its group; with a mask
    # torch would fall back to the math path with enable_gqa, so the heads are expanded for the efficient kernel.
    import headlab.layer.functional as functional

    seen: list[bool] = []
    sdpa = functional.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("enable_gqa", False))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(functional.F, "scaled_dot_product_attention", spy)
    config = dict(d_model=256, n_heads=8, n_kv_heads=2, causal=True)
    layer64 = _layer(config)
    layer = _layer(config).to("cuda", torch.bfloat16)
    layer.load_state_dict(layer64.state_dict())
    query = torch.randn(2, 33, 256, dtype=torch.float64)
    kpm = torch.zeros(2, 33, dtype=torch.bool)
    kpm[1, 30:] = True
    kpm = kpm if masked else None
    want = layer64(query, key_padding_mask=kpm)
    seen.clear()  # the float64 reference ran on the CPU
    got = layer(query.to("cuda", torch.bfloat16), key_padding_mask=None if kpm is None else kpm.cuda())
    assert seen == [not masked and torch.cuda.get_device_capability() >= (8, 0)]
    torch.testing.assert_close(got.double().cpu(), want, atol=0.2, rtol=5e-2)


def test_dropout_only_in_training_and_patterns_are_pre_dropout():
    layer = _layer(dict(d_model=16, n_heads=2, dropout=0.5))
    query, _, _ = _inputs(layer, q_len=8)
    layer.eval()
    torch.testing.assert_close(layer(query), layer(query))
    torch.testing.assert_close(layer(query), layer_reference(layer, query)[0], atol=1e-10, rtol=1e-10)
    layer.train()
    assert not torch.allclose(layer(query), layer(query))
    out = layer(query, return_pattern=True)
    torch.testing.assert_close(out.pattern.sum(-1), torch.ones(2, 2, 8, dtype=torch.float64))
    torch.testing.assert_close(out.pattern, layer_reference(layer, query)[1], atol=1e-10, rtol=1e-10)


def test_parameter_count_independent_of_heads_for_wide():
    """Why does the parameter count not change with the number of heads? The wide layer's parameters do not
    depend on it."""
    counts = {h: sum(p.numel() for p in MultiHeadAttention(AttentionConfig(d_model=64, n_heads=h)).parameters())
              for h in (1, 2, 4, 8, 16)}
    assert len(set(counts.values())) == 1 and counts[1] == 4 * 64 * 64 + 4 * 64


def test_repr_names_the_config():
    text = repr(MultiHeadAttention(AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2)))
    assert "n_heads=4" in text and "n_kv_heads=2" in text and "wide" in text


def test_head_indices_may_be_numpy_or_tensor_ints():
    import numpy as np

    layer = _layer(CONFIGS["standard"])
    query, _, _ = _inputs(layer)
    want = layer(query, return_pattern=[1, 3]).pattern
    torch.testing.assert_close(layer(query, return_pattern=np.array([1, 3])).pattern, want)
    torch.testing.assert_close(layer(query, return_pattern=torch.tensor([1, 3])).pattern, want)
    torch.testing.assert_close(layer(query, return_pattern=(np.int64(1), 3)).pattern, want)


@pytest.mark.parametrize("kv_head_of", [(0, 0, 0, 1), (1, 0, 1, 1), (2, 0, 1, 2)])
def test_uneven_key_value_groups_match_reference(kv_head_of):
    n_kv = max(kv_head_of) + 1
    layer = _layer(dict(d_model=16, n_heads=4, d_head=4, n_kv_heads=n_kv, kv_head_of=kv_head_of, causal=True))
    assert not layer.config.uniform_groups
    query, _, _ = _inputs(layer, q_len=6)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, :2] = True
    out = layer(query, key_padding_mask=kpm, return_pattern=True, return_result=True)
    expected, patterns, result = layer_reference(layer, query, key_padding_mask=kpm)
    _ = [torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
         for a, b in ((out.output, expected), (out.pattern, patterns), (out.result, result))]
    torch.testing.assert_close(layer(query, key_padding_mask=kpm), expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(layer(query, key_padding_mask=kpm, return_pattern=[3, 1]).pattern,
                               patterns[:, [3, 1]], atol=1e-10, rtol=1e-10)
    for h, kv in enumerate(kv_head_of):
        torch.testing.assert_close(layer.QK[h].AB, layer.W_Q[h] @ layer.W_K[kv].T)


def test_return_z_is_what_the_output_projection_receives():
    layer = _layer(CONFIGS["grouped-query"])
    query, _, _ = _inputs(layer)
    gate = torch.linspace(0, 2, 8, dtype=torch.float64)
    out = layer(query, head_mask=gate, return_z=True, return_result=[2])
    assert out.z.shape == (2, 8, 5, 4) and out.pattern is None
    torch.testing.assert_close(out.result[:, 0], out.z[:, 2] @ layer.W_O[2])
    merged = out.z.transpose(1, 2).reshape(2, 5, 32)
    torch.testing.assert_close(layer.projection.out_proj(merged), out.output)
    torch.testing.assert_close(layer(query, head_mask=gate, return_z=[5, 2]).z, out.z[:, [5, 2]])


def test_precomputed_rotary_angles_equal_the_layers_own():
    layer = _layer(CONFIGS["partial rotary, GQA"])
    query = torch.randn(2, 7, 48, dtype=torch.float64)
    rotary_dim, base = layer.config.rotary_dim, layer.config.rotary_base
    pos = torch.arange(7, dtype=torch.float64)
    angles = torch.outer(pos, base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    torch.testing.assert_close(layer(query, rotary_cos_sin=(cos[None], sin[None])), layer(query))
    # per-example positions: example 1 at positions 3..9 (a uniform shift: RoPE sees only relative
    # positions, so nothing changes), and at positions with a gap (relative positions change)
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)

    def cos_sin(positions):
        angles = torch.outer(positions.double(), inv_freq)
        return angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)

    for positions, same in ((pos + 3, True), (torch.tensor([0, 1, 2, 10, 11, 12, 13]), False)):
        (c0, s0), (c1, s1) = cos_sin(pos), cos_sin(positions)
        both = layer(query, rotary_cos_sin=(torch.stack([c0, c1]), torch.stack([s0, s1])))
        torch.testing.assert_close(both[0], layer(query[:1])[0])
        assert torch.allclose(both[1], layer(query[1:])[0]) is same
    with pytest.raises(ValueError, match="rotary_cos_sin has shapes"):
        layer(query, rotary_cos_sin=(cos[:3][None], sin[:3][None]))
    with pytest.raises(ValueError, match="needs a rotary layer"):
        _layer(CONFIGS["standard"])(torch.randn(1, 7, 32, dtype=torch.float64), rotary_cos_sin=(cos, sin))


def test_head_affine_replaces_z_persistently_and_is_saved():
    layer = _layer(CONFIGS["standard"])
    query, _, _ = _inputs(layer)
    plain = layer(query, return_z=True)
    scale = torch.tensor([1.0, 0.0, 2.0, 1.0], dtype=torch.float64)
    shift = torch.zeros(4, 8, dtype=torch.float64)
    shift[1] = torch.arange(8.0)
    layer.set_head_affine(scale, shift)
    out = layer(query, return_z=True, return_result=True)
    torch.testing.assert_close(out.z, plain.z * scale[None, :, None, None] + shift[None, :, None, :])
    torch.testing.assert_close(out.result.sum(1) + layer.b_O, out.output)
    state = layer.state_dict()
    assert torch.equal(state["head_scale"], scale) and torch.equal(state["head_shift"], shift)
    fresh = _layer(CONFIGS["standard"])  # never touched: its state has the identity affine
    assert torch.equal(fresh.state_dict()["head_scale"], torch.ones(4, dtype=torch.float64))
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh(query), out.output)
    layer.load_state_dict(fresh.state_dict() | {"head_scale": torch.ones(4, dtype=torch.float64),
                                                "head_shift": torch.zeros(4, 8, dtype=torch.float64)})
    torch.testing.assert_close(layer(query), plain.output)  # loading the identity switches the affine off
    layer.set_head_affine(scale, shift)
    layer.set_head_affine(None, None)
    torch.testing.assert_close(layer(query), plain.output)
    with pytest.raises(ValueError, match=r"shift has shape \(4, 7\)"):
        layer.set_head_affine(None, torch.zeros(4, 7, dtype=torch.float64))
    with pytest.raises(TypeError, match="scale must be a floating"):
        layer.set_head_affine(torch.ones(4, dtype=torch.long))


@pytest.mark.parametrize("kv_head_of", [(0, 0, 1), (0, 1, 1, 2), (0, 0, 0, 0), (0, -1, 1, 1), "0011"])
def test_bad_kv_head_of_is_named(kv_head_of):
    with pytest.raises(ValueError, match="kv_head_of="):
        AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, kv_head_of=kv_head_of)


def test_a_state_loads_across_head_counts_as_torchs_does_unless_a_gate_names_heads():
    # The question "8 heads, same parameters?": one layer's weights load into a layer of another head count (as
    # torch.nn.MultiheadAttention's do); its identity gates load as the identity, a set one is refused.
    one, eight = (MultiHeadAttention(AttentionConfig(d_model=64, n_heads=n)) for n in (1, 8))
    eight.load_state_dict(one.state_dict())
    assert eight.head_scale.shape == (8,) and eight.head_shift.shape == (8, 8)
    torch_one, torch_eight = (torch.nn.MultiheadAttention(64, n, batch_first=True) for n in (1, 8))
    torch_eight.load_state_dict(torch_one.state_dict())  # what headlab's layer now does too
    query = torch.randn(2, 5, 64)
    torch.testing.assert_close(eight.projection.out_proj(torch.zeros(1, 64)), one.projection.out_proj(
        torch.zeros(1, 64)))
    assert not torch.allclose(eight(query), one(query))  # the same weights, other heads: another function
    one.set_head_affine(torch.tensor([0.5]))
    with pytest.raises(ValueError, match=r"set on 1 heads of 64 value features, and this layer has 8 heads of 8"):
        eight.load_state_dict(one.state_dict())
