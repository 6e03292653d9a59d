"""Taps that take the selected heads' tensors for as long as a ``with`` lasts.

A tap (``headlab.layer.taps.Tap``) on an attention site hands the selected heads' tensors to a
sink after each forward; ``tapped`` sets taps and always removes them. What a tap can take is
``headlab.layer.taps.TAKE``, checked by ``check_take``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from headlab.layer.taps import TAKE, Tap, TapOutput, check_take
from headlab.models import AttentionSite

__all__ = ["TAKE", "check_take", "tapped"]


@contextmanager
def tapped(
    sites: Sequence[AttentionSite],
    selection: Mapping[int, Sequence[int]],
    take: Sequence[str],
    sink: Callable[[int, TapOutput], None],
) -> Iterator[None]:
    """Tap the selected heads of the selected layers for the duration of the ``with`` block.

    Args:
        sites: the model's attention sites, in layer order.
        selection: ``{layer: heads}`` (``HeadedModel.heads``).
        take: names from ``TAKE``.
        sink: receives ``(layer, TapOutput)`` after each tapped forward.

    Raises:
        RuntimeError: a selected module already has a tap (another capture on the same model).
    """
    busy = [layer for layer in selection if sites[layer].tap is not None]
    if busy:
        raise RuntimeError(f"layers {busy} already have a tap: is another capture running on this model?")
    try:
        for layer, heads in selection.items():
            chosen: dict[str, Any] = {name: list(heads) for name in take}
            sites[layer].tap = Tap(sink=sink, **chosen)
        yield
    finally:
        for layer in selection:
            sites[layer].tap = None


def renamed_take(take: str | Sequence[str], old: str | Sequence[str] | None, old_name: str,
                 where: str) -> tuple[str, ...]:
    """``take`` checked, or the deprecated keyword a caller still passes under its old name (with a warning).

    Args:
        take: the ``take=`` argument.
        old: the deprecated ``names=`` / ``what=`` argument, or None.
        old_name: its name.
        where: the function's name, for the warning.
    """
    if old is not None:
        warnings.warn(f"{where}({old_name}=...) is deprecated: it is take=...; {old_name}= goes in the next release",
                      DeprecationWarning, stacklevel=3)
        take = old
    return check_take(take)


def __getattr__(name: str) -> Any:
    renamed = {"WHAT": ("TAKE", TAKE), "check_what": ("check_take", check_take)}
    if name in renamed:  # one release with a warning
        new, value = renamed[name]
        warnings.warn(f"headlab.capture.taps.{name} is deprecated: it is {new}", DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
