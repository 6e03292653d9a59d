"""Length-bucketed batches: sort items by length, cut the sorted run into batches of least cost.

Axis legend: ``batch`` items in a batch, ``pos`` the batch's padded length (its longest item).

A batch costs about ``batch × pos`` tokens of compute (``batch × pos²`` per head for patterns)
and a fixed cost however small it is (``batch_cost``): ``plan_batches`` cuts the items, sorted
by length, where the sum of those costs is least, so the padding stays small without a flood of
tiny batches.

The forward wants large batches (the dense layers run on ``batch × pos`` tokens at once), but what
reads each pattern after it (the analysis accumulators) pays ``pos²`` per item: ``length_groups``
cuts a batch into runs of items read as their own, shorter, ``(items, pos, pos)`` blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

__all__ = [
    "BATCH_COST", "GPU_GROUP_COST", "GROUP_COST", "POS_WEIGHT", "PaddingStats", "batch_cost", "length_groups",
    "naive_batches", "padding_stats", "plan_batches",
]

# The forward's cost model, measured with the default model capturing every pattern on this project's
# 2-core CPU (median of 7 rounds): a batch of `batch` items padded to `pos` takes about
# batch · pos · (1 + pos / POS_WEIGHT) tokens' time, plus BATCH_COST tokens' time however small it is.
# - 512 tokens as 1 × 512 took 1.6× (2 threads) and 1.7× (1 thread) the time of 8 × 64: the pos² work of
#   attention, POS_WEIGHT ≈ 1000 and ≈ 600.
# - 64 batches of 8 tokens took 9× the time of one batch of 64 × 8: 17 ms (~66 tokens) per forward. The
#   analysis accumulators add 25–40 ms per batch whatever its size, so a batch's fixed cost is set to 256.
POS_WEIGHT = 512
BATCH_COST = 256
# What one more group costs a reader of the patterns, in pattern entries per head (pos² of one item):
# each reduction runs once more per group and layer, ~0.3 ms for the analysis accumulators on this
# project's 2-core CPU, the time they take to read ~16k entries of each of 12 heads.
GROUP_COST = 128 * 128
# On a GPU the accumulators' time per batch is almost all op launches (H200, the default model, layer by
# layer: 27.6 ms per one-item batch against 29.6 ms per batch of up to 32 items of the corpus), so a group
# costs far more there than the padding it skips: a batch is cut only where it saves more than a 2k-token
# item's pattern.
GPU_GROUP_COST = 1 << 22


@overload
def batch_cost(items: int, pos: int) -> int: ...
@overload
def batch_cost(items: np.ndarray, pos: int) -> np.ndarray: ...
def batch_cost(items: int | np.ndarray, pos: int) -> int | np.ndarray:
    """A batch's cost in the forward's cost model, in units of ``1 / POS_WEIGHT`` token:
    ``items · pos · (POS_WEIGHT + pos) + BATCH_COST · POS_WEIGHT`` (an int, so plans compare exactly;
    ``items`` may be a numpy array of counts, one cost each)."""
    return items * pos * (POS_WEIGHT + pos) + BATCH_COST * POS_WEIGHT


def plan_batches(
    lengths: Sequence[int], *, batch_tokens: int | None = 4096, max_batch_size: int | None = 64,
) -> list[list[int]]:
    """Group items into batches of similar length, longest first, of least total ``batch_cost``.

    Items are sorted by decreasing length (ties by index), and the sorted run is cut into batches
    where the sum of ``batch_cost`` is least, by dynamic programming over the cut points (exact). A
    batch takes at most ``max_batch_size`` items, and ``len(batch) × its longest length ≤ batch_tokens``;
    an item longer than ``batch_tokens`` gets a batch of its own. Longest first means the batches with
    the largest patterns (``batch × pos²`` ≤ ``batch_tokens × pos`` per head) come first, so a budget
    too large for memory fails early.

    A plan restricted to a run of its batches is that run's own plan (``plan_shards`` relies on it):
    the costs are ints and, of equally cheap cuts, the one that closes the first batch earliest wins.

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
    n = len(order)
    best = np.zeros(n + 1, dtype=np.int64)  # best[i]: the least cost of the sorted items i … n − 1
    end = np.zeros(n, dtype=np.int64)  # end[i]: where the first batch of that cut ends
    for i in range(n - 1, -1, -1):  # the batch starting at item i: its first item is its longest
        pos = lengths[order[i]]
        most = n - i if max_batch_size is None else min(n - i, max_batch_size)
        if batch_tokens is not None:
            most = max(1, min(most, batch_tokens // pos))
        cost = batch_cost(np.arange(1, most + 1, dtype=np.int64), pos) + best[i + 1:i + most + 1]
        first = int(np.argmin(cost))  # on a tie the smallest batch
        best[i] = cost[first]
        end[i] = i + first + 1
    batches, i = [], 0
    while i < n:
        batches.append(order[i:end[i]])
        i = int(end[i])
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


def length_groups(lengths: Sequence[int], *, group_cost: int | None = None) -> list[tuple[slice, int]]:
    """Cut a batch into runs of consecutive items that are read as their own ``(items, pos, pos)`` blocks.

    Minimises ``Σ_runs (items × pos² + group_cost)``, each run's ``pos`` its longest item, by dynamic
    programming over the cut points (exact; ``len(lengths)²`` steps). The runs keep the batch's order, so
    each is a slice of the batch's tensors: most useful when the items are sorted by length, as
    ``plan_batches`` sorts them; for any order the runs are still exact, only less tight.

    Args:
        lengths: each item's real length, in batch order.
        group_cost: the cost of one more run, in pattern entries (``pos²`` units); None: ``GROUP_COST``.

    Returns:
        ``(items, pos)`` per run, in batch order: ``items`` a slice of the batch, ``pos`` the run's longest
        length; the runs cover every item once. Empty for an empty batch.

    Raises:
        ValueError: a length is < 1 or ``group_cost`` is negative.
    """
    if group_cost is None:
        group_cost = GROUP_COST
    if isinstance(group_cost, bool) or not isinstance(group_cost, int) or group_cost < 0:
        raise ValueError(f"group_cost={group_cost!r}; expected an int ≥ 0")
    bad = [(i, n) for i, n in enumerate(lengths) if n < 1]
    if bad:
        raise ValueError(f"items have no token: (index, length) {bad[:5]}")
    n = len(lengths)
    sizes = np.asarray(lengths, dtype=np.int64)
    best = np.zeros(n + 1, dtype=np.int64)  # best[e]: the least cost of items 0 … e − 1
    start = [0] * (n + 1)  # start[e]: where the last run of that best cut begins
    for end in range(1, n + 1):  # every start of the last run at once: its longest item is a suffix maximum
        longest = np.maximum.accumulate(sizes[end - 1::-1])[::-1]  # (end,): max of lengths[first:end]
        cost = best[:end] + group_cost + (end - np.arange(end)) * longest * longest
        start[end] = int(np.argmin(cost))  # on a tie the earliest start, the longer last run: fewer runs
        best[end] = cost[start[end]]
    runs, end = [], n
    while end:
        first = start[end]
        runs.append((slice(first, end), max(lengths[first:end])))
        end = first
    return runs[::-1]
