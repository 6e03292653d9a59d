"""Probing a running attention module with chosen inputs.

Every probe is one forward of self-attention over a batch of one, read through the
``AttentionInterceptor``; the inputs are basis vectors where a map is to be recovered exactly:

- ``qk_forms``: one forward over ``[0, e_1 … e_d, e_1 … e_d, 0]``. The query e_a at position
  d+a sees the key 0 (position 0) and every key e_b (positions 1…d), causal mask or not, so
  s(e_a, e_b) − s(e_a, 0) = W_QK[a, b] + w[b] and s(0, e_b) − s(0, 0) = w[b]. Terms that only
  depend on the query (x_q·u + c) cancel in these differences, as they do in the softmax.
- ``value_maps``: one forward per head over ``[0, e_1 … e_d]`` with that head's pattern replaced
  by the identity and every other head's by zeros, so output row 1+a − row 0 is e_a W_OV[h]
  (= e_a W_V[h] W_O[h]), and the call's weighted values show the head's own values v_h(e_a).

A module that refuses that many positions (a causal-mask buffer of a fixed block size, say) is
probed with the basis cut into blocks, halving the block until it runs: keys e_K and queries e_Q
of two blocks per forward, ``[0, e_K, e_Q, 0]``, and ``[0, e_Q]`` for the values.
- ``bilinear_residual``, ``causal_changes``, ``same_slice_spread``: checks on random inputs.

Exact for linear projections; ``bilinear_residual`` measures how far a module (e.g. one with
position-dependent scores) is from that. Axis legend: x ``(pos, d_model)``; scores and patterns
``(head, query_pos, key_pos)``; z ``(query_pos, every head's value entries)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor, nn

from headlab.audit.calling import Detected, run_module
from headlab.audit.errors import AuditError
from headlab.audit.intercept import AttentionCall, Override

__all__ = ["Observation", "Prober", "QKForms", "ValueMaps", "bilinear_residual", "causal_changes", "qk_forms",
           "same_slice_spread", "value_maps"]

_LAYOUT_LENGTHS = (6, 9)  # two self-attention lengths: the axes whose size follows them are positions
T = TypeVar("T")


@dataclass(frozen=True)
class Observation:
    """One probe forward, read in canonical form.

    Attributes:
        output: ``(pos, d_model)``.
        scores: ``(head, pos, pos)``, masks included.
        pattern: ``(head, pos, pos)`` as handed on to the values.
        z: ``(pos, n)``: every head's weighted values for each query, or None when not seen.
        call: the raw attention call.
    """

    output: Tensor
    scores: Tensor
    pattern: Tensor
    z: Tensor | None
    call: AttentionCall


class Prober:
    """Runs one module on chosen inputs and reads its one attention call.

    Args:
        module: the module to probe (a copy, in eval mode).
        detected: how to call it and which attention call is the attention.
        dtype: dtype of the probe inputs.
        seed: seeds the random inputs.
        on_observe: called after each forward (progress display).
    """

    def __init__(self, module: nn.Module, detected: Detected, *, dtype: torch.dtype, seed: int,
                 on_observe: Callable[[], None] | None = None) -> None:
        self.module, self.caller, self.d_model = module, detected.caller, detected.d_model
        self.index, self.dtype = detected.attention_index, dtype
        self.generator = torch.Generator().manual_seed(seed)
        self.on_observe = on_observe
        self.query_axis: int | None = None  # of a softmax call's scores
        self.z_axis: int | None = None  # of a softmax call's weighted values
        self.block = detected.d_model  # basis vectors per probe forward (halved if the module refuses)
        self._find_layout()

    def random(self, length: int, width: int | None = None) -> Tensor:
        """Standard normal ``(length, width or d_model)`` from the prober's generator."""
        return torch.randn(length, width or self.d_model, generator=self.generator, dtype=self.dtype)

    def basis(self) -> Tensor:
        """The identity ``(d_model, d_model)``: rows are the input basis vectors e_1 … e_d."""
        return torch.eye(self.d_model, dtype=self.dtype)

    def in_blocks(self, probe: Callable[[list[slice]], T]) -> T:
        """Run ``probe(blocks)`` with the basis cut into blocks of ``self.block`` dimensions.

        When the module raises on the probe's length, the block is halved and the probe run
        again (down to one dimension per block); the block that worked is kept for later probes.
        """
        while True:
            blocks = [slice(i, min(i + self.block, self.d_model)) for i in range(0, self.d_model, self.block)]
            try:
                return probe(blocks)
            except AuditError as err:
                if err.kind != "raised" or self.block == 1:
                    raise
                self.block = (self.block + 1) // 2

    def zeros(self, length: int) -> Tensor:
        """Zeros ``(length, d_model)``."""
        return torch.zeros(length, self.d_model, dtype=self.dtype)

    def observe(self, x: Tensor, *, override: Callable[[Tensor], Tensor] | None = None) -> Observation:
        """Run self-attention over ``x`` ``(pos, d_model)``, optionally replacing the canonical pattern."""
        steer = None if override is None else Override(self.index, override, self.query_axis)
        out, calls = run_module(self.module, self.caller, x[None], override=steer)
        if self.on_observe is not None:
            self.on_observe()
        if len(calls) <= self.index or calls[self.index].scores.shape[calls[self.index].key_axis] != x.shape[0]:
            raise AuditError("no-attention", f"{self.caller.signature} computed no attention over the "
                             f"{x.shape[0]} positions of a probe, although it did over the detection inputs")
        call = calls[self.index]
        z_axis = call.z_query_axis if call.z_query_axis is not None else self.z_axis
        z = None if call.z is None or z_axis is None else call.z.movedim(z_axis, 0).reshape(x.shape[0], -1)
        return Observation(output=out[0], scores=call.canonical_scores(self.query_axis),
                           pattern=call.canonical_pattern(self.query_axis), z=z, call=call)

    def plain(self, x: Tensor) -> Tensor:
        """The module's output ``(pos, d_model)`` on ``x`` with nothing intercepted."""
        q = x[None]
        try:
            with torch.no_grad():
                raw = self.caller(self.module, q, q, q)
        except Exception as exc:  # the user's code
            raise AuditError("raised", f"{self.caller.signature} raised {type(exc).__name__}: {exc}") from exc
        return self.caller.output(raw, q)[0]

    def _find_layout(self) -> None:
        """Find the query axes of a softmax call's scores and values: the axes that follow the length."""
        calls = []
        for length in _LAYOUT_LENGTHS:
            _, seen = run_module(self.module, self.caller, self.random(length)[None])
            if len(seen) <= self.index:
                raise AuditError("no-attention", f"{self.caller.signature} computed no attention over "
                                 f"{length} positions of self-attention")
            calls.append(seen[self.index])
        first, call = calls
        if call.query_axis is not None:
            return
        shapes = (first.scores.shape, call.scores.shape)
        moving = _moving_axes(*shapes)
        if moving is None or len(moving) != 2 or call.key_axis not in moving \
                or shapes[1][call.key_axis] != _LAYOUT_LENGTHS[1]:
            raise AuditError("unsupported", f"the scores handed to {call.source} have shapes {tuple(shapes[0])} and "
                             f"{tuple(shapes[1])} for {_LAYOUT_LENGTHS[0]} and {_LAYOUT_LENGTHS[1]} positions; "
                             "expected one query axis and one key axis that follow the number of positions")
        self.query_axis = next(axis for axis in moving if axis != call.key_axis)
        if first.z is not None and call.z is not None:
            z_moving = _moving_axes(first.z.shape, call.z.shape)
            self.z_axis = z_moving[0] if z_moving is not None and len(z_moving) == 1 else None


