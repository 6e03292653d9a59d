"""Property tests of MultiHeadAttention against the float64 per-head reference.

Hypothesis draws a whole call: sizes (n_heads, n_kv_heads dividing it, d_head, d_head_v,
d_model, kdim/vdim), options (bias, causal, rotary, scale), inputs (self-attention, cross-
attention with d_model-wide keys or with separate kdim/vdim weights) and masks (none, bool or
float key padding, 2-D/3-D/4-D bool or float attention masks, rows with no allowed key). The
layer runs in float64, so the fast (SDPA) path, the explicit path and the reference must agree
to 1e-10. Sizes stay tiny (d_head ≤ 8, heads ≤ 4, lengths ≤ 6) to keep the file fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch import Tensor

from headlab.layer import AttentionConfig, MultiHeadAttention
from tests.support.reference import layer_reference

ATOL = 1e-10



@dataclass
class Call:
    """One drawn call: the layer, its inputs and masks, and what the reference needs."""

    layer: MultiHeadAttention
    query: Tensor
    key: Tensor | None
    value: Tensor | None
    masks: dict[str, Tensor | bool | None] = field(default_factory=dict)  # forward's mask keywords
    causal: bool = False  # the effective causal flag, for the reference

    @property
    def n_heads(self) -> int:
        return self.layer.config.n_heads

    def __call__(self, **kwargs):
        return self.layer(self.query, self.key, self.value, **self.masks, **kwargs)

    def reference(self, **kwargs) -> tuple[Tensor, Tensor, Tensor]:
        masks = {k: v for k, v in self.masks.items() if k != "is_causal"}
        return layer_reference(self.layer, self.query, self.key, self.value, causal=self.causal, **masks, **kwargs)

    def inputs(self) -> list[Tensor]:
        return [x for x in (self.query, self.key, self.value) if x is not None]


def _randn(g: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(shape, generator=g, dtype=torch.float64)


def _mask(draw, g: torch.Generator, kind: str, shape: tuple[int, ...]) -> Tensor:
    """A bool (True = not allowed) or float (additive, some -inf) mask of ``shape``."""
    p = draw(st.sampled_from([0.2, 0.5, 0.9]))
    blocked = torch.rand(shape, generator=g) < p
    if kind == "bool":
        return blocked
    return _randn(g, *shape).masked_fill(blocked, float("-inf"))


@st.composite
def calls(draw, *, force_dead_row: bool = False) -> Call:
    # (n_heads, n_kv_heads): standard, multi-query and grouped-query, grouped weighted up.
    pairs = [(1, 1), (2, 2), (3, 3), (4, 4), (2, 1), (3, 1), (4, 1), (4, 2), (4, 2)]
    n_heads, n_kv_heads = draw(st.sampled_from(pairs))
    projection = draw(st.sampled_from(["wide", "wide", "narrow", "shared", "bilinear", "collaborative"]))
    if projection != "wide":  # only the standard layer groups key/value heads
        n_kv_heads = n_heads
    sliced = projection in ("narrow", "shared")  # n_heads must divide every input width

    def width(low: int, high: int) -> int:
        return n_heads * draw(st.integers(1, 3)) if sliced else draw(st.integers(low, high))

    d_head = draw(st.integers(1, 8))
    mode = draw(st.sampled_from(["self", "self-explicit", "cross", "cross-dims"]))
    rotary = d_head >= 2 and projection != "bilinear" and draw(st.booleans())
    config = AttentionConfig(
        d_model=width(1, 12),
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_head=d_head,
        d_head_v=draw(st.none() | st.integers(1, 8)),
        kdim=width(1, 9) if mode == "cross-dims" else None,
        vdim=width(1, 9) if mode == "cross-dims" else None,
        projection=projection,
        talking_heads=draw(st.booleans()),
        bias=draw(st.booleans()),
        causal=draw(st.booleans()),
        rotary=rotary,
        rotary_dim=2 * draw(st.integers(1, d_head // 2)) if rotary else None,
        rotary_base=draw(st.sampled_from([10000.0, 10.0, 1.5])),
        scale=draw(st.none() | st.floats(0.1, 2.0)),
    )
    c = config
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    layer = MultiHeadAttention(config).double().eval()
    with torch.no_grad():  # random biases too (they start at zero), so they are exercised
        for p in layer.parameters():
            p.copy_(0.5 * _randn(g, *p.shape))

    batch, q_len = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    k_len = q_len if mode.startswith("self") else draw(st.integers(1, 6))
    query = _randn(g, batch, q_len, c.d_model)
    key = value = None
    if mode == "self-explicit":  # same values, but not the same object: the unfused path
        key = query.clone()
    elif mode == "cross":
        key = _randn(g, batch, k_len, c.d_model)
        value = draw(st.sampled_from([None, "separate"])) and _randn(g, batch, k_len, c.d_model)
    elif mode == "cross-dims":
        key, value = _randn(g, batch, k_len, c.kdim), _randn(g, batch, k_len, c.vdim)

    masks: dict = {}
    kpm_kind = draw(st.sampled_from([None, "bool", "float"]))
    if kpm_kind:
        masks["key_padding_mask"] = _mask(draw, g, kpm_kind, (batch, k_len))
    attn_kind = draw(st.sampled_from([None, "2d", "3d", "4d"]))
    if attn_kind:
        shape = {
            "2d": (q_len, k_len),
            "3d": (batch * n_heads, q_len, k_len),
            "4d": (draw(st.sampled_from([1, batch])), draw(st.sampled_from([1, n_heads])), q_len, k_len),
        }[attn_kind]
        masks["attn_mask"] = _mask(draw, g, draw(st.sampled_from(["bool", "float"])), shape)
    if force_dead_row:
        _kill_a_row(draw, masks, batch, q_len, k_len)
    is_causal = draw(st.sampled_from([None, True, False]))
    masks["is_causal"] = is_causal
    causal = c.causal if is_causal is None else is_causal
    return Call(layer, query, key, value, masks, causal)


def _kill_a_row(draw, masks: dict, batch: int, q_len: int, k_len: int) -> None:
    """Make sure some query row sees no key, through the padding mask or the attention mask."""
    if draw(st.booleans()):
        kpm = masks.get("key_padding_mask")
        if kpm is None:
            kpm = masks["key_padding_mask"] = torch.zeros(batch, k_len, dtype=torch.bool)
        kpm[draw(st.integers(0, batch - 1))] = True if kpm.dtype == torch.bool else float("-inf")
    else:
        attn = masks.get("attn_mask")
        if attn is None:
            attn = masks["attn_mask"] = torch.zeros(q_len, k_len, dtype=torch.bool)
        row = draw(st.integers(0, q_len - 1))
        attn[..., row, :] = True if attn.dtype == torch.bool else float("-inf")


def _dead_rows(ref_patterns: Tensor) -> Tensor:
    """(batch, head, query_pos) True where the reference left the row empty (no allowed key)."""
    return ref_patterns.sum(dim=-1) == 0


def _assert_close(actual: Tensor, expected: Tensor, atol: float = ATOL) -> None:
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


# --- parity with the reference -------------------------------------------------------------


@given(call=calls())
def test_fast_output_matches_reference(call):
    out = call()
    ref_out, _, _ = call.reference()
    assert isinstance(out, Tensor) and out.dtype == torch.float64
    _assert_close(out, ref_out)


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])  # no-grad: in-place softmax
@given(call=calls())
def test_patterns_and_result_match_reference(call, grad):
    with torch.set_grad_enabled(grad):
        result = call(return_pattern=True, return_result=True)
    ref_out, ref_patterns, ref_result = call.reference()
    _assert_close(result.pattern, ref_patterns)
    _assert_close(result.result, ref_result)
    _assert_close(result.output, ref_out)


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
@given(call=calls(), data=st.data())
def test_patterns_of_some_heads_are_slices_of_all(call, data, grad):
    heads = data.draw(st.lists(st.integers(0, call.n_heads - 1), min_size=1, max_size=6), label="heads")
    with torch.set_grad_enabled(grad):
        every = call(return_pattern=True, return_result=True)
        some = call(return_pattern=heads, return_result=heads)
    assert some.pattern.shape == (call.query.shape[0], len(heads), *every.pattern.shape[2:])
    _assert_close(some.pattern, every.pattern[:, heads])
    _assert_close(some.result, every.result[:, heads])
    _assert_close(some.output, every.output)


@given(call=calls())
def test_result_sum_to_output(call):
    result = call(return_result=True)
    assert result.pattern is None
    b_O = call.layer.b_O
    total = result.result.sum(dim=1) + (0 if b_O is None else b_O)
    _assert_close(total, result.output)
    _assert_close(result.output, call())


# --- masking invariants ----------------------------------------------------------------------


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no-grad"])
@given(call=calls(force_dead_row=True))
def test_pattern_rows_sum_to_one_or_zero(call, grad):
    # Talking heads return weights mixed across heads after the softmax: no longer a distribution.
    assume(not call.layer.config.talking_heads)
    with torch.set_grad_enabled(grad):
        patterns = call(return_pattern=True).pattern
    _, ref_patterns, _ = call.reference()
    dead = _dead_rows(ref_patterns)
    sums = patterns.sum(dim=-1)
    assert (patterns >= 0).all()
    assert (sums[dead] == 0).all()
    _assert_close(sums[~dead], torch.ones_like(sums[~dead]))


def _grads(call: Call, inputs: list[Tensor]) -> list[Tensor]:
    return [x.grad for x in inputs] + [p.grad for p in call.layer.parameters()]


@pytest.mark.parametrize(
    "returns",
    [
        pytest.param({}, id="fast"),
        pytest.param({"return_pattern": True, "return_result": True}, id="explicit"),
        pytest.param({"return_pattern": [0], "return_result": [0]}, id="one-head"),
    ],
)
@given(call=calls(force_dead_row=True))
def test_rows_with_no_key_are_zero_and_never_nan(call, returns):
    _, ref_patterns, _ = call.reference()
    dead = _dead_rows(ref_patterns)
    assert dead.any()  # the strategy really produced a row with no allowed key
    inputs = [x.requires_grad_() for x in call.inputs()]
    call.layer.zero_grad(set_to_none=True)

    result = call(**returns)
    out = result if isinstance(result, Tensor) else result.output
    loss = out.sum()
    assert torch.isfinite(out).all()
    if not isinstance(result, Tensor):
        heads = list(range(call.n_heads)) if returns["return_pattern"] is True else returns["return_pattern"]
        assert torch.isfinite(result.pattern).all() and torch.isfinite(result.result).all()
        assert (result.pattern[dead[:, heads]] == 0).all()  # the whole key row is zero
        assert (result.result[dead[:, heads]] == 0).all()
        loss = loss + result.pattern.sum() + result.result.sum()
    loss.backward()
    for grad in _grads(call, inputs):
        assert grad is not None and torch.isfinite(grad).all()


@given(call=calls(force_dead_row=True))
def test_rows_dead_in_every_head_output_only_the_bias(call):
    _, ref_patterns, _ = call.reference()
    all_dead = _dead_rows(ref_patterns).all(dim=1)  # (batch, query_pos)
    out = call()
    b_O = call.layer.b_O
    expected = torch.zeros_like(out[all_dead]) + (0 if b_O is None else b_O.detach())
    assert torch.equal(out[all_dead], expected)


# --- head_mask ----------------------------------------------------------------------------


@given(call=calls(), data=st.data())
def test_head_mask_zero_removes_that_heads_contribution(call, data):
    h = data.draw(st.integers(0, call.n_heads - 1), label="head")
    full = call(return_result=True)
    gate = torch.ones(call.n_heads, dtype=torch.float64)
    gate[h] = 0.0
    gated = call(head_mask=gate, return_result=True)
    _assert_close(gated.output, full.output - full.result[:, h])
    assert (gated.result[:, h] == 0).all()
    others = [i for i in range(call.n_heads) if i != h]
    _assert_close(gated.result[:, others], full.result[:, others])


@given(call=calls(), data=st.data())
def test_head_mask_per_batch_gates_match_reference(call, data):
    batch = call.query.shape[0]
    values = data.draw(
        st.lists(st.floats(-2, 2), min_size=batch * call.n_heads, max_size=batch * call.n_heads), label="gates"
    )
    gates = torch.tensor(values, dtype=torch.float64).view(batch, call.n_heads)
    result = call(head_mask=gates, return_pattern=True, return_result=True)
    ref_out, ref_patterns, ref_result = call.reference(head_mask=gates)
    _assert_close(result.output, ref_out)
    _assert_close(result.result, ref_result)
    _assert_close(result.pattern, ref_patterns)  # gating acts after the softmax
    _assert_close(call(head_mask=gates), ref_out)


@given(call=calls())
def test_head_mask_gradient_is_each_heads_total_contribution(call):
    # d(sum of output)/d(gate_h) = sum of head h's ungated contribution.
    gate = torch.ones(call.n_heads, dtype=torch.float64, requires_grad=True)
    call(head_mask=gate).sum().backward()
    result = call(return_result=True).result.detach()
    _assert_close(gate.grad, result.sum(dim=(0, 2, 3)), atol=1e-9)


# --- the causal mask alone, patterns of some heads (a fixed bug) ---------------------------------


def test_causal_only_patterns_of_one_head_when_query_len_equals_n_heads():
    # is_causal kernel path: bias (3, 3); with n_heads = 3 head_patterns picks key column 1 as "head 1".
    layer = MultiHeadAttention(AttentionConfig(d_model=6, n_heads=3, causal=True)).double()
    x = torch.randn(1, 3, 6, dtype=torch.float64)
    every = layer(x, return_pattern=True).pattern
    one = layer(x, return_pattern=[1]).pattern
    _assert_close(one, every[:, [1]])


@pytest.mark.parametrize("k_len", [2, 5])
def test_causal_only_patterns_of_some_heads_in_cross_attention(k_len):
    # q_len != k_len: an explicit (3, k_len) causal bias with 1-D dead rows.
    layer = MultiHeadAttention(AttentionConfig(d_model=8, n_heads=2, causal=True)).double()
    query, key = torch.randn(1, 3, 8, dtype=torch.float64), torch.randn(1, k_len, 8, dtype=torch.float64)
    every = layer(query, key, return_pattern=True).pattern
    some = layer(query, key, return_pattern=[1, 0]).pattern
    _assert_close(some, every[:, [1, 0]])
