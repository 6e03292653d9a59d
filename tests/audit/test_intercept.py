"""The interceptor sees softmax, scaled_dot_product_attention and MultiheadAttention, and changes nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from headlab.audit.errors import AuditError
from headlab.audit.intercept import AttentionInterceptor, Override, from_canonical, to_canonical


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


@pytest.mark.parametrize("options", [
    {}, {"is_causal": True}, {"scale": 0.3}, {"attn_mask": "bool"}, {"attn_mask": "float"}, {"enable_gqa": True},
])
def test_sdpa_in_explicit_math_equals_torch(options: dict) -> None:
    q, k, v = _randn(2, 4, 5, 8), _randn(2, 4 if "enable_gqa" not in options else 2, 7, 8), None
    v = _randn(*k.shape[:-1], 6)
    kwargs = dict(options)
    if kwargs.get("attn_mask") == "bool":
        kwargs["attn_mask"] = torch.rand(5, 7) > 0.3
        kwargs["attn_mask"][:, 0] = True  # every query sees a key
    elif kwargs.get("attn_mask") == "float":
        kwargs["attn_mask"] = _randn(2, 1, 5, 7)
    expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
    with AttentionInterceptor() as seen:
        got = F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    (call,) = seen.calls
    assert call.source == "torch.nn.functional.scaled_dot_product_attention"
    assert call.canonical_pattern().shape == (8, 5, 7) and call.q_width == 8
    assert call.kv_heads == k.shape[1]
    torch.testing.assert_close(call.z, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("options", [
    dict(batch_first=True), dict(batch_first=False), dict(batch_first=True, kdim=12, vdim=10),
    dict(batch_first=True, bias=False), dict(batch_first=True, masks="bool"), dict(batch_first=False, masks="float"),
])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
def test_multihead_attention_decomposed_equals_torch(options: dict, need_weights: bool, average: bool) -> None:
    opts = dict(options)
    masks = opts.pop("masks", False)
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(16, 4, **opts).double().eval()
    with torch.no_grad():
        for name, p in mha.named_parameters():
            if "bias" in name:
                p.normal_()
    kdim, vdim = opts.get("kdim", 16), opts.get("vdim", 16)
    q, k, v = _randn(2, 5, 16), _randn(2, 7, kdim), _randn(2, 7, vdim)
    if not opts["batch_first"]:
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    kwargs = dict(need_weights=need_weights, average_attn_weights=average)
    if masks == "bool":
        kwargs["key_padding_mask"] = torch.tensor([[False] * 6 + [True], [False] * 7])
        kwargs["attn_mask"] = torch.rand(8, 5, 7) > 0.7  # (batch·heads, query, key), True = not allowed
        kwargs["attn_mask"][..., 0] = False
    elif masks == "float":
        kwargs["key_padding_mask"] = _randn(2, 7)
        kwargs["attn_mask"] = _randn(5, 7)  # (query, key), added to the scores
    with torch.no_grad():
        expected = mha(q, k, v, **kwargs)
        with AttentionInterceptor() as seen:
            got = mha(q, k, v, **kwargs)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=1e-12)
    if need_weights:
        torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-12)
    else:
        assert got[1] is None
    (call,) = seen.calls
    assert call.source == "torch.nn.functional.multi_head_attention_forward"
    assert call.canonical_pattern().shape == (8, 5, 7)


def test_extra_key_value_positions_are_refused() -> None:
    mha = torch.nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True).eval()
    x = torch.randn(1, 3, 8)
    with pytest.raises(AuditError, match="add_bias_kv") as info, AttentionInterceptor():
        mha(x, x, x)
    assert info.value.kind == "unsupported"


@pytest.mark.parametrize("softmax", [
    lambda s: torch.softmax(s, dim=-1), lambda s: F.softmax(s, dim=-1), lambda s: s.softmax(-1),
    lambda s: torch.special.softmax(s, -1),
])
@pytest.mark.parametrize("consume", [
    lambda p, v: p @ v, lambda p, v: torch.matmul(F.dropout(p, 0.5, training=False), v),
    lambda p, v: torch.einsum("hqk,hkd->qhd", [p, v]), lambda p, v: torch.bmm(p, v),
])
def test_softmax_calls_are_recorded_with_their_consumer(softmax, consume) -> None:
    scores, v = _randn(3, 4, 4), _randn(3, 4, 5)
    with AttentionInterceptor() as seen:
        z = consume(softmax(scores), v)
    (call,) = seen.calls
    torch.testing.assert_close(call.scores, scores)
    torch.testing.assert_close(call.pattern, torch.softmax(scores, dim=-1))
    assert call.key_axis == 2 and call.query_axis is None  # a softmax does not say which axis holds the queries
    assert call.z is not None and torch.equal(call.z, z)


def test_an_override_replaces_the_pattern_in_the_modules_own_layout() -> None:
    scores, v = _randn(1, 5, 2, 5), _randn(1, 2, 5, 3)  # (batch, query, head, key): an unusual layout

    def forward() -> torch.Tensor:
        return torch.einsum("bqhk,bhkd->bhqd", torch.softmax(scores, dim=-1), v)

    def one_hot_on_key_2(p: torch.Tensor, first_head: int) -> torch.Tensor:
        out = torch.zeros_like(p)
        out[..., 2] = 1.0
        return out

    with AttentionInterceptor(override=Override({0: 1}, one_hot_on_key_2)) as seen:
        z = forward()
    torch.testing.assert_close(z, v[:, :, 2:3].expand(1, 2, 5, 3))  # every query reads key 2 only
    assert seen.calls[0].canonical_pattern(1)[:, :, 2].eq(1).all()
    untouched = forward()
    with AttentionInterceptor(override=Override({1: 1}, one_hot_on_key_2)):  # no second call: no change
        z = forward()
    torch.testing.assert_close(z, untouched, rtol=0, atol=0)


def test_canonical_round_trip() -> None:
    t = _randn(2, 5, 3, 7)  # (batch, query, head, key)
    c = to_canonical(t, 1, 3)
    assert c.shape == (6, 5, 7)
    torch.testing.assert_close(c[1], t[0, :, 1, :])
    assert torch.equal(from_canonical(c, t.shape, 1, 3), t)


def test_non_attention_softmax_calls_pass_through() -> None:
    x = _randn(6)
    with AttentionInterceptor() as seen:
        out = torch.softmax(x, dim=0)
    assert seen.calls == [] and torch.equal(out, torch.softmax(x, dim=0))
