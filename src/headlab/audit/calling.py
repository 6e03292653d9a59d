"""How to call an attention module, and finding out when nobody says.

Three calling conventions cover the layers people write:

    self   forward(x)                              self-attention only
    qkv    forward(query, key, value)              nn.MultiheadAttention, most libraries
    vkq    forward(values, keys, query, mask)      the tutorial layer of ../seeds thread 000

and two input layouts: batch-first ``(batch, pos, d_model)`` and sequence-first
``(pos, batch, d_model)`` (nn.MultiheadAttention's default). ``detect`` finds them by running
the module: a convention fits when the call returns a tensor shaped like its query input and
one attention over the key positions is seen. For ``qkv`` and ``vkq`` it first tries queries
and keys of different lengths (5 and 7): the output's length then shows which argument is the
query, which tells the two apart; modules that only do self-attention get the same tensor in
every slot.

Axis legend: probe inputs are ``(batch, pos, d_model)`` with batch 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headlab.audit.errors import AuditError
from headlab.audit.intercept import AttentionCall, AttentionInterceptor, Override

__all__ = ["CONVENTIONS", "Caller", "Detected", "candidate_widths", "detect", "run_module"]

CONVENTIONS: dict[str, str] = {
    "self": "forward(x)",
    "qkv": "forward(query, key, value)",
    "vkq": "forward(values, keys, query, mask)",
}
_QUERY_LEN, _KEY_LEN = 5, 7  # detection lengths; distinct, so the output shows which input is the query
_RANK = {"raised": 1, "no-attention": 2, "wrong-output": 3, "several-attention": 4}


@dataclass(frozen=True)
class Caller:
    """One way of calling a module.

    Attributes:
        convention: a key of ``CONVENTIONS``.
        batch_first: inputs are ``(batch, pos, d_model)``; False: ``(pos, batch, d_model)``.
    """

    convention: str
    batch_first: bool = True

    def __post_init__(self) -> None:
        if self.convention not in CONVENTIONS:
            raise ValueError(f"call={self.convention!r} is not one of {', '.join(CONVENTIONS)}")

    @property
    def signature(self) -> str:
        """The call as the user would write it, e.g. ``forward(values, keys, query, mask)``."""
        layout = "" if self.batch_first else " with (pos, batch, d_model) inputs"
        return CONVENTIONS[self.convention] + layout

    def __call__(self, module: nn.Module, query: Tensor, key: Tensor, value: Tensor) -> object:
        """Call ``module``; inputs are batch-first, the raw return value is passed back untouched."""
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if self.convention == "self":
            return module(query)
        if self.convention == "qkv":
            return module(query, key, value)
        return module(value, key, query, None)

    def output(self, raw: object, query: Tensor) -> Tensor:
        """The output tensor of a call, batch-first, checked against the query's shape.

        Raises:
            AuditError: ``wrong-output``: not a tensor (or a tuple starting with one), or not
                shaped like the query input.
        """
        out = raw[0] if isinstance(raw, (tuple, list)) and raw and isinstance(raw[0], Tensor) else raw
        if not isinstance(out, Tensor):
            raise AuditError("wrong-output", f"{self.signature} returned {type(raw).__name__}; expected a tensor "
                             "(or a tuple whose first item is one) shaped like the query input")
        if not self.batch_first and out.dim() == 3:
            out = out.transpose(0, 1)
        if tuple(out.shape) != tuple(query.shape):
            expected = tuple(query.shape) if self.batch_first else tuple(query.transpose(0, 1).shape)
            got = tuple(out.shape) if self.batch_first else tuple(out.transpose(0, 1).shape)
            raise AuditError("wrong-output", f"{self.signature} returned shape {got}; expected {expected}, "
                             "the shape of the query input")
        return out


def run_module(module: nn.Module, caller: Caller, query: Tensor, key: Tensor | None = None,
               value: Tensor | None = None, *, override: Override | None = None) -> tuple[Tensor, list[AttentionCall]]:
    """Run ``module`` once inside an ``AttentionInterceptor``.

    Args:
        module: the module (in eval mode).
        caller: how to call it.
        query: ``(batch, query_pos, d_model)``; key and value default to it.
        override: a pattern to substitute, or None.

    Returns:
        The output ``(batch, query_pos, d_model)`` and the attention calls seen.

    Raises:
        AuditError: ``raised`` when the module raises (its exception is chained), ``wrong-output``,
            or ``unsupported`` from the interceptor.
    """
    key = query if key is None else key
    value = key if value is None else value
    interceptor = AttentionInterceptor(override=override)
    try:
        with torch.no_grad(), interceptor:
            raw = caller(module, query, key, value)
    except AuditError:
        raise
    except Exception as exc:  # the user's code: any exception is a finding, reported in words
        raise AuditError("raised", f"{caller.signature} raised {type(exc).__name__}: {exc}") from exc
    return caller.output(raw, query), interceptor.calls


@dataclass(frozen=True)
class Detected:
    """A calling convention and width under which the module attends.

    Attributes:
        caller: how to call it.
        d_model: input width.
        cross: the module accepted queries and keys of different lengths.
        attention_index: which attention call of a forward is the attention over the inputs.
    """

    caller: Caller
    d_model: int
    cross: bool
    attention_index: int


def candidate_widths(module: nn.Module) -> list[int]:
    """Widths worth trying as d_model: the sizes found in the module's parameter shapes, largest first.

    Raises:
        ValueError: the module has no parameters, so nothing suggests a width.
    """
    sizes = {s for p in module.parameters() for s in p.shape if s > 1}
    if not sizes:
        raise ValueError("cannot infer d_model: the module has no parameters with a width to try; pass d_model "
                         "(--d-model N)")
    return sorted(sizes, reverse=True)


def _attention_index(calls: list[AttentionCall], q_len: int, k_len: int) -> int | str:
    """Index of the one call attending from q_len queries to k_len keys, or a failure kind."""
    def matches(c: AttentionCall) -> bool:
        shape = c.scores.shape
        if shape[c.key_axis] != k_len:
            return False
        if c.query_axis is not None:
            return shape[c.query_axis] == q_len
        return any(size == q_len for axis, size in enumerate(shape) if axis != c.key_axis)

    hits = [i for i, c in enumerate(calls) if matches(c)]
    if not hits:
        return "no-attention"
    return hits[0] if len(hits) == 1 else "several-attention"


def _try(module: nn.Module, caller: Caller, d_model: int, cross: bool, dtype: torch.dtype,
         generator: torch.Generator) -> Detected | AuditError:
    k_len = _KEY_LEN if cross else _QUERY_LEN
    query = torch.randn(1, _QUERY_LEN, d_model, generator=generator, dtype=dtype)
    key = torch.randn(1, k_len, d_model, generator=generator, dtype=dtype) if cross else query
    try:
        _, calls = run_module(module, caller, query, key, key)
    except AuditError as err:
        if err.kind == "unsupported":
            raise
        return err
    found = _attention_index(calls, _QUERY_LEN, k_len)
    if isinstance(found, int):
        return Detected(caller=caller, d_model=d_model, cross=cross, attention_index=found)
    if found == "several-attention":
        return AuditError(found, f"{caller.signature} computed {len(calls)} attention operations in one forward "
                          f"({', '.join(c.source for c in calls)}); audit one attention layer at a time")
    seen = f" (it called {', '.join(sorted({c.source for c in calls}))}, but not over the {k_len} key positions)" \
        if calls else ""
    return AuditError(found, f"{caller.signature} ran but computed no softmax, scaled_dot_product_attention or "
                      f"multi_head_attention_forward over the input positions{seen}, so there is no attention "
                      "pattern to audit")


def detect(module: nn.Module, *, widths: Sequence[int], convention: str | None = None,
           dtype: torch.dtype = torch.float64, seed: int = 0) -> Detected:
    """Find how to call ``module`` and at which width it attends.

    Args:
        module: the module, in eval mode, with parameters of ``dtype``.
        widths: d_model values to try, in order.
        convention: a key of ``CONVENTIONS`` to use, or None to try them all.
        dtype: dtype of the probe inputs.
        seed: seeds the probe inputs.

    Returns:
        The first convention and width that work.

    Raises:
        AuditError: nothing worked; the message lists what each attempt did, most telling first.
    """
    names = ["qkv", "vkq", "self"] if convention is None else [convention]
    # Different query and key lengths first (they tell qkv from vkq), then forward(x), then the
    # same tensor in every slot for modules that only do self-attention.
    plans = [(name, True) for name in names if name != "self"] + [(name, False) for name in sorted(
        names, key=lambda n: n != "self")]
    generator = torch.Generator().manual_seed(seed)
    failures: list[tuple[int, AuditError]] = []
    for d_model in widths:
        for name, cross in plans:
            best: AuditError | None = None
            for batch_first in (True, False):
                outcome = _try(module, Caller(name, batch_first), d_model, cross, dtype, generator)
                if isinstance(outcome, Detected):
                    return outcome
                if best is None or _RANK[outcome.kind] > _RANK[best.kind]:
                    best = outcome
            failures.append((d_model, best))
    top = max(_RANK[f.kind] for _, f in failures)
    kind = next(f.kind for _, f in failures if _RANK[f.kind] == top)
    lines = dict.fromkeys(  # same message from two attempts: say it once
        (f"d_model={d}: " if len(widths) > 1 else "") + str(f) for d, f in failures if _RANK[f.kind] == top)
    tried = f"d_model in {list(widths)}" if len(widths) > 1 else f"d_model={widths[0]}"
    raise AuditError(kind, f"could not audit the module ({tried}):\n" + "\n".join(f"  - {line}" for line in lines))