def _moving_axes(a: torch.Size, b: torch.Size) -> list[int] | None:
    """Axes whose size differs between two shapes of one rank (None if the ranks differ)."""
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y] if len(a) == len(b) else None


@dataclass(frozen=True)
class QKForms:
    """Each head's scores as a bilinear form: s(x_q, x_k) = x_q W_QK x_kᵀ + w·x_k + (query-only terms).

    Attributes:
        W_QK: ``(head, d_model, d_model)``, the softmax scale included.
        w: ``(head, d_model)``.
    """

    W_QK: Tensor
    w: Tensor


def qk_forms(prober: Prober) -> QKForms:
    """Recover every head's W_QK and w from one forward, or one per pair of blocks (module docstring)."""
    d, eye, zero = prober.d_model, prober.basis(), prober.zeros(1)

    def probe(blocks: list[slice]) -> QKForms:
        W_QK = w = None
        for keys in blocks:
            for queries in blocks:
                n_k, n_q = keys.stop - keys.start, queries.stop - queries.start
                scores = prober.observe(torch.cat([zero, eye[keys], eye[queries], zero])).scores  # (head, pos, pos)
                rows = scores[:, 1 + n_k : 1 + n_k + n_q]  # the queries e_a
                relative = rows[:, :, 1 : 1 + n_k] - rows[:, :, :1]  # s(e_a, e_b) − s(e_a, 0)
                last = scores[:, 1 + n_k + n_q]  # the zero query
                w_keys = last[:, 1 : 1 + n_k] - last[:, :1]  # s(0, e_b) − s(0, 0)
                if W_QK is None:
                    W_QK, w = scores.new_zeros(scores.shape[0], d, d), scores.new_zeros(scores.shape[0], d)
                W_QK[:, queries, keys] = relative - w_keys[:, None, :]
                w[:, keys] = w_keys
        return QKForms(W_QK=W_QK, w=w)

    forms = prober.in_blocks(probe)
    if not (torch.isfinite(forms.W_QK).all() and torch.isfinite(forms.w).all()):
        raise AuditError("unsupported", "the module masks earlier key positions that the probes need (only "
                         "no mask or a causal mask can be probed)")
    return forms


