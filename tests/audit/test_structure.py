"""The linear algebra behind the verdict: reads, ranks, subspaces, groups, differences."""

from __future__ import annotations

import pytest
import torch

from headlab.audit.structure import (
    Reads,
    basis,
    classify_reads,
    kv_groups,
    max_relative_difference,
    own_rows,
    read_dims,
    same_subspace,
    spectrum,
)


def _mask(d: int, dims: list[int]) -> torch.Tensor:
    mask = torch.zeros(d, dtype=torch.bool)
    mask[dims] = True
    return mask


@pytest.mark.parametrize(("dims", "expected"), [
    (list(range(8)), Reads("wide", 8, 0, 8)),
    ([2, 3], Reads("narrow", 2, 2, 4, 1)),
    ([3], Reads("narrow", 1, 2, 4, 1)),  # inside slice 1, not all of it
    ([1, 2], Reads("partial", 2, 1, 3)),  # straddles two slices
    ([], Reads("none", 0, 0, 0)),
])
def test_classify_reads(dims: list[int], expected: Reads) -> None:
    assert classify_reads(_mask(8, dims), n_heads=4) == expected


def test_one_head_reading_everything_is_wide_not_narrow() -> None:
    assert classify_reads(_mask(4, [0, 1, 2, 3]), n_heads=1).kind == "wide"
    assert classify_reads(_mask(6, [0, 1]), n_heads=4).kind == "partial"  # 4 does not divide 6: no slices


def test_read_dims_is_relative_to_the_largest_row() -> None:
    m = torch.tensor([[1.0, 0.0], [1e-9, 0.0], [0.0, 0.0]], dtype=torch.float64)
    assert read_dims(m, rtol=1e-7).tolist() == [True, False, False]
    assert read_dims(torch.zeros(3, 2), rtol=1e-7).tolist() == [False, False, False]


def test_rank_and_basis() -> None:
    a = torch.randn(6, 2, dtype=torch.float64)
    m = a @ torch.randn(2, 5, dtype=torch.float64)
    assert spectrum(m, rtol=1e-9).rank == 2 and spectrum(torch.zeros(3, 3), rtol=1e-9).rank == 0
    b = basis(m, rtol=1e-9)
    assert b.shape == (6, 2) and same_subspace(b, basis(a, rtol=1e-9), tol=1e-9)
    assert not same_subspace(b, basis(torch.randn(6, 2, dtype=torch.float64), rtol=1e-9), tol=1e-3)
    assert not same_subspace(b, basis(torch.randn(6, 3, dtype=torch.float64), rtol=1e-9), tol=1e-3)


def test_kv_groups_need_both_keys_and_values_in_one_subspace() -> None:
    k = [basis(torch.randn(6, 2, dtype=torch.float64), rtol=1e-9) for _ in range(2)]
    v = [basis(torch.randn(6, 2, dtype=torch.float64), rtol=1e-9) for _ in range(2)]
    assert kv_groups([k[0], k[1], k[0], k[0]], [v[0], v[1], v[0], v[1]], tol=1e-6) == [[0, 2], [1], [3]]


def test_own_rows_and_differences() -> None:
    m = torch.arange(12.0).reshape(6, 2)
    assert torch.equal(own_rows(m, Reads("narrow", 2, 2, 4, 1)), m[2:4])
    assert torch.equal(own_rows(m, Reads("wide", 6, 0, 6)), m)
    assert max_relative_difference(m, m + 1, scale=2.0) == 0.5
    assert max_relative_difference(m, m[:3], scale=1.0) == float("inf")
