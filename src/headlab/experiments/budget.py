"""How every experiment runs: its seed, its number of steps (default, or quick default), one thread."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["check_seed", "resolve_steps", "single_thread"]


@contextmanager
def single_thread() -> Iterator[None]:
    """Run the body with one intra-op torch thread, restoring the caller's setting afterwards.

    The experiments' models are tiny: a second thread gains little on an idle CPU and, when the
    CPU is shared, threads waiting for each other can make a run many times slower. And the
    number of threads changes the order of some float reductions, so with it fixed a seed gives
    the same numbers on machines with different numbers of cores.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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
