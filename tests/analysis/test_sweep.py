"""The sweep (headlab.analysis.sweep): every row reduction of PatternRows, whatever its blocks, equals the same
reduction of the whole patterns formed directly in float64 (softmax of q·kᵀ under the mask)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from headlab.analysis.sweep import DIAGONALS, FIELDS, sweep, sweep_blocks
from headlab.layer.pattern_rows import PatternRows


def _case(seed: int, *, causal: bool, groups: int, mask: str, lse: bool, whole: bool, n: int = 13):
    """A PatternRows of (2 items, 4 heads, n, n) in float64 and its whole patterns, formed directly."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, n, 5, generator=g, dtype=torch.float64) * 2
    k = torch.randn(2, groups, n, 5, generator=g, dtype=torch.float64) * 2
    scale = 5**-0.5
    scores = torch.matmul(q, k.repeat_interleave(4 // groups, 1).transpose(-1, -2)) * scale
    allowed = torch.ones(2, 1, n, n, dtype=torch.bool)
    if causal:
        allowed &= torch.ones(n, n, dtype=torch.bool).tril()
    bias = None
    if mask != "none":  # the second item's last 4 keys are padding
        padding = torch.zeros(2, 1, 1, n, dtype=torch.bool)
        padding[1, ..., n - 4:] = True
        allowed = allowed & ~padding
        bias = padding if mask == "bool" else torch.zeros(2, 1, 1, n, dtype=torch.float64).masked_fill(padding,
                                                                                                      -math.inf)
    pattern = torch.softmax(scores.masked_fill(~allowed, -math.inf), -1)
    if whole:
        return PatternRows.of(pattern), pattern
    log_sum = torch.logsumexp(scores.masked_fill(~allowed, -math.inf), -1) if lse else None
    return PatternRows(q, k, scale=scale, bias=bias, causal=causal, lse=log_sum), pattern


def _expected(pattern: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    n = pattern.shape[-1]
    offsets = (torch.arange(n)[:, None] - torch.arange(n)).abs().double()
    entropy = -(pattern * pattern.clamp_min(1e-300).log()).sum(-1)
    fields = [pattern.amax(-1), entropy, (pattern * offsets).sum(-1)]
    for offset in DIAGONALS:
        diagonal = torch.zeros(pattern.shape[:-1], dtype=pattern.dtype)
        values = pattern.diagonal(offset=offset, dim1=-2, dim2=-1)
        diagonal[..., max(0, -offset):max(0, -offset) + values.shape[-1]] = values
        fields.append(diagonal)
    return torch.cat([torch.stack(fields, -1), torch.matmul(pattern, columns)], -1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), causal=st.booleans(), groups=st.sampled_from([1, 2, 4]),
       mask=st.sampled_from(["none", "bool", "float"]), lse=st.booleans(), whole=st.booleans(),
       block_bytes=st.integers(1, 3000), min_rows=st.integers(1, 5))
def test_the_sweep_equals_the_whole_patterns_reductions(seed, causal, groups, mask, lse, whole, block_bytes,
                                                        min_rows) -> None:
    rows, pattern = _case(seed, causal=causal, groups=groups, mask=mask, lse=lse, whole=whole)
    columns = torch.rand(2, 4, pattern.shape[-1], 3, generator=torch.Generator().manual_seed(seed),
                         dtype=torch.float64)
    got = sweep(rows, columns, block_bytes=block_bytes, min_rows=min_rows)
    assert got.shape == (*pattern.shape[:-1], len(FIELDS) + len(DIAGONALS) + 3)
    torch.testing.assert_close(got, _expected(pattern, columns), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_the_blocks_cover_every_row_once_each_within_the_bytes_or_the_minimum_rows(causal: bool) -> None:
    rows, _ = _case(0, causal=causal, groups=2, mask="none", lse=True, whole=False, n=40)
    blocks = list(sweep_blocks(rows, block_bytes=2048, min_rows=3))
    assert [b[0] for b in blocks] == [0] + [b[1] for b in blocks[:-1]] and blocks[-1][1] == 40
    for start, stop in blocks:
        size = 2 * 4 * (stop - start) * rows.keys(stop) * 8
        assert size <= 2048 or stop - start == min(3, 40 - start), (start, stop)
    assert len(list(sweep_blocks(rows, block_bytes=1, min_rows=1))) == 40  # one row each at least


def test_log_rows_are_the_rows_logs() -> None:
    for lse in (True, False):
        rows, pattern = _case(3, causal=True, groups=2, mask="float", lse=lse, whole=False)
        torch.testing.assert_close(rows.log_rows(2, 9).exp(), pattern[:, :, 2:9, :9], rtol=1e-12, atol=1e-15)
