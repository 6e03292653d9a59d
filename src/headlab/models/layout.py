"""Which rows of which projection make each head's query, key and value.

Read off one probe forward (``headlab.models.probe``), not from a table of architectures:
the projections inside an attention module that ran before its attention call are sorted by
their output width against the call's geometry, and fused ones are told apart by where the
value (which no rotary touches) sits in their output. The common layouts:

    separate    q (n_heads·d_head), k and v (n_kv_heads·d_head) Linears (most models)
    blocks      one [q | k | v] projection (GPT-2's Conv1D, Phi-3, GPT-BigCode multi-query)
    interleaved one projection with [q_h k_h v_h] per head (GPT-NeoX, GPT-BigCode multi-head)

Axis legend: Linear weights ``(out_features, in_features)``; Conv1D weights
``(in_features, out_features)``; ``W_Q (n_heads, d_in, d_head)``, ``W_K (n_kv_heads, d_in,
d_head)``, ``W_V (n_kv_heads, d_in, d_head_v)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from headlab.models.calls import AttentionCall, ProjectionCall

ROLES = ("q", "k", "v")


@dataclass(frozen=True)
class Segment:
    """Output rows ``start:stop`` of a projection are head ``head``'s ``role`` ("q", "k" or "v")."""

    role: str
    head: int
    start: int
    stop: int


@dataclass(frozen=True)
class Projection:
    """One input projection of an attention module and the head segments of its output.

    Attributes:
        module: the Linear or Conv1D.
        name: its name inside the attention module.
        transposed: True for a Conv1D (weight ``(in_features, out_features)``).
        segments: every output row belongs to exactly one segment.
    """

    module: nn.Module
    name: str
    transposed: bool
    segments: tuple[Segment, ...]

    def rows(self, weight: Tensor, segment: Segment) -> Tensor:
        """``(stop − start, in_features)``: a segment's weight rows in Linear layout (a view)."""
        return weight[:, segment.start:segment.stop].t() if self.transposed else weight[segment.start:segment.stop]


@dataclass(frozen=True)
class Layout:
    """The q/k/v projections of one attention module."""

    projections: tuple[Projection, ...]

    def weights(self, role: str) -> tuple[Tensor, Tensor | None]:
        """Per-head weights and biases of one role.

        Args:
            role: "q", "k" or "v".

        Returns:
            ``(W, b)``: W ``(heads, d_in, d)``; b ``(heads, d)``, or None when the projection has no bias.
        """
        found = sorted(((s.head, p, s) for p in self.projections for s in p.segments if s.role == role),
                       key=lambda item: item[0])
        W = torch.stack([p.rows(cast(Tensor, p.module.weight), s).t() for _, p, s in found])  # a Linear's or Conv1D's
        biases = [getattr(p.module, "bias", None) for _, p, _ in found]
        present = [b for b in biases if b is not None]
        if len(present) < len(biases):
            return W, None
        return W, torch.stack([b[s.start:s.stop] for b, (_, _, s) in zip(present, found)])


def find_layout(call: AttentionCall, *, n_heads: int, n_kv_heads: int, d_head: int, d_head_v: int,
                out_proj: nn.Module | None) -> Layout | str:
    """Read the q/k/v layout of one attention module off its probe call.

    Args:
        call: the module's probe call.
        n_heads, n_kv_heads, d_head, d_head_v: its geometry.
        out_proj: its output projection (left out of the candidates), or None.

    Returns:
        The layout, or a sentence saying why it was not recognised.
    """
    from transformers.pytorch_utils import Conv1D

    names = {id(m): name for name, m in call.module.named_modules() if isinstance(m, (nn.Linear, Conv1D))}
    candidates = [p for p in call.before if id(p.module) in names and p.module is not out_proj]
    if len({id(p.module) for p in candidates}) != len(candidates):
        return "a projection ran twice before the attention call"
    n, g, d, dv = n_heads, n_kv_heads, d_head, d_head_v
    batch, _, length, _ = call.value.shape  # the keys' positions (a cross-attention's queries have their own)
    value = call.value.transpose(1, 2).reshape(batch, length, g * dv)  # (batch, pos, n_kv_heads · d_head_v)
    query = call.query.transpose(1, 2).reshape(batch, call.query.shape[2], n * d)

    def heads(role: str, count: int, size: int, offset: int = 0) -> list[Segment]:
        return [Segment(role, h, offset + h * size, offset + (h + 1) * size) for h in range(count)]

    found: list[Projection] = []
    head_sized: list[ProjectionCall] = []
    for p in candidates:
        out, width = p.output, p.output.shape[-1]
        segments: list[Segment] | None = None
        if width == g * dv and _same(out, value):
            segments = heads("v", g, dv)
        elif width == n * d + g * d + g * dv and _same(out[..., n * d + g * d:], value):
            segments = heads("q", n, d) + heads("k", g, d, n * d) + heads("v", g, dv, n * d + g * d)
        elif n == g and d == dv and width == 3 * n * d and _same(
                out.view(batch, length, n, 3, d)[..., 2, :].reshape(batch, length, n * d), value):
            segments = [Segment(role, h, h * 3 * d + i * d, h * 3 * d + (i + 1) * d)
                        for h in range(n) for i, role in enumerate(ROLES)]
        elif width == g * d + g * dv and _same(out[..., g * d:], value):
            segments = heads("k", g, d) + heads("v", g, dv, g * d)
        elif width in (n * d, g * d):
            head_sized.append(p)
            continue
        else:
            return (f"the projection {names[id(p.module)]!r} has {width} outputs, which is no combination of "
                    f"{n} query and {g} key/value heads of size {d}")
        found.append(Projection(p.module, names[id(p.module)], isinstance(p.module, Conv1D), tuple(segments)))
    roles_found = {s.role for p in found for s in p.segments}
    missing = [r for r in ROLES if r not in roles_found]
    if len(head_sized) != len(missing):
        return (f"found {len(head_sized)} head-sized projections for the {len(missing)} roles {missing} not yet "
                "placed; the layout is not one headlab recognises")
    for p, role in zip(_order(head_sized, missing, query, n=n, g=g, d=d), missing):
        count = n if role == "q" else g
        if p.output.shape[-1] != count * d:
            return (f"the projection {names[id(p.module)]!r} has {p.output.shape[-1]} outputs; as the {role} "
                    f"projection it would need {count * d}")
        found.append(Projection(p.module, names[id(p.module)], isinstance(p.module, Conv1D),
                                tuple(heads(role, count, d))))
    return Layout(tuple(found))


def _order(head_sized: list[ProjectionCall], roles: list[str], query: Tensor, *, n: int, g: int,
           d: int) -> list[ProjectionCall]:
    """Head-sized projections in the order of ``roles``: by width where it tells (grouped-query),
    by an exact match with the query where positions do not change it, else in call order
    (models compute q before k)."""
    if roles == ["q", "k"] and len(head_sized) == 2:
        exact = [p for p in head_sized if p.output.shape[-1] == n * d and _same(p.output, query)]
        if n != g:
            return sorted(head_sized, key=lambda p: p.output.shape[-1] != n * d)
        if len(exact) == 1:
            return sorted(head_sized, key=lambda p: p is not exact[0])
    return head_sized


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)
