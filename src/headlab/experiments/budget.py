"""The arguments every experiment takes: a seed and a number of steps (default, or quick default)."""

from __future__ import annotations

__all__ = ["check_seed", "resolve_steps"]


def check_seed(seed: object) -> int:
    """Return ``seed`` if it is an int in ``[0, 2**63)``.

    Raises:
        ValueError: anything else (the message names the value).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed={seed!r} must be an int in [0, 2**63)")
    return seed


def resolve_steps(steps: object, *, default: int, quick_default: int, quick: bool) -> int:
    """The number of steps to run: ``steps`` if given, else the default (the quick one when ``quick``).

    Raises:
        ValueError: ``steps`` is given and is not a positive int.
    """
    if steps is None:
        return quick_default if quick else default
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r} must be a positive int (or None for the default)")
    return steps
