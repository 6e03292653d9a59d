"""Length-bucketed batches: sort items by length, fill each batch up to a token budget.

Axis legend: ``batch`` items in a batch, ``pos`` the batch's padded length (its longest item).

A batch costs about ``batch × pos`` tokens of compute (``batch × pos²`` per head for
patterns), so grouping items of similar length keeps the padding, and the waste, small.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PaddingStats", "naive_batches", "padding_stats", "plan_batches"]


def plan_batches(
    lengths: Sequence[int], *, batch_tokens: int | None = 4096, max_batch_size: int | None = 64,
) -> list[list[int]]:
    """Group items into batches of similar length, longest first.

    Items are sorted by decreasing length (ties by index), and each batch takes the next items
    while ``len(batch) × its longest length ≤ batch_tokens`` and ``len(batch) ≤ max_batch_size``.
    An item longer than ``batch_tokens`` gets a batch of its own. Longest first means the
    largest batch (the memory peak) comes first, so a budget that is too large fails at once.

    Args:
        lengths: each item's length in pieces, in corpus order.
        batch_tokens: most padded tokens per batch (``batch × pos``), or None for no budget.
        max_batch_size: most items per batch, or None for no limit.

    Returns:
        Batches of corpus indices; every index appears in exactly one batch.

    Raises:
        ValueError: a bound is not a positive int, both bounds are None, or a length is < 1.
    """
    for name, bound in (("batch_tokens", batch_tokens), ("max_batch_size", max_batch_size)):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
            raise ValueError(f"{name}={bound!r}; expected a positive int or None")
    if batch_tokens is None and max_batch_size is None:
        raise ValueError("batch_tokens and max_batch_size are both None: give at least one bound")
    bad = [(i, n) for i, n in enumerate(lengths) if n < 1]
    if bad:
        raise ValueError(f"items have no token: (index, length) {bad[:5]}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    batch: list[int] = []
    for i in order:
        pos = lengths[batch[0]] if batch else lengths[i]  # longest first: the first item sets the padding
        fits_tokens = batch_tokens is None or (len(batch) + 1) * pos <= batch_tokens
        fits_size = max_batch_size is None or len(batch) < max_batch_size
        if batch and not (fits_tokens and fits_size):
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    return batches


def naive_batches(n_items: int, *, batch_size: int) -> list[list[int]]:
    """Batches of ``batch_size`` consecutive items in corpus order (the baseline bucketing beats)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}; expected a positive int")
    return [list(range(start, min(start + batch_size, n_items))) for start in range(0, n_items, batch_size)]


@dataclass(frozen=True)
class PaddingStats:
    """Tokens a set of batches computes on.

    Attributes:
        tokens: real tokens.
        padded_tokens: tokens including padding (``Σ batch × pos``).
    """

    tokens: int
    padded_tokens: int

    @property
    def ratio(self) -> float:
        """``padded_tokens / tokens``: 1.0 means no padding."""
        return self.padded_tokens / self.tokens if self.tokens else 1.0

    def to_dict(self) -> dict[str, float]:
        return {"tokens": self.tokens, "padded_tokens": self.padded_tokens, "ratio": self.ratio}


def padding_stats(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> PaddingStats:
    """Real and padded token counts of ``batches`` over items of the given ``lengths``."""
    tokens = sum(lengths[i] for b in batches for i in b)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    return PaddingStats(tokens, padded)
