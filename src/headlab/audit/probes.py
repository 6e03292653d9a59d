"""Probing a running attention module with chosen inputs: the maps of each head.

Every probe is one forward of self-attention over a batch of one, read through the
``AttentionInterceptor``; the inputs are basis vectors where a map is to be recovered exactly:

- ``qk_forms``: one forward over ``[0, e_1 … e_d, e_1 … e_d, 0]``. The query e_a at position
  d+a sees the key 0 (position 0) and every key e_b (positions 1…d), causal mask or not, so
  s(e_a, e_b) − s(e_a, 0) = W_QK[a, b] + w[b] and s(0, e_b) − s(0, 0) = w[b]. Terms that only
  depend on the query (x_q·u + c) cancel in these differences, as they do in the softmax.
- ``value_maps``: where the call shows z, one forward over ``[0, e_1 … e_d]`` with every head's
  pattern replaced by the identity (z row 1+a − row 0 = e_a W_V), W_O solved from z and the output,
  checked on heads 0 and n−1 run alone; otherwise one forward per head with that head's pattern
  replaced by the identity and every other head's by zeros, so output row 1+a − row 0 is e_a W_OV[h]
  (= e_a W_V[h] W_O[h]), and the call's weighted values show the head's own values v_h(e_a).

A module that refuses that many positions (a causal-mask buffer of a fixed block size, say) is
probed with the basis cut into blocks, halving the block until it runs: keys e_K and queries e_Q
of two blocks per forward, ``[0, e_K, e_Q, 0]``, and ``[0, e_Q]`` for the values. A layer that
computes its heads in several attention calls (a loop over heads, a list of head modules) is read
as one: the calls' heads are stacked in the order computed. The checks on random inputs are in
``headlab.audit.checks``.

Exact for linear projections. Axis legend: x ``(pos, d_model)``; scores and patterns
``(head, query_pos, key_pos)``; z ``(query_pos, every head's value entries)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from headlab.audit.calling import Detected, run_module
from headlab.audit.errors import AuditError
from headlab.audit.intercept import AttentionCall, Override

__all__ = ["Observation", "Prober", "QKForms", "ValueMaps", "qk_forms", "value_maps"]

_LAYOUT_LENGTHS = (6, 9)  # two self-attention lengths: the axes whose size follows them are positions
T = TypeVar("T")


@dataclass(frozen=True)
class Observation:
    """One probe forward, read in canonical form and in the probing dtype.

    Scores, pattern and z are assembled from the layer's calls when first read: a probe that
    needs only the output (or only the scores) does not pay for copying the rest.

    Attributes:
        output: ``(pos, d_model)``.
        calls: the attention calls that make up the layer, each with the query axes of its
            scores and of its z (None where the call fixes them or z is not seen).
        dtype: the probing dtype.
        source: the torch function that computed the attention (the first call's).
        q_width: the query width the calls show (the same in each), else None.
        kv_heads: key/value heads the calls received, where each shows them, else None.
        score_steps: what keeps the scores from being bilinear (``headlab.audit.lineage``).
        output_steps: what keeps the output from being linear in the values.
    """

    output: Tensor
    calls: tuple[tuple[AttentionCall, int | None, int | None], ...]
    dtype: torch.dtype
    source: str
    q_width: int | None
    kv_heads: int | None
    score_steps: frozenset[str]
    output_steps: frozenset[str]

    @cached_property
    def scores(self) -> Tensor:
        """``(head, pos, pos)``, masks included."""
        return torch.cat([c.canonical_scores(axis) for c, axis, _ in self.calls]).to(self.dtype)

    @cached_property
    def pattern(self) -> Tensor:
        """``(head, pos, pos)`` as handed on to the values."""
        return torch.cat([c.canonical_pattern(axis) for c, axis, _ in self.calls]).to(self.dtype)

    @cached_property
    def z(self) -> Tensor | None:
        """``(pos, n)``: every head's weighted values for each query, or None when not seen."""
        n = self.output.shape[0]
        zs = []
        for call, _, z_axis in self.calls:
            axis = call.z_query_axis if call.z_query_axis is not None else z_axis
            if call.z is None or axis is None:
                return None
            zs.append(call.z.movedim(axis, 0).reshape(n, -1))
        return torch.cat(zs, dim=1).to(self.dtype)


class Prober:
    """Runs one module on chosen inputs and reads the attention calls that make up its layer.

    Args:
        module: the module to probe (a copy, in eval mode).
        detected: how to call it and which attention calls are the layer.
        dtype: dtype of the probe inputs.
        seed: seeds the random inputs.
        on_observe: called after each forward (progress display).

    Attributes:
        coarsest: the least precise floating dtype any input-dependent tensor took in the
            forwards so far (``dtype`` when the module never computes in a coarser one).
    """

    def __init__(self, module: nn.Module, detected: Detected, *, dtype: torch.dtype, seed: int,
                 on_observe: Callable[[], None] | None = None) -> None:
        self.module, self.caller, self.d_model = module, detected.caller, detected.d_model
        self.indices, self.dtype = detected.attention_calls, dtype
        self.generator = torch.Generator().manual_seed(seed)
        self.on_observe = on_observe
        self.coarsest = dtype
        self.query_axes: dict[int, int | None] = dict.fromkeys(self.indices)  # of a softmax call's scores
        self.z_axes: dict[int, int | None] = dict.fromkeys(self.indices)  # of a softmax call's weighted values
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

    def observe(self, x: Tensor, *, override: Callable[[Tensor, int], Tensor] | None = None,
                **options: Any) -> Observation:
        """Run self-attention over ``x`` ``(pos, d_model)``, optionally replacing the canonical patterns.

        Args:
            x: the input.
            override: ``(pattern, first_head)`` → replacement, called once per call of the layer
                (``headlab.audit.intercept.Override``).
            options: passed on to the call (a mask, keyword arguments).
        """
        steer = None if override is None else Override(self.query_axes, override)
        forward = run_module(self.module, self.caller, x[None], override=steer, **options)
        if self.on_observe is not None:
            self.on_observe()
        self._note(forward.coarsest)
        n, calls = x.shape[0], forward.calls
        if len(calls) <= max(self.indices) or any(calls[i].scores.shape[calls[i].key_axis] != n for i in self.indices):
            raise AuditError("no-attention", f"{self.caller.signature} computed no attention over the "
                             f"{n} positions of a probe, although it did over the detection inputs")
        layer = [calls[i] for i in self.indices]
        widths = {c.q_width for c in layer}
        kv_heads = [c.kv_heads for c in layer if c.kv_heads is not None]  # None where a call does not say
        return Observation(
            output=forward.output[0].to(self.dtype),
            calls=tuple((calls[i], self.query_axes[i], self.z_axes[i]) for i in self.indices), dtype=self.dtype,
            source=layer[0].source, q_width=widths.pop() if len(widths) == 1 else None,
            kv_heads=sum(kv_heads) if len(kv_heads) == len(layer) else None,
            score_steps=frozenset().union(*(c.score_steps for c in layer)), output_steps=forward.output_steps)

    def raw(self, x: Tensor, **options: Any) -> object:
        """What the module returns for ``x`` ``(pos, d_model)`` with nothing intercepted.

        Args:
            x: the input.
            options: passed on to the call (``Caller.__call__``: a mask, keyword arguments).

        Raises:
            AuditError: ``raised``: the module raised.
        """
        q = x[None]
        try:
            with torch.no_grad():
                return self.caller(self.module, q, q, q, **options)
        except Exception as exc:  # the user's code
            raise AuditError("raised", f"{self.caller.signature} raised {type(exc).__name__}: {exc}") from exc

    def plain(self, x: Tensor, **options: object) -> Tensor:
        """The module's output ``(pos, d_model)`` on ``x`` with nothing intercepted (``raw``'s options)."""
        return self.caller.output(self.raw(x, **options), x[None])[0].to(self.dtype)

    def _note(self, dtype: torch.dtype | None) -> None:
        if dtype is not None and torch.finfo(dtype).eps > torch.finfo(self.coarsest).eps:
            self.coarsest = dtype

    def _find_layout(self) -> None:
        """Find the query axes of softmax calls' scores and values: the axes that follow the length."""
        runs = []
        for length in _LAYOUT_LENGTHS:
            forward = run_module(self.module, self.caller, self.random(length)[None])
            self._note(forward.coarsest)
            if len(forward.calls) <= max(self.indices):
                raise AuditError("no-attention", f"{self.caller.signature} computed no attention over "
                                 f"{length} positions of self-attention")
            runs.append(forward.calls)
        for i in self.indices:
            first, call = runs[0][i], runs[1][i]
            if call.query_axis is not None:
                continue
            shapes = (first.scores.shape, call.scores.shape)
            moving = _moving_axes(*shapes)
            if moving is None or len(moving) != 2 or call.key_axis not in moving \
                    or shapes[1][call.key_axis] != _LAYOUT_LENGTHS[1]:
                raise AuditError("unsupported", f"the scores handed to {call.source} have shapes {tuple(shapes[0])} "
                                 f"and {tuple(shapes[1])} for {_LAYOUT_LENGTHS[0]} and {_LAYOUT_LENGTHS[1]} positions; "
                                 "expected one query axis and one key axis that follow the number of positions")
            self.query_axes[i] = next(axis for axis in moving if axis != call.key_axis)
            if first.z is not None and call.z is not None:
                z_moving = _moving_axes(first.z.shape, call.z.shape)
                self.z_axes[i] = z_moving[0] if z_moving is not None and len(z_moving) == 1 else None


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
                if W_QK is None or w is None:
                    W_QK, w = scores.new_zeros(scores.shape[0], d, d), scores.new_zeros(scores.shape[0], d)
                W_QK[:, queries, keys] = relative - w_keys[:, None, :]
                w[:, keys] = w_keys
        assert W_QK is not None and w is not None  # blocks is not empty
        return QKForms(W_QK=W_QK, w=w)

    forms = prober.in_blocks(probe)
    if not (torch.isfinite(forms.W_QK).all() and torch.isfinite(forms.w).all()):
        raise AuditError("unsupported", "the module masks earlier key positions that the probes need (only "
                         "no mask or a causal mask can be probed)")
    return forms


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
    """Recover every head's W_OV (and values, if shown): from every head's z at once where the call shows
    z and the output is linear in it (``_values_at_once``), else with one steered forward per head and block."""
    return _values_at_once(prober, n_heads) or _values_head_by_head(prober, n_heads)


def _only_head(h: int) -> Callable[[Tensor, int], Tensor]:
    """An override: head ``h``'s pattern replaced by the identity (each position attends to itself), every
    other head's by zeros."""
    def steer(pattern: Tensor, first_head: int) -> Tensor:
        steered = torch.zeros_like(pattern)
        if first_head <= h < first_head + pattern.shape[0]:
            steered[h - first_head] = torch.eye(pattern.shape[-1], dtype=pattern.dtype)
        return steered
    return steer


def _every_head(pattern: Tensor, first_head: int) -> Tensor:
    """An override: every head's pattern replaced by the identity."""
    return torch.eye(pattern.shape[-1], dtype=pattern.dtype).expand_as(pattern).clone()


def _steered(prober: Prober, blocks: list[slice], steer: Callable[[Tensor, int], Tensor]
             ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Over ``[0, e_block]`` per block with ``steer``: the outputs and z of every e_a relative to the zero
    input's, ``(d, d_model)`` and ``(d, n)``, and the zero input's z ``(n,)``; both z None when not shown."""
    eye, zero = prober.basis(), prober.zeros(1)
    outputs: list[Tensor] = []
    zs: list[Tensor] | None = []
    z_zero: Tensor | None = None
    for block in blocks:
        seen = prober.observe(torch.cat([zero, eye[block]]), override=steer)
        outputs.append(seen.output[1:] - seen.output[:1])
        if seen.z is not None and zs is not None:
            zs.append(seen.z[1:] - seen.z[:1])
            z_zero = seen.z[0] if z_zero is None else z_zero
        else:
            zs = None
    return torch.cat(outputs), None if zs is None else torch.cat(zs), None if zs is None else z_zero


def _values_at_once(prober: Prober, n_heads: int) -> ValueMaps | None:
    """Every head's values from one forward per block with every head attending to itself, and the map
    from z to the output solved from them (z = x W_V when each head attends to itself; output = z W_O).

    Used only where it is exact: z is shown, splits into ``n_heads`` equal head-major slices, has no more
    entries than d_model and determines the output; heads 0 and n−1 steered alone (one forward per block
    each) must give what the solved map predicts, so a residual path or a layout other than head-major
    sends the probe back to one forward per head (``_values_head_by_head``). None then.
    """
    def probe(blocks: list[slice]) -> tuple[list[slice], tuple[Tensor, Tensor | None, Tensor | None]]:
        return blocks, _steered(prober, blocks, _every_head)

    blocks, (output, z, z_zero) = prober.in_blocks(probe)
    if z is None or z_zero is None:  # both None where z is not shown
        return None
    d, n = z.shape
    if n % n_heads or n > d:
        return None
    width = n // n_heads
    # z = QR, W_O = R⁻¹ Qᵀ output (QR and a triangular solve: the same bits on every run, unlike lstsq)
    q, r = torch.linalg.qr(z)
    diagonal = r.diagonal().abs()
    if n == 0 or float(diagonal.min()) <= torch.finfo(prober.dtype).eps * d * float(diagonal.max()):
        return None  # z does not determine a map to the output
    W_O = torch.linalg.solve_triangular(r, q.T @ output, upper=True)  # (n, d_model)
    tolerance = torch.finfo(prober.dtype).eps ** 0.5 * max(float(output.abs().max()), 1.0)
    if float((z @ W_O - output).abs().max()) > tolerance:
        return None
    columns = [slice(h * width, (h + 1) * width) for h in range(n_heads)]
    for h in {0, n_heads - 1}:
        out_h, z_h, _ = _steered(prober, blocks, _only_head(h))
        if z_h is None:
            return None
        outside = torch.ones(n, dtype=torch.bool)
        outside[columns[h]] = False
        if (bool((z_h[:, outside] != 0).any()) or float((z_h - z)[:, columns[h]].abs().max()) > tolerance
                or float((z[:, columns[h]] @ W_O[columns[h]] - out_h).abs().max()) > tolerance):
            return None
    values = []
    for cols in columns:
        own = (z[:, cols] != 0).any(dim=0) | (z_zero[cols] != 0)
        values.append(z[:, cols][:, own])
    return ValueMaps(W_OV=torch.stack([z[:, cols] @ W_O[cols] for cols in columns]), values=values,
                     value_width=width)


def _values_head_by_head(prober: Prober, n_heads: int) -> ValueMaps:
    """Every head's W_OV (and values, if shown) with one steered forward per head and block."""
    def probe(blocks: list[slice]) -> ValueMaps:
        ov: list[Tensor] = []
        values: list[Tensor] | None = []
        width: int | None = None
        for h in range(n_heads):
            output, relative, z_zero = _steered(prober, blocks, _only_head(h))
            ov.append(output)
            if values is None or relative is None or z_zero is None:  # relative and z_zero: both or neither
                values = None
                continue
            own = (relative != 0).any(dim=0) | (z_zero != 0)  # the other heads' entries are zero
            values.append(relative[:, own])
            width = relative.shape[1] // n_heads if relative.shape[1] % n_heads == 0 else None
        return ValueMaps(W_OV=torch.stack(ov), values=values, value_width=width if values is not None else None)

    return prober.in_blocks(probe)
