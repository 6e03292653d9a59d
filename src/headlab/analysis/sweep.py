"""Every row reduction of a layer's patterns kept as ``PatternRows``, in one pass of small row blocks.

Axis legend:
    rows        PatternRows of (batch, head, query_pos, key_pos)
    columns     (batch, head | 1, key_pos, column)     key columns: masks, norms
    block       (batch, head, rows, keys)               a few query rows, formed and dropped in turn
    out         (batch, head, query_pos, FIELDS + column)

Where a batch's patterns would not fit (``headlab.capture.blocks``), its taps keep ``PatternRows`` and no
pattern is ever whole. What the accumulators read of them are row reductions: numbers per query row
(the largest weight, the entropy, the distance, the diagonals, the masses on key columns). ``sweep``
forms the rows a block at a time and takes all of them from the block while it is in cache: each
block is formed once (one product against the keys, the kernel's normaliser, one exp), read by a few
passes and a product against the key columns, and dropped. The blocks are small
(``SWEEP_BYTES``, at least ``SWEEP_ROWS`` rows): a block that stays in cache makes every pass over it
cheap, where a block of 100 MiB sends each pass to memory.

Each reduction is the whole patterns' (``headlab.analysis.reductions``) on the same weights: ``Σ p |i − j|``,
``max p``, ``p[i, i + o]``, ``Σ p c`` (only the order of the sums differs); the entropy ``−Σ p ln p`` reads
``ln p`` as the exp read it (``PatternRows.log_rows``) rather than the log of the rounded weight, the same
to a unit in the last place of each term.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from headlab.layer.pattern_rows import PatternRows

__all__ = ["DIAGONALS", "FIELDS", "SWEEP_BYTES", "SWEEP_GPU_BYTES", "SWEEP_ROWS", "sweep", "sweep_blocks"]

FIELDS = ("confidence", "entropy", "distance")  # out's first fields, then one per diagonal, then the columns
DIAGONALS = (-1, 0, 1)  # p[i, i + o]: the previous, own and next position
SWEEP_BYTES = 1 << 23  # a block's patterns at most (rows permitting): 8 MiB
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
    # where a log weight can be −inf (a weight of 0): anywhere under a mask (or of whole patterns); of a causal layer
    # with no other mask, only at the later keys of the block's own rows (its last keys); else nowhere
    anywhere = rows.bias is not None or rows.whole is not None
    for start, stop in sweep_blocks(rows, block_bytes=block_bytes, min_rows=min_rows):
        log_p = rows.log_rows(start, stop)  # (batch, head, r, keys), float32 or wider
        block = torch.exp(log_p).to(rows.dtype)
        r, keys = block.shape[-2:]
        at = out[:, :, start:stop]
        at[..., 0] = block.amax(-1)
        # Σ_j p_ij |i − j|: row r's weights times its offsets, one product per row over every (item, head)
        offsets = (positions[start:stop, None] - positions[:keys]).abs_().to(block.dtype)  # (r, keys)
        per_row = torch.matmul(block.view(batch * heads, r, keys).transpose(0, 1), offsets[:, :, None])
        at[..., 2] = per_row.view(r, batch, heads).permute(1, 2, 0)
        # −Σ p ln p with ln p as the exp read it (−inf made the dtype's lowest: 0 · that is 0)
        if anywhere or rows.causal:
            (log_p if anywhere else log_p[..., start:]).clamp_min_(torch.finfo(log_p.dtype).min)
        at[..., 1] = torch.linalg.vecdot(block.to(log_p.dtype), log_p).neg_()
        for i, offset in enumerate(DIAGONALS):  # row r's key start + r + offset, where it exists
            values = block.diagonal(offset=start + offset, dim1=-2, dim2=-1)
            skip = max(0, -(start + offset))
            at[:, :, skip:skip + values.shape[-1], len(FIELDS) + i] = values
        if columns is not None:
            at[..., first:] = torch.matmul(block, columns[..., :keys, :])
        del block, log_p
    return out
