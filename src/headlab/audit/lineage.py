"""Which tensors of a forward come from the probe inputs, and the steps on their way.

The ``AttentionInterceptor`` hands every torch function a forward calls to a ``Lineage``. A
tensor computed from an input-dependent tensor is input-dependent too, and carries the set of
*steps* on its way that keep a map from being linear in the inputs, or that bring the positions
in:

- a normalisation or a nonlinearity (``layer_norm``, ``rms_norm``, ``gelu``, ``rsqrt``, ``pow``, …),
  named by its torch function;
- an element-wise product of two input-dependent tensors, or a division by one;
- a product or a sum with a fixed tensor that has an axis as long as the input (a rotary table,
  a position embedding, a relative-position bias; additive masks of 0 and -inf are not steps).

The scores' steps say what keeps them from being a bilinear form of the inputs; the attention
pattern starts a fresh lineage, so the output's steps say what keeps it from being linear in the
values. The least precise floating dtype any input-dependent tensor takes says in which
precision the module really computes (a ``.float()`` inside a forward probed in float64, say).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Lineage", "tensors_in"]

_NAMED = ("layer_norm", "rms_norm", "group_norm", "batch_norm", "instance_norm", "local_response_norm", "normalize",
          "gelu", "relu", "relu6", "silu", "elu", "selu", "celu", "leaky_relu", "softplus", "mish", "hardswish",
          "hardsigmoid", "hardtanh", "logsigmoid", "tanh", "sigmoid", "glu", "exp", "log", "sqrt", "rsqrt", "pow",
          "square", "abs", "sin", "cos", "erf", "norm", "clamp", "clip", "sign", "vector_norm", "__pow__", "__rpow__",
          "__abs__")


def _named() -> dict[Callable[..., Any], str]:
    found: dict[Callable[..., Any], str] = {}
    for name in _NAMED:
        label = name.strip("_")
        for owner in (F, torch, torch.Tensor, torch.linalg):
            for variant in (name, name + "_"):
                function = getattr(owner, variant, None)
                if callable(function) and not isinstance(function, type):
                    found[function] = label
    return found


_STEPS = _named()
_T = torch.Tensor
_PRODUCTS = frozenset({torch.mul, torch.multiply, _T.mul, _T.mul_, _T.__mul__, _T.__rmul__, _T.__imul__})
_DIVISIONS = frozenset({torch.div, torch.true_divide, _T.div, _T.div_, _T.__truediv__, _T.__itruediv__})
_REVERSED_DIVISIONS = frozenset({_T.__rtruediv__})
_SUMS = frozenset({torch.add, torch.sub, _T.add, _T.add_, _T.sub, _T.sub_, _T.__add__, _T.__radd__, _T.__iadd__,
                   _T.__sub__, _T.__rsub__, _T.__isub__})
_CONTRACTIONS = frozenset({torch.matmul, _T.matmul, _T.__matmul__, _T.__rmatmul__, torch.bmm, _T.bmm, torch.einsum})
_IN_PLACE_WRITES = frozenset({_T.__setitem__, _T.copy_, _T.index_put_, _T.masked_scatter_})
_MASK_FLOOR = -1e4  # an added tensor whose entries are all 0 or at most this is a mask, not a position term


def tensors_in(args: tuple, kwargs: dict) -> Iterable[Tensor]:
    """Every tensor among the arguments of a torch call, in lists and tuples too."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, Tensor))


def _is_mask(t: Tensor) -> bool:
    if t.dtype == torch.bool:
        return True
    return bool(((t == 0) | (t <= _MASK_FLOOR)).all()) if t.is_floating_point() else False


class Lineage:
    """Input-dependent tensors of one forward, each with its steps; the least precise dtype they took.

    Args:
        positions: the lengths of the inputs (query and key positions): a fixed tensor with an
            axis of one of these lengths follows the positions.

    Attributes:
        coarsest: the input-dependent floating dtype with the largest epsilon, or None.
    """

    def __init__(self, *, positions: Iterable[int]) -> None:
        self.positions = frozenset(p for p in positions if p > 1)
        self.coarsest: torch.dtype | None = None
        self._steps: dict[int, tuple[weakref.ref, frozenset[str]]] = {}

    def mark(self, t: Tensor, steps: frozenset[str] = frozenset()) -> None:
        """Record ``t`` as input-dependent with ``steps`` (the inputs themselves: none)."""
        key = id(t)

        def forget(_: object, key: int = key) -> None:  # t was collected: its id may be reused
            self._steps.pop(key, None)

        self._steps[key] = (weakref.ref(t, forget), steps)
        if (t.is_floating_point() or t.is_complex()) and (
                self.coarsest is None or torch.finfo(t.dtype).eps > torch.finfo(self.coarsest).eps):
            self.coarsest = t.dtype

    def steps(self, t: object) -> frozenset[str] | None:
        """The steps behind ``t``, or None when it does not depend on the inputs."""
        entry = self._steps.get(id(t)) if isinstance(t, Tensor) else None
        return entry[1] if entry is not None and entry[0]() is t else None

    def steps_of(self, tensors: Iterable[object]) -> frozenset[str]:
        """The union of the steps behind the input-dependent ones among ``tensors``."""
        found = [self.steps(t) for t in tensors]
        return frozenset().union(*(s for s in found if s is not None))

    def record(self, func: Callable[..., Any], args: tuple, kwargs: dict, out: object) -> None:
        """Follow one torch call: its outputs inherit its input-dependent arguments' steps, plus its own."""
        operands = list(tensors_in(args, kwargs))
        known = [self.steps(t) for t in operands]
        if all(k is None for k in known):
            return
        steps = frozenset().union(*(k for k in known if k is not None))
        step = self._step(func, args, operands, [k is not None for k in known])
        if step is not None:
            steps |= {step}
        outputs = [out] if isinstance(out, Tensor) else [o for o in out if isinstance(o, Tensor)] \
            if isinstance(out, (tuple, list)) else []
        if func in _IN_PLACE_WRITES and args and isinstance(args[0], Tensor):
            outputs.append(args[0])  # a buffer that input-dependent values were written into
        for t in outputs:
            self.mark(t, steps)

    def _step(self, func: Callable[..., Any], args: tuple, operands: list[Tensor], known: list[bool]) -> str | None:
        if func in _STEPS:
            return _STEPS[func]
        if func in _PRODUCTS and sum(known) >= 2:
            return "an element-wise product of two input-dependent tensors"
        divisor = 1 if func in _DIVISIONS else 0 if func in _REVERSED_DIVISIONS else None
        if divisor is not None and len(args) > 1 and self.steps(args[divisor]) is not None:
            return "a division by an input-dependent tensor"
        if not (func in _PRODUCTS or func in _SUMS or func in _CONTRACTIONS or divisor is not None):
            return None
        fixed = [t for t, k in zip(operands, known) if not k and self._follows_positions(t)]
        if not fixed or (func in _SUMS and all(_is_mask(t) for t in fixed)):
            return None
        kind = "sum" if func in _SUMS else "product"
        what = "complex " + kind if any(t.is_complex() for t in fixed) else kind
        return f"a {what} with a fixed tensor that follows the positions" + (
            " (e.g. a position embedding or bias)" if kind == "sum" else " (e.g. rotary positions)")

    def _follows_positions(self, t: Tensor) -> bool:
        return not isinstance(t, nn.Parameter) and any(size in self.positions for size in t.shape)