def bilinear_residual(prober: Prober, forms: QKForms, x: Tensor) -> float:
    """How far the scores on ``x`` are from the recovered forms, relative to the scores' own size.

    Compares s(x_i, x_j) − s(x_i, x_0) observed and predicted on the visible pairs; 0 (to
    rounding) for linear projections, larger for position-dependent or nonlinear scores.
    """
    seen = prober.observe(x)
    predicted = torch.einsum("id,hde,je->hij", x, forms.W_QK, x) + (x @ forms.w.T).T[:, None, :]
    visible = seen.pattern > 0
    observed = torch.where(visible, seen.scores - seen.scores[..., :1], 0.0)
    predicted = torch.where(visible, predicted - predicted[..., :1], 0.0)
    return float((observed - predicted).abs().max()) / max(1.0, float(observed.abs().max()))


@dataclass(frozen=True)
class ValueMaps:
    """Each head's value side.

    Attributes:
        W_OV: ``(head, d_model, d_model)``: e_a W_OV[h] is what head h adds to the output for
            each unit of attention on an input e_a (value and output projections composed).
        values: per head, ``(d_model, width)``: v_h(e_a) − v_h(0), the head's own values, when
            the call shows them; else None.
        value_width: entries of z per head and query (the value head size), when shown.
    """

    W_OV: Tensor
    values: list[Tensor] | None
    value_width: int | None


def value_maps(prober: Prober, n_heads: int) -> ValueMaps:
    """Recover every head's W_OV (and values, if shown) with steered forwards, one per head and block."""
    eye, zero = prober.basis(), prober.zeros(1)

    def probe(blocks: list[slice]) -> ValueMaps:
        ov, values, width = [], [], None
        for h in range(n_heads):
            def only_head_h(pattern: Tensor, h: int = h) -> Tensor:
                steered = torch.zeros_like(pattern)
                steered[h] = torch.eye(pattern.shape[-1], dtype=pattern.dtype)  # each position attends to itself
                return steered

            outputs, zs = [], []
            for block in blocks:
                seen = prober.observe(torch.cat([zero, eye[block]]), override=only_head_h)
                outputs.append(seen.output[1:] - seen.output[:1])
                zs.append(None if seen.z is None else (seen.z[1:] - seen.z[:1], seen.z[0]))
            ov.append(torch.cat(outputs))
            if values is None or any(z is None for z in zs):
                values = None
                continue
            relative = torch.cat([z for z, _ in zs])  # (d, every head's entries); the other heads' are zero
            own = (relative != 0).any(dim=0) | (zs[0][1] != 0)
            values.append(relative[:, own])
            width = relative.shape[1] // n_heads if relative.shape[1] % n_heads == 0 else None
        return ValueMaps(W_OV=torch.stack(ov), values=values, value_width=width if values is not None else None)

    return prober.in_blocks(probe)


def causal_changes(prober: Prober, x: Tensor) -> tuple[float, float]:
    """Change the last input only: the largest output change before the last position, and at it."""
    changed = x.clone()
    changed[-1] = prober.random(1)[0]
    before, after = prober.plain(x), prober.plain(changed)
    return float((before[:-1] - after[:-1]).abs().max()), float((before[-1] - after[-1]).abs().max())


def same_slice_spread(prober: Prober, n_heads: int, length: int) -> tuple[float, Tensor] | None:
    """Patterns on an input whose n_heads slices are all the same: largest difference from head 0's.

    Returns:
        The spread and the patterns ``(head, pos, pos)``, or None when n_heads < 2 or does not
        divide d_model.
    """
    if n_heads < 2 or prober.d_model % n_heads:
        return None
    piece = prober.random(length, prober.d_model // n_heads)
    pattern = prober.observe(piece.repeat(1, n_heads)).pattern
    return float((pattern - pattern[:1]).abs().max()), pattern
