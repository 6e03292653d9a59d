"""The layer benchmark's pieces: FLOPs from the accounting, the raw floor, the same-output check."""

from __future__ import annotations

import pytest
import torch

from headlab.bench.layer import check_same, layer_flops, raw_floor
from headlab.layer import AttentionConfig, MultiHeadAttention


@pytest.mark.parametrize("n_kv_heads", [8, 2, 1])
def test_flops_are_the_accountings_matrix_multiplies(n_kv_heads: int) -> None:
    d, h, L, batch = 64, 8, 32, 3
    c = AttentionConfig(d_model=d, n_heads=h, n_kv_heads=n_kv_heads)
    kv = n_kv_heads * c.d_head
    by_hand = 2 * L * d * (d + 2 * kv) + 2 * 2 * h * L * L * c.d_head + 2 * L * d * d
    assert layer_flops(c, batch=batch, pos=L) == batch * by_hand


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_raw_floor_computes_the_layer(n_kv_heads: int) -> None:
    layer = MultiHeadAttention(AttentionConfig(d_model=32, n_heads=4, n_kv_heads=n_kv_heads)).eval()
    with torch.no_grad():
        layer.projection.in_proj_bias.normal_()
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(raw_floor(layer)(x), layer(x), atol=1e-5, rtol=1e-5)


def test_raw_floor_refuses_other_projections() -> None:
    with pytest.raises(ValueError, match="projection='narrow'"):
        raw_floor(MultiHeadAttention(AttentionConfig(d_model=32, n_heads=4, projection="narrow")))


def test_check_same_refuses_contenders_that_compute_different_things() -> None:
    x = torch.randn(3, 4)
    check_same("case", {"a": x, "b": x + 1e-7}, torch.float32)
    with pytest.raises(RuntimeError, match="case: b and a disagree"):
        check_same("case", {"a": x, "b": x + 1.0}, torch.float32)
