"""What can be taken of a head during a forward, and the tap that takes it.

One word names what to take of a head everywhere in headlab (``run_with_cache(take=…)``,
``capture(take=…)``, a ``Tap``, the command line's ``--take``): one or more of ``TAKE``.

A tap sits on a site (``headlab.models.AttentionSite``): the site of an attention module of a
transformers model, or of headlab's own ``MultiHeadAttention``. Either attention computes what the
tap asks for, for the tapped heads only, and hands it to the tap's sink after each forward.
The site is the module's attribute ``SITE_ATTRIBUTE`` (a plain object, not in the ``state_dict``).

Axis legend:
    pattern  (batch, head, query_pos, key_pos)
    z        (batch, head, query_pos, d_head_v)   after the site's gates
    result   (batch, head, query_pos, d_model)    a head's z through its slice of the output projection
    q        (batch, head, query_pos, d_head)     after the module's positions and norms
    k, v     (batch, head, key_pos, d_head | d_head_v)  the key/value head each query head reads
``head`` runs over the tapped heads, in the order the tap lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from headlab.layer.pattern_rows import PatternRows

TAKE = ("pattern", "z", "result", "q", "k", "v")  # what can be taken of a head
SITE_ATTRIBUTE = "headlab_site"  # the attribute of an attention module that holds its site


def check_take(take: str | Sequence[str]) -> tuple[str, ...]:
    """``take`` as a tuple of names from ``TAKE``, in the order given, without repeats.

    Raises:
        ValueError: an unknown name, or nothing to take.
    """
    names = (take,) if isinstance(take, str) else tuple(take)
    unknown = [name for name in names if name not in TAKE]
    if unknown or not names:
        raise ValueError(f"take={take!r}; expected one or more of {TAKE}")
    return tuple(dict.fromkeys(names))


@dataclass
class TapOutput:
    """What one tapped forward of one layer hands to the tap's sink, for the tapped heads only.

    Attributes:
        pattern, z, result, q, k, v: see the module legend; None where not taken.
        pattern_rows: the patterns kept as what makes them (``headlab.layer.pattern_rows.PatternRows``), in place of
            ``pattern`` when the tap asks for them in row blocks (``Tap.blocks``).
    """

    pattern: Tensor | None = None
    z: Tensor | None = None
    result: Tensor | None = None
    q: Tensor | None = None
    k: Tensor | None = None
    v: Tensor | None = None
    pattern_rows: PatternRows | None = None


@dataclass
class Tap:
    """What to take out of one layer's forward, and where to send it.

    Attributes:
        sink: called as ``sink(layer, TapOutput)`` after each forward of the layer.
        pattern, z, result, q, k, v: the query heads to take each for (sorted, unique), or None.
        blocks: hand the patterns as ``TapOutput.pattern_rows`` (formed a block of query rows at a time by whoever
            reads them) instead of whole ``TapOutput.pattern``: memory linear in the length, not quadratic.
    """

    sink: Callable[[int, TapOutput], None]
    pattern: list[int] | None = None
    z: list[int] | None = None
    result: list[int] | None = None
    q: list[int] | None = None
    k: list[int] | None = None
    v: list[int] | None = None
    blocks: bool = False


class HeadSite(Protocol):
    """What an attention computation reads of its module's site on every call (``headlab.models.AttentionSite``)."""

    layer: int
    tap: Tap | None

    @property
    def idle(self) -> bool:
        """Nothing to take, gate or restrict: the call runs as if no site were there."""

    def gate(self, z: Tensor) -> Tensor:
        """z ``(batch, n_heads, query_pos, d_head_v)`` after the site's gates."""

    def gate_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q ``(batch, n_heads, query_pos, d_head)``, k and v ``(batch, n_kv_heads, key_pos, d)`` after the
        site's per-call input gates (replacements and deltas on some heads' inputs)."""

    def window_blocked(self, q_len: int, k_len: int, *, offset: int, device: object) -> Tensor | None:
        """``(n_heads, query_pos, key_pos)`` bool, True where a windowed head drops a key; None without windows."""
