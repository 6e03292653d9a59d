"""What can be done to a head's z before the output projection: the one gating mechanism of
headlab's layer and of every attached transformers model (``headlab.models.AttentionSite``).

In this order:

    z_h ← scale[h] · z_h + shift[h]      persistent interventions: mask, scale, zero/mean ablation
    z_h ← gate[h] · z_h                   a per-call gate, differentiable: importance gradients
    z_h ← replacement_h                   a per-call replacement of some heads (at some positions):
                                          activation patching
    z   ← z + delta                       a per-call additive zero with a gradient: attribution patching

A head's inputs (its q, and the k and v of its key/value head) can be replaced and given an additive
zero the same way, before the attention weights are computed (``gate_input``): path patching and
edge attribution (``headlab.circuits``).

Axis legend:
    z            (batch, n_heads, query_pos, d_head_v)
    scale        (n_heads,)           shift (n_heads, d_head_v)
    gate         (n_heads,) or (batch, n_heads)
    replacement  (batch, len(heads), query_pos | len(positions), d_head_v)
    delta        (batch, n_heads, query_pos, d_head_v)
    q            (batch, n_heads, query_pos, d_head);  k, v (batch, n_kv_heads, key_pos, d_head | d_head_v)
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

INPUTS = ("q", "k", "v")  # a head's inputs that can be replaced (``gate_input``)


@dataclass
class Replacement:
    """Per-call values for some heads of a per-head tensor (z, or an input q, k, v), at every position
    or at some.

    Attributes:
        heads: the heads replaced, ``(k,)`` long (query heads; key/value heads for k and v).
        values: ``(batch, k, positions, d)``: ``positions`` is every position of the call, or
            ``len(positions)``.
        positions: the positions replaced (query positions for z and q, key positions for k and v),
            ``(p,)`` long; None for every position.
    """

    heads: Tensor
    values: Tensor
    positions: Tensor | None = None

    def apply(self, x: Tensor, *, what: str) -> Tensor:
        """``x`` ``(batch, heads, positions, d)`` with the replaced entries set (a new tensor).

        Raises:
            ValueError: values that do not fit this call's ``x`` (``what`` names it in the message).
        """
        heads = self.heads.to(x.device)
        positions = None if self.positions is None else self.positions.to(x.device)
        n_positions = x.shape[2] if positions is None else len(positions)
        expected = (x.shape[0], len(heads), n_positions, x.shape[3])
        if tuple(self.values.shape) != expected:
            raise ValueError(f"the replacement {what} has shape {tuple(self.values.shape)}; this call needs "
                             f"{expected} (batch, heads, positions, d): patch between inputs of the same shape")
        if positions is not None and positions.numel() and int(positions.max()) >= x.shape[2]:
            raise ValueError(f"the replacement {what} sets position {int(positions.max())}; this call has "
                             f"{x.shape[2]} positions")
        values = self.values.to(x)
        if positions is None:
            return x.index_copy(1, heads, values)
        selected = x.index_select(1, heads).index_copy(2, positions, values)  # (batch, k, positions, d)
        return x.index_copy(1, heads, selected)


def check_affine(scale: Tensor | None, shift: Tensor | None, *, n_heads: int, d_head_v: int) -> None:
    """Raise unless ``scale`` is ``(n_heads,)`` and ``shift`` ``(n_heads, d_head_v)``, floating (or None).

    Raises:
        ValueError: a tensor has the wrong shape.
        TypeError: a tensor is not floating point.
    """
    for name, value, shape in (("scale", scale, (n_heads,)), ("shift", shift, (n_heads, d_head_v))):
        if value is None:
            continue
        if not isinstance(value, Tensor) or not value.is_floating_point():
            raise TypeError(f"{name} must be a floating torch.Tensor, got {value!r}")
        if tuple(value.shape) != shape:
            raise ValueError(f"{name} has shape {tuple(value.shape)}; expected {shape}")


def check_gate(gate: Tensor, *, batch: int, n_heads: int) -> Tensor:
    """A per-call gate ``(n_heads,)`` or ``(batch, n_heads)``, as a tensor broadcastable over z.

    Raises:
        TypeError: not a floating tensor.
        ValueError: another shape.
    """
    if not isinstance(gate, Tensor):
        raise TypeError(f"head_mask must be a torch.Tensor, got {type(gate).__name__}")
    if not gate.is_floating_point():
        raise TypeError(f"head_mask has dtype {gate.dtype}; expected a floating gate (1 keeps a head, 0 removes it)")
    if tuple(gate.shape) == (n_heads,):
        return gate[None, :, None, None]
    if tuple(gate.shape) == (batch, n_heads):
        return gate[:, :, None, None]
    raise ValueError(f"head_mask has shape {tuple(gate.shape)}; expected (n_heads,) = ({n_heads},) or "
                     f"(batch, n_heads) = ({batch}, {n_heads})")


def apply_gates(z: Tensor, *, scale: Tensor | None = None, shift: Tensor | None = None, gate: Tensor | None = None,
                replacement: Replacement | None = None, delta: Tensor | None = None) -> Tensor:
    """z after every gate that is set (see the module docstring); None leaves a step out.

    Args:
        z: ``(batch, n_heads, query_pos, d_head_v)``.
        scale, shift: the persistent affine.
        gate: a per-call gate, already checked (``check_gate``).
        replacement: per-call values for some heads.
        delta: a per-call addition of z's shape.

    Returns:
        A new tensor (z itself when nothing is set).

    Raises:
        ValueError: a replacement or delta that does not match this call's z.
    """
    if scale is not None:
        z = z * scale.to(z)[None, :, None, None]
    if shift is not None:
        z = z + shift.to(z)[None, :, None, :]
    if gate is not None:
        z = z * gate.to(z.dtype)
    return gate_input(z, replacement=replacement, delta=delta, what="z")


def gate_input(x: Tensor, *, replacement: Replacement | None = None, delta: Tensor | None = None,
               what: str) -> Tensor:
    """``x`` (z, or a head input q, k, v) with a per-call replacement and then an additive zero applied.

    Args:
        x: ``(batch, heads, positions, d)``.
        replacement: values for some heads (at some positions), or None.
        delta: an addition of ``x``'s shape, or None.
        what: the tensor's name, for errors.

    Returns:
        A new tensor (``x`` itself when nothing is set).

    Raises:
        ValueError: a replacement or delta that does not match this call's ``x``.
    """
    if replacement is not None:
        x = replacement.apply(x, what=what)
    if delta is not None:
        if delta.shape != x.shape:
            raise ValueError(f"the {what} delta has shape {tuple(delta.shape)}; this call's {what} is "
                             f"{tuple(x.shape)}")
        x = x + delta
    return x


def identity_affine(scale: Tensor | None, shift: Tensor | None) -> bool:
    """Whether the affine leaves z as it is (scale all 1, shift all 0, or unset)."""
    return (scale is None or bool((scale == 1).all())) and (shift is None or not bool(shift.any()))

