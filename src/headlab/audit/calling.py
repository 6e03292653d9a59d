"""How to call an attention module, and finding out when nobody says.

Three calling conventions cover the layers people write:

    self   forward(x)                              self-attention only
    qkv    forward(query, key, value)              nn.MultiheadAttention, most libraries
    vkq    forward(values, keys, query, mask)      a widely copied tutorial layer (examples/slice_shared.py)

and two input layouts: batch-first ``(batch, pos, d_model)`` and sequence-first
``(pos, batch, d_model)`` (nn.MultiheadAttention's default). ``detect`` finds them by running
the module: a convention fits when the call returns a tensor shaped like its query input and
attention over the key positions is seen. For ``qkv`` and ``vkq`` it first tries queries and
keys of different lengths (5 and 7): the output's length then shows which argument is the
query, which tells the two apart; modules that only do self-attention get the same tensor in
every slot.

Several attention calls over the key positions in one forward are one layer's heads (a loop
over heads, a list of head modules) when none of them reads another's result: replacing every
pattern by a uniform one must leave every call's scores as they were. Otherwise they are
stacked layers, and the module is refused.

Axis legend: probe inputs are ``(batch, pos, d_model)`` with batch 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headlab.audit.errors import AuditError
from headlab.audit.intercept import AttentionCall, AttentionInterceptor, Override
from headlab.audit.lineage import Lineage

__all__ = ["CONVENTIONS", "Caller", "Detected", "Forward", "candidate_widths", "detect", "run_module"]

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

    def __call__(self, module: nn.Module, query: Tensor, key: Tensor, value: Tensor, *,
                 vkq_mask: Tensor | None = None, **keywords: object) -> object:
        """Call ``module``; inputs are batch-first, the raw return value is passed back untouched.

        Args:
            vkq_mask: the ``vkq`` convention's fourth argument (ignored by the others, which take
                masks as keywords).
            keywords: passed on to the module as keyword arguments.
        """
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        if self.convention == "self":
            return module(query, **keywords)
        if self.convention == "qkv":
            return module(query, key, value, **keywords)
        return module(value, key, query, vkq_mask, **keywords)

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


@dataclass(frozen=True)
class Forward:
    """One intercepted forward.

    Attributes:
        output: ``(batch, query_pos, d_model)``.
        calls: the attention calls seen, in the order computed.
        output_steps: the steps between the attention patterns (and the inputs, for paths
            around them) and the output that are not linear (``headlab.audit.lineage``).
        coarsest: the least precise floating dtype an input-dependent tensor took, or None.
    """

    output: Tensor
    calls: list[AttentionCall]
    output_steps: frozenset[str]
    coarsest: torch.dtype | None


def run_module(module: nn.Module, caller: Caller, query: Tensor, key: Tensor | None = None,
               value: Tensor | None = None, *, override: Override | None = None, **options: Any) -> Forward:
    """Run ``module`` once inside an ``AttentionInterceptor``, following what depends on the inputs.

    Args:
        module: the module (in eval mode).
        caller: how to call it.
        query: ``(batch, query_pos, d_model)``; key and value default to it.
        override: patterns to substitute, or None.
        options: passed on to the call (``Caller.__call__``: a mask, keyword arguments).

    Returns:
        The output, the attention calls, the output's steps and the coarsest dtype.

    Raises:
        AuditError: ``raised`` when the module raises (its exception is chained), ``wrong-output``,
            or ``unsupported`` from the interceptor.
    """
    key = query if key is None else key
    value = key if value is None else value
    lineage = Lineage(positions=(query.shape[1], key.shape[1]))
    for t in (query, key, value):
        lineage.mark(t)
    interceptor = AttentionInterceptor(override=override, lineage=lineage)
    try:
        with torch.no_grad(), interceptor:
            raw = caller(module, query, key, value, **options)
    except AuditError:
        raise
    except Exception as exc:  # the user's code: any exception is a finding, reported in words
        raise AuditError("raised", f"{caller.signature} raised {type(exc).__name__}: {exc}") from exc
    out = raw[0] if isinstance(raw, (tuple, list)) and raw else raw
    return Forward(output=caller.output(raw, query), calls=interceptor.calls, output_steps=lineage.steps_of([out]),
                   coarsest=lineage.coarsest)


@dataclass(frozen=True)
class Detected:
    """A calling convention and width under which the module attends.

    Attributes:
        caller: how to call it.
        d_model: input width.
        cross: the module accepted queries and keys of different lengths.
        attention_calls: which attention calls of a forward (their order in it) make up the
            layer: one, or one per group of heads computed apart.
    """

    caller: Caller
    d_model: int
    cross: bool
    attention_calls: tuple[int, ...]


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


def _matching(calls: list[AttentionCall], q_len: int, k_len: int) -> dict[int, int]:
    """The calls attending from q_len queries to k_len keys, each with its query axis (or a stand-in)."""
    found = {}
    for i, c in enumerate(calls):
        shape = c.scores.shape
        if shape[c.key_axis] != k_len:
            continue
        if c.query_axis is not None:
            if shape[c.query_axis] == q_len:
                found[i] = c.query_axis
            continue
        axes = [axis for axis, size in enumerate(shape) if axis != c.key_axis and size == q_len]
        if axes:
            found[i] = axes[0]  # good enough for a uniform pattern, which ignores the layout
    return found


def _same(a: Tensor, b: Tensor) -> bool:
    """Equal scores (masked entries included) up to the rounding of the dtype they were computed in."""
    if a.shape != b.shape or not torch.equal(a.isfinite(), b.isfinite()):
        return False
    finite = a.isfinite()
    if not finite.any():
        return True
    scale = max(1.0, float(a[finite].abs().max()))
    return float((a[finite] - b[finite]).abs().max()) <= 1e3 * torch.finfo(a.dtype).eps * scale


def _independent(module: nn.Module, caller: Caller, inputs: tuple[Tensor, Tensor], first: Forward,
                 matching: dict[int, int]) -> bool:
    """Whether uniform patterns in every matching call leave every matching call's scores unchanged."""
    def uniform(pattern: Tensor, first_head: int) -> Tensor:
        return torch.full_like(pattern, 1.0 / pattern.shape[-1])

    again = run_module(module, caller, inputs[0], inputs[1], inputs[1], override=Override(matching, uniform))
    return len(again.calls) == len(first.calls) and all(
        _same(first.calls[i].scores, again.calls[i].scores) for i in matching)


