"""Checks on random inputs: how far a module is from what the recovered maps assume.

The maps of ``headlab.audit.probes`` are exact when the scores are a bilinear form of the inputs
and the output is linear in the values at fixed patterns. These checks measure both, and the
rest of what the verdict rests on:

- ``bilinear_residual``: scores on a random input against the recovered W_QK and w;
- ``output_residual``: with every head's pattern fixed to the identity, the output must be
  affine in the input: f(x₁ + x₂) − f(x₁) − f(x₂) + f(0), relative to the output's size;
- ``bypass_change``: with every pattern set to zero, the output must not depend on the input
  (else something reaches the output around the attention, e.g. a residual connection);
- ``causal_changes``: change the last input only and see which outputs move;
- ``same_slice_spread``: heads' patterns on an input whose slices are all the same.

Axis legend: x ``(pos, d_model)``; scores and patterns ``(head, query_pos, key_pos)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headlab.audit.probes import Observation, Prober, QKForms

__all__ = ["bilinear_residual", "bypass_change", "causal_changes", "output_residual", "same_slice_spread"]


def bilinear_residual(seen: Observation, forms: QKForms, x: Tensor) -> float:
    """How far the scores ``seen`` on ``x`` are from the recovered forms, relative to the scores' own size.

    Compares s(x_i, x_j) − s(x_i, x_0) observed and predicted on the visible pairs; 0 (to
    rounding) for linear projections, larger for position-dependent or nonlinear scores.
    """
    predicted = torch.einsum("id,hde,je->hij", x, forms.W_QK, x) + (x @ forms.w.T).T[:, None, :]
    visible = seen.pattern > 0
    observed = torch.where(visible, seen.scores - seen.scores[..., :1], 0.0)
    predicted = torch.where(visible, predicted - predicted[..., :1], 0.0)
    return float((observed - predicted).abs().max()) / max(1.0, float(observed.abs().max()))


def _identity(pattern: Tensor, first_head: int) -> Tensor:
    return torch.eye(pattern.shape[-1], dtype=pattern.dtype).expand_as(pattern).clone()


def _nothing(pattern: Tensor, first_head: int) -> Tensor:
    return torch.zeros_like(pattern)


def output_residual(prober: Prober, length: int) -> tuple[float, frozenset[str]]:
    """Superposition at fixed (identity) patterns: 0 to rounding when the output is affine in the input.

    Returns:
        The residual over max(1, the largest output), and the steps the forward saw between the
        patterns and the output (``headlab.audit.lineage``).
    """
    a, b = prober.random(length), prober.random(length)
    runs = [prober.observe(x, override=_identity) for x in (a + b, a, b, prober.zeros(length))]
    residual = runs[0].output - runs[1].output - runs[2].output + runs[3].output
    scale = max(1.0, *(float(r.output.abs().max()) for r in runs))
    return float(residual.abs().max()) / scale, runs[0].output_steps


def bypass_change(prober: Prober, x: Tensor) -> tuple[float, Tensor]:
    """With every pattern set to zero: the largest output change between ``x`` and a zero input.

    Returns:
        The change, and the output ``(d_model,)`` of a position that attends to nothing (zero
        input): what a query whose keys are all masked gets when the module zeroes its pattern.
    """
    silent = [prober.observe(t, override=_nothing).output for t in (x, prober.zeros(x.shape[0]))]
    return float((silent[0] - silent[1]).abs().max()), silent[1][0]


def causal_changes(prober: Prober, x: Tensor, **options: object) -> tuple[float, float]:
    """Change the last input only: the largest output change before the last position, and at it.

    Args:
        prober: runs the module (nothing intercepted).
        x: the input ``(pos, d_model)``.
        options: passed on to ``Prober.plain`` (a mask, keyword arguments).
    """
    changed = x.clone()
    changed[-1] = prober.random(1)[0]
    before, after = prober.plain(x, **options), prober.plain(changed, **options)
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
