"""RotaryEmbedding: a rotation of feature pairs (i, i + rotary_dim/2) by position-dependent angles.

Checked as invariants (norms of pairs, relative positions, offsets, untouched tail), against
the complex-number reference ``tests.layer.reference.rotate``, and in half precision.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from headlab.layer import AttentionConfig, MultiHeadAttention, RotaryEmbedding
from tests.support.reference import rotate


@st.composite
def rotations(draw):
    """(rope, d_head): an even rotary_dim ≤ 8 inside a head of up to 4 more features."""
    rotary_dim = 2 * draw(st.integers(1, 4))
    d_head = rotary_dim + draw(st.integers(0, 4))
    base = draw(st.sampled_from([10000.0, 500000.0, 100.0, 1.5]))
    return RotaryEmbedding(rotary_dim, base=base), d_head


def _x(*shape, seed=0, dtype=torch.float64):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _pair_norms(x, rotary_dim):
    half = rotary_dim // 2
    return x[..., :half].square() + x[..., half:rotary_dim].square()


@given(rot=rotations(), length=st.integers(1, 6), offset=st.integers(0, 5000), seed=st.integers(0, 2**16))
def test_preserves_the_norm_of_each_rotated_pair(rot, length, offset, seed):
    rope, d_head = rot
    x = _x(2, 3, length, d_head, seed=seed)
    y = rope(x, offset=offset)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(_pair_norms(y, rope.rotary_dim), _pair_norms(x, rope.rotary_dim), atol=1e-12, rtol=1e-12)


@given(
    rot=rotations(),
    p=st.integers(0, 300),
    p2=st.integers(0, 300),
    shift=st.integers(-300, 3000),
    seed=st.integers(0, 2**16),
)
def test_query_key_product_depends_only_on_relative_position(rot, p, p2, shift, seed):
    rope, d_head = rot
    q, k = _x(1, 1, 1, d_head, seed=seed), _x(1, 1, 1, d_head, seed=seed + 1)
    shift = max(shift, -min(p, p2))  # keep positions non-negative
    before = (rope(q, offset=p) * rope(k, offset=p2)).sum()
    after = (rope(q, offset=p + shift) * rope(k, offset=p2 + shift)).sum()
    torch.testing.assert_close(after, before, atol=1e-9, rtol=0)


def test_rotation_does_something():
    # Guards the invariants above against a rotation that is the identity.
    rope = RotaryEmbedding(4)
    x = _x(1, 1, 3, 4)
    y = rope(x)
    assert torch.equal(y[..., 0, :], x[..., 0, :])  # position 0: angle 0
    assert not torch.allclose(y[..., 1:, :], x[..., 1:, :])
    q, k = _x(1, 1, 1, 4, seed=1), _x(1, 1, 1, 4, seed=2)
    near = (rope(q, offset=5) * rope(k, offset=4)).sum()
    far = (rope(q, offset=5) * rope(k, offset=1)).sum()
    assert not torch.isclose(near, far)


@given(rot=rotations(), start=st.integers(0, 10), length=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_offset_equals_slicing_a_longer_rotation(rot, start, length, seed):
    rope, d_head = rot
    x = _x(2, 2, start + length + 3, d_head, seed=seed)
    full = rope(x)
    window = slice(start, start + length)
    torch.testing.assert_close(rope(x[:, :, window], offset=start), full[:, :, window], atol=1e-12, rtol=0)


def test_offset_equals_slicing_float32():
    rope = RotaryEmbedding(8)
    x = _x(1, 2, 64, 8, dtype=torch.float32)
    full = rope(x)
    for start in (0, 1, 17, 63):
        torch.testing.assert_close(rope(x[:, :, start:], offset=start), full[:, :, start:], atol=1e-6, rtol=0)


@given(rot=rotations(), seed=st.integers(0, 2**16))
def test_partial_rotary_leaves_the_tail_untouched(rot, seed):
    rope, d_head = rot
    x = _x(2, 3, 5, d_head, seed=seed)
    y = rope(x, offset=7)
    assert torch.equal(y[..., rope.rotary_dim :], x[..., rope.rotary_dim :])
    assert not torch.equal(y[..., : rope.rotary_dim], x[..., : rope.rotary_dim])


@given(rot=rotations(), length=st.integers(1, 6), offset=st.integers(0, 2048), seed=st.integers(0, 2**16))
def test_matches_reference_rotate(rot, length, offset, seed):
    rope, d_head = rot
    x = _x(length, d_head, seed=seed)
    expected = rotate(x, torch.arange(offset, offset + length), rope.rotary_dim, rope.base)
    torch.testing.assert_close(rope(x[None, None], offset=offset)[0, 0], expected, atol=1e-10, rtol=0)


def test_layer_rotates_queries_and_keys_like_the_reference():
    # Through the layer: patterns with rotary equal softmax of reference-rotated q kᵀ.
    layer = MultiHeadAttention(AttentionConfig(d_model=8, n_heads=2, rotary=True, rotary_dim=2, bias=False)).double()
    x = _x(1, 5, 8)
    patterns = layer(x, return_pattern=True).pattern
    for h in range(2):
        q = rotate(x[0] @ layer.W_Q[h].detach(), torch.arange(5), 2, 10000.0)
        k = rotate(x[0] @ layer.W_K[h].detach(), torch.arange(5), 2, 10000.0)
        expected = ((q @ k.T) * layer.config.softmax_scale).softmax(dim=-1)
        torch.testing.assert_close(patterns[0, h], expected, atol=1e-12, rtol=0)


# --- half precision ---------------------------------------------------------------------------

LOW_PRECISION = [pytest.param(torch.float16, 1e-2, id="float16"), pytest.param(torch.bfloat16, 5e-2, id="bfloat16")]


@pytest.mark.parametrize(("dtype", "atol"), LOW_PRECISION)
def test_low_precision_input_close_to_float32(dtype, atol):
    rope = RotaryEmbedding(8)
    x = _x(1, 2, 4096, 12, dtype=torch.float32).to(dtype)  # long: large angles
    y = rope(x)
    assert y.dtype == dtype
    # Compare with float32 on the same (already rounded) input: only the rotation's own error.
    torch.testing.assert_close(y.float(), rope(x.float()), atol=atol, rtol=0)


@pytest.mark.parametrize("how", ["rope.to", "layer.to"])
@pytest.mark.parametrize(("dtype", "atol"), LOW_PRECISION)
def test_low_precision_module_close_to_float32(dtype, atol, how):
    if how == "rope.to":
        rope32 = RotaryEmbedding(8)
        rope = copy.deepcopy(rope32).to(dtype)
    else:
        layer32 = MultiHeadAttention(AttentionConfig(d_model=24, n_heads=2, rotary=True, rotary_dim=8))
        rope32, rope = layer32.rotary, copy.deepcopy(layer32).to(dtype).rotary
    x = _x(1, 2, 4096, 12, dtype=torch.float32).to(dtype)
    torch.testing.assert_close(rope(x).float(), rope32(x.float()), atol=atol, rtol=0)
