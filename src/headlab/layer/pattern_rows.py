"""A layer's tapped patterns kept as what makes them, formed a block of query rows at a time.

Axis legend:
    query    (batch, head, query_pos, d_head)     the tapped heads' queries
    key      (batch, head | kv_head, key_pos, d_head)   the key head each of them reads (a group's, once)
    lse      (batch, head, query_pos)             each row's log-sum-exp, as the fused kernel gave it
    rows     (batch, head, stop − start, keys)    ``PatternRows.rows(start, stop)``

A whole pattern is heads × query_pos × key_pos numbers: at 32k positions one head's is 4 GiB in float32.
What makes it is linear in the length: the queries, the keys, the mask and (where the fused kernel ran)
each row's log-sum-exp. ``PatternRows`` holds those and forms any block of rows on demand, with the same
arithmetic as the whole pattern's path (``headlab.models.interface``): ``exp(q kᵀ · scale + bias − lse)``
with the kernel's normaliser, else the softmax of the block's rows (each row is whole, so it is exact).
A causal layer's row ``i`` sees the keys ``≤ i`` only: the rows ``[start, stop)`` are formed against the
first ``stop`` keys (``keys(stop)``), the keys after them left out (their weights are 0), which halves
the arithmetic of a causal pattern.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

from headlab.layer.functional import key_softmax, softmax_from_lse

__all__ = ["PatternRows", "counting_rows"]

_formed: ContextVar[Callable[[int], None] | None] = ContextVar("headlab_rows_formed", default=None)


@contextmanager
def counting_rows(tick: Callable[[int], None]) -> Iterator[None]:
    """While the block runs, ``tick(n)`` each time a ``PatternRows`` forms ``n`` query rows (``rows``, ``log_rows``):
    what a progress bar counts while the patterns of a long text are read a block at a time."""
    token = _formed.set(tick)
    try:
        yield
    finally:
        _formed.reset(token)


class PatternRows:
    """The tapped heads' patterns of one layer's forward, any block of query rows formed on demand.

    Args:
        query: ``(batch, head, query_pos, d_head)``, the tapped heads' queries (unscaled).
        key: ``(batch, head, key_pos, d_head)``, the key head each of them reads; or ``(batch, kv_head, key_pos,
            d_head)``, each read by ``head / kv_head`` consecutive query heads (grouped-query heads, every one tapped:
            a group's query rows then form one product with their key head).
        scale: factor on q·k; in float32 and wider it scales the query, in 16-bit dtypes the product (the order
            of ``headlab.models.interface``'s scores).
        bias: broadcastable to ``(batch, head, query_pos, key_pos)``: float additive, or bool with True = not
            allowed; None for no mask but ``causal``'s.
        causal: row ``i`` sees the keys ``0..i`` only (top-left aligned), on top of ``bias``.
        lse: ``(batch, head, query_pos)``: each row's ``logsumexp(q kᵀ · scale + bias)`` under the same mask, from
            the fused kernel; None to normalise each block's rows with a softmax.
        whole: the whole patterns ``(batch, head, query_pos, key_pos)`` where the forward formed them anyway
            (every head's pattern asked for, a soft-capped model, headlab's own layer); ``rows`` then slices
            them, and every other argument is ignored.

    Attributes:
        shape: ``(batch, head, query_pos, key_pos)`` of the whole patterns.
        dtype, device: the patterns'.
    """

    def __init__(self, query: Tensor | None = None, key: Tensor | None = None, *, scale: float = 1.0,
                 bias: Tensor | None = None, causal: bool = False, lse: Tensor | None = None,
                 whole: Tensor | None = None) -> None:
        if whole is not None:
            self.shape, self.dtype, self.device = tuple(whole.shape), whole.dtype, whole.device
        elif query is None or key is None:
            raise ValueError("PatternRows needs query and key, or the whole patterns (whole=...)")
        else:
            self.shape = (query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            self.dtype, self.device = query.dtype, query.device
        self.query, self.key, self.scale = query, key, scale
        self.bias, self.causal, self.lse, self.whole = bias, causal, lse, whole

    @classmethod
    def of(cls, whole: Tensor) -> PatternRows:
        """Rows sliced from patterns formed whole (``whole``)."""
        return cls(whole=whole)

    def keys(self, stop: int) -> int:
        """How many keys the rows ``[start, stop)`` are formed against: the first ``stop`` when causal, else every
        key."""
        n_keys = self.shape[3]
        return min(stop, n_keys) if self.causal and self.whole is None else n_keys

    def block_rows(self, start: int, budget: int) -> int:
        """How many query rows from ``start`` form a block of at most ``budget`` bytes (every item and head of them,
        against ``keys(stop)`` keys: a causal block's rows see the keys up to its last row), one at least and at most
        the rows left.

        Raises:
            ValueError: ``start`` is not a query row.
        """
        n_queries, n_keys = self.shape[2], self.shape[3]
        if not 0 <= start < n_queries:
            raise ValueError(f"start={start!r}; expected a query row in [0, {n_queries})")
        elements = budget // (self.shape[0] * self.shape[1] * self.dtype.itemsize)  # rows × keys a block may hold
        if self.causal and self.whole is None:  # rows r with r × min(start + r, keys) ≤ elements
            r = int((math.isqrt(start * start + 4 * elements) - start) // 2)
            if start + r > n_keys:
                r = max(r, elements // n_keys)
        else:
            r = elements // n_keys
        return max(1, min(r, n_queries - start))

    def rows(self, start: int, stop: int) -> Tensor:
        """The patterns' query rows ``[start, stop)``: ``(batch, head, stop − start, keys(stop))``, a fresh tensor.

        Raises:
            ValueError: not ``0 ≤ start < stop ≤ query_pos``.
        """
        keys = self._check(start, stop)
        if self.whole is not None:
            return self.whole[:, :, start:stop, :keys].clone()
        scores, bias = self._scores(start, stop, keys)
        if self.lse is not None:
            return softmax_from_lse(scores, bias, self.lse[:, :, start:stop])
        _add_bias(scores, bias)
        return key_softmax(scores)

    def log_rows(self, start: int, stop: int) -> Tensor:
        """The natural log of ``rows(start, stop)``, in float32 or wider: ``q kᵀ · scale + bias − lse``, before the
        exp that makes the rows (``exp(log_rows) == rows`` in float32 and wider); −inf where a weight is 0. Where no
        log-sum-exp was kept, each row's own (its keys are all here).

        Raises:
            ValueError: not ``0 ≤ start < stop ≤ query_pos``.
        """
        keys = self._check(start, stop)
        if self.whole is not None:
            return self.whole[:, :, start:stop, :keys].to(torch.promote_types(self.dtype, torch.float32)).log()
        scores, bias = self._scores(start, stop, keys)
        if scores.dtype.itemsize < 4:
            scores = scores.float()
        _add_bias(scores, bias)
        if self.lse is not None:
            return scores.sub_(self.lse[:, :, start:stop, None].to(scores.dtype))
        return scores.sub_(torch.logsumexp(scores, -1, keepdim=True))

    def _check(self, start: int, stop: int) -> int:
        """``keys(stop)``, once ``[start, stop)`` is checked to be query rows (and counted: ``counting_rows``).

        Raises:
            ValueError: not ``0 ≤ start < stop ≤ query_pos``.
        """
        n_queries = self.shape[2]
        if not 0 <= start < stop <= n_queries:
            raise ValueError(f"rows [{start}, {stop}); expected 0 ≤ start < stop ≤ {n_queries} (the query positions)")
        tick = _formed.get()
        if tick is not None:
            tick(stop - start)
        return self.keys(stop)

    def _scores(self, start: int, stop: int, keys: int) -> tuple[Tensor, Tensor | None]:
        """``(scores, bias)`` of the rows ``[start, stop)`` against ``keys`` keys: ``q kᵀ · scale`` in the patterns'
        dtype, −inf at a causal row's later keys, and the mask cut to those rows and keys (or None)."""
        assert self.query is not None and self.key is not None
        query, key = self.query[:, :, start:stop], self.key[:, :, :keys]
        batch, heads, rows, _ = query.shape
        groups = key.shape[1]
        if groups != heads:  # each key/value head times its query heads' rows, stacked: one product per group
            query = query.reshape(batch, groups, heads // groups * rows, query.shape[-1])
        if query.dtype.itemsize < 4:
            scores = torch.matmul(query, key.transpose(-1, -2)).mul_(self.scale)
        else:
            scores = torch.matmul(query * self.scale, key.transpose(-1, -2))
        scores = scores.view(batch, heads, rows, keys)
        if self.causal and start < keys:  # the later keys of each row: only where the rows' own positions are
            later = (torch.arange(start, keys, device=self.device)[None, :]
                     > torch.arange(start, stop, device=self.device)[:, None])  # (rows, keys − start)
            scores[..., start:].masked_fill_(later, float("-inf"))
        bias = self.bias
        if bias is not None:
            bias = bias[..., slice(start, stop) if bias.shape[-2] != 1 else slice(None), :keys]
        return scores, bias


def _add_bias(scores: Tensor, bias: Tensor | None) -> None:
    """Put the mask on the scores, in place: a bool one's True as −inf, a float one added."""
    if bias is not None and bias.dtype == torch.bool:
        scores.masked_fill_(bias, float("-inf"))
    elif bias is not None:
        scores.add_(bias)