def _try(module: nn.Module, caller: Caller, d_model: int, cross: bool, dtype: torch.dtype,
         generator: torch.Generator) -> Detected | AuditError:
    k_len = _KEY_LEN if cross else _QUERY_LEN
    query = torch.randn(1, _QUERY_LEN, d_model, generator=generator, dtype=dtype)
    key = torch.randn(1, k_len, d_model, generator=generator, dtype=dtype) if cross else query
    try:
        forward = run_module(module, caller, query, key, key)
        matching = _matching(forward.calls, _QUERY_LEN, k_len)
        if len(matching) > 1 and not _independent(module, caller, (query, key), forward, matching):
            sources = ", ".join(c.source for c in forward.calls)
            return AuditError("several-attention", f"{caller.signature} computed {len(forward.calls)} attention "
                              f"operations in one forward ({sources}), and later ones read what earlier ones "
                              "computed (stacked attention layers); audit one attention layer at a time")
    except AuditError as err:
        if err.kind == "unsupported":
            raise
        return err
    if matching:
        return Detected(caller=caller, d_model=d_model, cross=cross, attention_calls=tuple(matching))
    seen = f" (it called {', '.join(sorted({c.source for c in forward.calls}))}, but not over the {k_len} key " \
        "positions)" if forward.calls else ""
    return AuditError("no-attention", f"{caller.signature} ran but computed no softmax, scaled_dot_product_attention "
                      f"or multi_head_attention_forward over the input positions{seen}, so there is no attention "
                      "pattern to audit; audit the module that computes the attention (a block's attention "
                      "sub-module, say; a softmax written by hand with exp and sum is not seen)")


def _wrong_arity(err: AuditError) -> bool:
    """The call itself did not fit the forward's parameters (a wrong convention, not a wrong width)."""
    cause = err.__cause__
    return isinstance(cause, TypeError) and any(
        words in str(cause)
        for words in ("positional argument", "unexpected keyword argument", "keyword-only argument"))


def _rank(err: AuditError) -> float:
    """How telling a failed attempt is: a forward that ran beats one that wanted more arguments, which
    beats one given too many."""
    if not _wrong_arity(err):
        return _RANK[err.kind]
    return _RANK[err.kind] - (0.25 if "required" in str(err.__cause__) else 0.5)


def _fixes(failures: list[AuditError], convention: str | None, widths: Sequence[int], inferred: bool) -> list[str]:
    """The fixes worth naming for a module that no attempt could audit."""
    fixes = []
    if convention is not None:
        fixes.append(f"leave out call={convention!r} (drop --call) to let the audit find how to call it")
    elif all(_wrong_arity(f) for f in failures) and any("required" in str(f.__cause__) for f in failures):
        fixes.append("its forward needs arguments besides the inputs and a mask: build, in Python, a module whose "
                     "forward supplies them (--factory module:function)")
    ran = any(f.kind in ("raised", "wrong-output") and not _wrong_arity(f) for f in failures)
    if inferred and ran:
        fixes.append(f"if its input width is none of {', '.join(map(str, widths))}, pass it (--d-model N)")
    return fixes


def detect(module: nn.Module, *, widths: Sequence[int], convention: str | None = None,
           dtype: torch.dtype = torch.float64, seed: int = 0, inferred: bool = False) -> Detected:
    """Find how to call ``module`` and at which width it attends.

    Args:
        module: the module, in eval mode, with parameters of ``dtype``.
        widths: d_model values to try, in order.
        convention: a key of ``CONVENTIONS`` to use, or None to try them all.
        dtype: dtype of the probe inputs.
        seed: seeds the probe inputs.
        inferred: the widths were guessed from parameter shapes (the error then suggests ``--d-model``).

    Returns:
        The first convention and width that work.

    Raises:
        AuditError: nothing worked; the message says what the most telling attempts did (each
            once, with the widths it happened at) and names the fixes.
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
                if best is None or _rank(outcome) > _rank(best):
                    best = outcome
            assert best is not None  # each of the two tries gave an outcome
            failures.append((d_model, best))
    top = max(_rank(f) for _, f in failures)
    telling = [(d, f) for d, f in failures if _rank(f) == top]
    at: dict[str, dict[int, None]] = {}  # the same message at several widths: said once, with the widths
    for d, f in telling:
        at.setdefault(str(f), {})[d] = None
    said = "; ".join(text + (f" (d_model={', '.join(map(str, ds))})" if len(widths) > 1 else "")
                     for text, ds in at.items())
    fixes = _fixes([f for _, f in failures], convention, widths, inferred)
    raise AuditError(telling[0][1].kind, f"could not audit {type(module).__name__}: {said}"
                     + (f"; to fix: {'; or '.join(fixes)}" if fixes else ""))
