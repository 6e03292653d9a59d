"""Timing in interleaved rounds, and what one contender's timing says.

Every benchmark of the suite compares contenders timed in the same run: each round times
every contender once (a block of calls), in an order that rotates from round to round, and
the median round counts. Drift of a shared machine then hits all contenders alike, and a
ratio of two medians from one group is what the suite reports.

On CUDA a block is timed with CUDA events recorded around it (after a synchronize), so the
time is the device's, not the launch queue's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Timing", "quantile", "synchronize", "time_interleaved"]


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` with linear interpolation between order statistics.

    Args:
        values: at least one number.
        q: in [0, 1]; 0.5 is the median.

    Returns:
        The quantile.

    Raises:
        ValueError: ``values`` is empty or ``q`` is outside [0, 1].
    """
    if not values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q={q!r}; expected a number in [0, 1]")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Timing:
    """Seconds per call of one contender, one sample per round.

    Attributes:
        samples: seconds per call in each round (a round's block time / ``calls_per_round``).
        calls_per_round: calls in each round's block.
    """

    samples: tuple[float, ...]
    calls_per_round: int = 1

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a Timing needs at least one sample")
        bad = [s for s in self.samples if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0)]
        if bad:
            raise ValueError(f"timing samples must be positive finite seconds, got {bad[:3]}")
        calls = self.calls_per_round
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise ValueError(f"calls_per_round={self.calls_per_round!r}; expected a positive int")

    @property
    def median(self) -> float:
        """Median seconds per call over the rounds."""
        return quantile(self.samples, 0.5)

    @property
    def q1(self) -> float:
        """First quartile of seconds per call."""
        return quantile(self.samples, 0.25)

    @property
    def q3(self) -> float:
        """Third quartile of seconds per call."""
        return quantile(self.samples, 0.75)

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median: how much the rounds disagreed."""
        return (self.q3 - self.q1) / self.median

    def to_dict(self) -> dict[str, Any]:
        """Returns: the samples with the median, quartiles and spread (JSON-ready)."""
        return {"samples": list(self.samples), "calls_per_round": self.calls_per_round, "median": self.median,
                "q1": self.q1, "q3": self.q3, "spread": self.spread}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Timing:
        """The inverse of ``to_dict`` (derived numbers are recomputed, not read)."""
        return cls(samples=tuple(float(s) for s in data["samples"]), calls_per_round=int(data["calls_per_round"]))


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _time_block(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Seconds for ``calls`` calls of ``fn``, measured on the device's clock."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    begin = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - begin


def time_interleaved(
    fns: Mapping[str, Callable[[], object]],
    *,
    rounds: int,
    min_block_s: float,
    warmup: int = 2,
    device: torch.device | str = "cpu",
) -> dict[str, Timing]:
    """Time each function in interleaved rounds.

    Each function is first called ``warmup`` times, then timed once more to size its block:
    a block holds enough calls to last about ``min_block_s`` (at least one). Then every round
    times one block of every function, starting each round one function later than the last.

    Args:
        fns: name → a function of no arguments (its result is ignored).
        rounds: rounds to time.
        min_block_s: the shortest block to time, in seconds.
        warmup: untimed calls per function before the sizing call.
        device: whose clock times the blocks ("cuda" uses CUDA events).

    Returns:
        name → ``Timing`` (seconds per call, one sample per round), in the order of ``fns``.

    Raises:
        ValueError: no function, ``rounds`` < 1, ``warmup`` < 0 or ``min_block_s`` ≤ 0.
    """
    if not fns:
        raise ValueError("time_interleaved needs at least one function")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds={rounds!r}; expected a positive int")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r}; expected a non-negative int")
    if not (isinstance(min_block_s, (int, float)) and min_block_s > 0):
        raise ValueError(f"min_block_s={min_block_s!r}; expected a positive number of seconds")
    device = torch.device(device)
    names = list(fns)
    calls = {}
    for name in names:
        for _ in range(warmup):
            fns[name]()
        once = max(_time_block(fns[name], 1, device), 1e-9)
        calls[name] = max(1, round(min_block_s / once))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            samples[name].append(max(_time_block(fns[name], calls[name], device), 1e-12) / calls[name])
    return {name: Timing(samples=tuple(samples[name]), calls_per_round=calls[name]) for name in names}
