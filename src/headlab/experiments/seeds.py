"""Repeats over seeds: which seeds an experiment runs, the spread of a number across them, and when they
reached a target."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Spread", "describe_reached", "mean_reached", "rank_key", "seeds_from"]


def seeds_from(seed: int, n: int) -> list[int]:
    """The ``n`` consecutive seeds an experiment with seed ``seed`` repeats its runs over."""
    return [seed + i for i in range(n)]


@dataclass(frozen=True)
class Spread:
    """Mean and sample standard deviation of one number over seeds.

    Attributes:
        mean: the mean.
        std: the sample standard deviation (n − 1); 0 for a single value.
        values: the values, in seed order.
    """

    mean: float
    std: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """Raises: ValueError on no values."""
        if not values:
            raise ValueError("a spread needs at least one value")
        values = tuple(float(v) for v in values)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(mean=statistics.fmean(values), std=std, values=values)

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.std:.3f}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["values"] = list(self.values)
        return out


def mean_reached(steps: Sequence[int | None]) -> float | None:
    """The mean over the seeds that reached a target of the step they reached it at; None if none did."""
    got = [s for s in steps if s is not None]
    return sum(got) / len(got) if got else None


def describe_reached(steps: Sequence[int | None]) -> str:
    """``"120 (3/3)"``: mean step over the seeds that got there (and how many did), or ``"never (0/3)"``."""
    mean, got = mean_reached(steps), sum(s is not None for s in steps)
    return f"never (0/{len(steps)})" if mean is None else f"{mean:.0f} ({got}/{len(steps)})"


def rank_key(accuracy: Spread, steps: Sequence[int | None]) -> tuple[float, int, float]:
    """Sort key, best first: higher mean accuracy (to 0.1%), then more seeds reaching the target, then sooner."""
    mean = mean_reached(steps)
    return (-round(accuracy.mean, 3), -sum(s is not None for s in steps), float("inf") if mean is None else mean)
