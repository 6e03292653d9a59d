"""Every row reduction of a layer's patterns kept as ``PatternRows``, in one pass of small row blocks.

Axis legend:
    rows        PatternRows of (batch, head, query_pos, key_pos)
    columns     (batch, head | 1, key_pos, column)     key columns: masks, norms
    block       (batch, head, rows, keys)               a few query rows, formed and dropped in turn
    out         (batch, head, query_pos, FIELDS + column)

Where a batch's patterns would not fit (``headlab.capture.blocks``), its taps keep ``PatternRows`` and no
pattern is ever whole. What the accumulators read of them are row reductions: numbers per query row
(the largest weight, the entropy, the distance, the diagonals, the masses on key columns). ``sweep``
forms the rows a block at a time and takes all of them from the block before the next: each block is
formed once (one product against the keys, minus the kernel's log-sum-exp, one exp), read by the largest
weight's and the entropy's passes and by one product against the key columns (for a causal layer the
distance's columns too), and dropped. The blocks are a few MiB (``SWEEP_BYTES``, at least ``SWEEP_ROWS``
rows), so that each pass over one reads it from cache: on this project's 2-core CPU, at 8k and 32k
positions, blocks of 16 MiB took the least time of 4 to 64 MiB, and 64 MiB twice as long.

Each reduction is the whole patterns' (``headlab.analysis.reductions``) on the same weights: ``Σ p |i − j|``,
``max p``, ``p[i, i + o]``, ``Σ p c`` (only the order of the sums differs; a causal layer's distance is that sum
split at the block's first row ``a``: ``(i − a) Σ p + Σ p (a − j)``); the entropy ``−Σ p ln p`` reads ``ln p`` as
the exp read it (``PatternRows.log_rows``) rather than the log of the rounded weight, the same to a unit in the
last place of each term.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from headlab.layer.pattern_rows import PatternRows

__all__ = ["DIAGONALS", "FIELDS", "SWEEP_BYTES", "SWEEP_GPU_BYTES", "SWEEP_ROWS", "sweep", "sweep_blocks"]

FIELDS = ("confidence", "entropy", "distance")  # out's first fields, then one per diagonal, then the columns
DIAGONALS = (-1, 0, 1)  # p[i, i + o]: the previous, own and next position
SWEEP_BYTES = 1 << 24  # a block's patterns at most (rows permitting)
SWEEP_ROWS = 16  # a block's rows at least: fewer, and the ops' launches cost more than their arithmetic
SWEEP_GPU_BYTES = 1 << 28  # on a GPU, where an op costs its launch more than its arithmetic: 256 MiB blocks


def sweep_blocks(rows: PatternRows, *, block_bytes: int | None = None,
                 min_rows: int | None = None) -> Iterator[tuple[int, int]]:
    """The row blocks ``(start, stop)`` of ``rows``' query rows, in order: each at most ``block_bytes`` of patterns
    (``PatternRows.block_rows``; None: ``SWEEP_BYTES``, on a GPU ``SWEEP_GPU_BYTES``) unless that is fewer than
    ``min_rows`` rows (None: ``SWEEP_ROWS``; the rows left permitting)."""
    if block_bytes is None:
        block_bytes = SWEEP_BYTES if rows.device.type == "cpu" else SWEEP_GPU_BYTES
    min_rows = SWEEP_ROWS if min_rows is None else min_rows
    n_queries, start = rows.shape[2], 0
    while start < n_queries:
        stop = start + max(rows.block_rows(start, block_bytes), min(min_rows, n_queries - start))
        yield start, stop
        start = stop


def sweep(rows: PatternRows, columns: Tensor | None = None, *, block_bytes: int | None = None,
          min_rows: int | None = None) -> Tensor:
    """The row reductions of ``rows``' patterns, a block of query rows at a time.

    Args:
        rows: one layer's patterns (``headlab.layer.pattern_rows.PatternRows``).
        columns: ``(batch, head | 1, key_pos, column)`` in the patterns' dtype: the key columns whose mass each
            row puts on them (``Σ_j p_ij c_j``); None for none.
        block_bytes, min_rows: the blocks' size (``sweep_blocks``).

    Returns:
        ``(batch, head, query_pos, len(FIELDS) + len(DIAGONALS) + column)`` in the patterns' dtype: per row the
        largest weight, the entropy (nats), the distance ``Σ_j p_ij |i − j|``, ``p[i, i + o]`` for each of
        ``DIAGONALS`` (0 where key ``i + o`` does not exist), then the masses on ``columns``.
    """
    batch, heads, n_queries, n_keys = rows.shape
    n_columns = 0 if columns is None else columns.shape[-1]
    first = len(FIELDS) + len(DIAGONALS)  # out's first column mass
    out = torch.zeros(batch, heads, n_queries, first + n_columns, dtype=rows.dtype, device=rows.device)
    positions = torch.arange(max(n_queries, n_keys), device=rows.device)
    # The key columns of one product per block: the columns asked for, then for a causal layer 1 and start − j, whose
    # sums give the distance: row i sees keys j ≤ i only, so Σ_j p_ij |i − j| = (i − start) Σ_j p_ij + Σ_j p_ij
    # (start − j), each term as large as the row's own distances (not i·Σp − Σ p j, which would cancel).
    keyed = torch.zeros(batch, 1 if columns is None else columns.shape[1], n_keys, n_columns + 2 * rows.causal,
                        dtype=rows.dtype, device=rows.device)
    if columns is not None:
        keyed[..., :n_columns] = columns
    if rows.causal:
        keyed[..., n_columns] = 1.0
    # where a log weight can be −inf (a weight of 0): anywhere under a mask (or of whole patterns); of a causal layer
    # with no other mask, only at the later keys of the block's own rows (its last keys); else nowhere
    anywhere = rows.bias is not None or rows.whole is not None
    buffer = None  # the weights of each block in turn: one allocation, not one per block
    for start, stop in sweep_blocks(rows, block_bytes=block_bytes, min_rows=min_rows):
        log_p = rows.log_rows(start, stop)  # (batch, head, r, keys), float32 or wider
        if buffer is None or buffer.numel() < log_p.numel():
            buffer = torch.empty(log_p.numel(), dtype=log_p.dtype, device=log_p.device)
        block = torch.exp(log_p, out=buffer[: log_p.numel()].view(log_p.shape)).to(rows.dtype)
        r, keys = block.shape[-2:]
        at = out[:, :, start:stop]
        at[..., 0] = block.amax(-1)
        if rows.causal:
            keyed[..., :keys, n_columns + 1] = start - positions[:keys]
        if keyed.shape[-1] and keyed.shape[1] == 1:  # the same columns for every head: every head's rows at once
            sums = torch.matmul(block.view(batch, heads * r, keys), keyed[:, 0, :keys]).view(batch, heads, r, -1)
        elif keyed.shape[-1]:
            sums = torch.matmul(block, keyed[..., :keys, :])  # (batch, head, r, n_columns (+ 2))
        if n_columns:
            at[..., first:] = sums[..., :n_columns]
        if rows.causal:
            at[..., 2] = torch.addcmul(sums[..., -1], sums[..., -2], positions[:r].to(block.dtype))
        else:  # Σ_j p_ij |i − j|: row r's weights times its offsets, one product per row over every (item, head)
            offsets = (positions[start:stop, None] - positions[:keys]).abs_().to(block.dtype)  # (r, keys)
            per_row = torch.matmul(block.view(batch * heads, r, keys).transpose(0, 1), offsets[:, :, None])
            at[..., 2] = per_row.view(r, batch, heads).permute(1, 2, 0)
        # −Σ p ln p with ln p as the exp read it (−inf made the dtype's lowest: 0 · that is 0)
        if anywhere or rows.causal:
            (log_p if anywhere else log_p[..., start:]).clamp_min_(torch.finfo(log_p.dtype).min)
        at[..., 1] = log_p.mul_(block).sum(-1).neg_()
        for i, offset in enumerate(DIAGONALS):  # row r's key start + r + offset, where it exists
            values = block.diagonal(offset=start + offset, dim1=-2, dim2=-1)
            skip = max(0, -(start + offset))
            at[:, :, skip:skip + values.shape[-1], len(FIELDS) + i] = values
        del block, log_p
    return out
