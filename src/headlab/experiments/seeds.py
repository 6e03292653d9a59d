"""Repeats over seeds: which seeds an experiment runs, and the spread of a number across them."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Spread", "seeds_from"]


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
