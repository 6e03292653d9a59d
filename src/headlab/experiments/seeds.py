"""Repeats over seeds: which seeds an experiment runs, the spread of a number across them, when they
reached a target, and whether one event came before another beyond the seeds' noise."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Gap", "Spread", "describe_reached", "mean_reached", "range_bars", "rank_key", "seeds_from"]


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


def range_bars(spreads: Sequence[Spread]) -> tuple[list[float], list[float]]:
    """Error bars from each mean down to the lowest seed's value and up to the highest's.

    Unlike mean ± std, the bar never leaves the values the seeds took (an accuracy bar never
    passes 1), and with a handful of seeds it shows all of them.

    Returns:
        ``(below, above)``: distances from each mean, as matplotlib's ``yerr`` takes them.
    """
    return ([max(0.0, s.mean - min(s.values)) for s in spreads],
            [max(0.0, max(s.values) - s.mean) for s in spreads])


@dataclass(frozen=True)
class Gap:
    """How many steps event b came after event a, seed by seed, and whether that order is beyond noise.

    One came first only when every seed saw both, at least two seeds ran, and the mean gap is
    larger than both the gaps' spread across seeds (their sample standard deviation) and
    ``resolution`` (the steps between evaluations, below which two events cannot be told apart);
    otherwise the two are not told apart.

    Attributes:
        gaps: per seed, b's step − a's step; None when some seed never saw a or b.
        resolution: steps between evaluations.
    """

    gaps: tuple[int, ...] | None
    resolution: int

    @classmethod
    def of(cls, a: Sequence[int | None], b: Sequence[int | None], *, resolution: int) -> Gap:
        """The gap from ``a`` to ``b`` (each: per seed, the step of the event or None).

        Raises:
            ValueError: a and b of different lengths, or no seeds.
        """
        if len(a) != len(b) or not a:
            raise ValueError(f"a gap needs the same seeds on both sides; got {len(a)} and {len(b)} steps")
        known = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
        return cls(gaps=tuple(y - x for x, y in known) if len(known) == len(a) else None, resolution=resolution)

    @property
    def spread(self) -> Spread | None:
        """Mean ± std of the gaps, or None when some seed never saw an event."""
        return None if self.gaps is None else Spread.of(self.gaps)

    @property
    def first(self) -> str | None:
        """``"a"`` or ``"b"``: the event that came first beyond the noise; None when they are not told apart."""
        spread = self.spread
        if spread is None or len(spread.values) < 2 or abs(spread.mean) <= max(spread.std, self.resolution):
            return None
        return "a" if spread.mean > 0 else "b"

    def __str__(self) -> str:
        spread = self.spread
        return "unknown" if spread is None else f"{spread.mean:+.0f} ± {spread.std:.0f} steps"

    def to_dict(self) -> dict[str, Any]:
        spread = self.spread
        return {"gaps": None if self.gaps is None else list(self.gaps), "resolution": self.resolution,
                "mean": None if spread is None else spread.mean, "std": None if spread is None else spread.std,
                "first": self.first}


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
