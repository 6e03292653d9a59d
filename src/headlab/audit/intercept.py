"""Seeing the attention a running module computes, and steering it.

``AttentionInterceptor`` is a ``TorchFunctionMode``: while it is active it sees every torch
function the module calls, whatever the module's source looks like or its attributes are
called. Three kinds of call are attention:

- softmax (``torch.softmax``, ``F.softmax``, ``Tensor.softmax``, ``torch.special.softmax``):
  its input is the scores, its output the pattern. The first matrix product that takes the
  pattern (``matmul``/``@``, ``bmm``, ``einsum``), after any same-shape steps such as dropout,
  is its consumer; that product's output holds the heads' weighted sums of values (z).
- ``F.scaled_dot_product_attention``: computed here in explicit math from its q, k and v, with
  the same masks, scale and grouped-query expansion, so scores, pattern and z are all seen.
- ``F.multi_head_attention_forward`` (``nn.MultiheadAttention``'s path): decomposed into its
  input projections, the same explicit attention, and its output projection. Its body cannot
  be watched from inside (torch runs it only once no mode is active), hence the decomposition.

Each attention computation becomes an ``AttentionCall``. An ``Override`` may replace the
patterns of chosen calls (by their order in the forward) before the values are weighted: the
probes use it to make one head attend where they choose and to silence the others, also when a
layer computes its heads in several calls (a loop over heads, a list of head modules). Every
call is also handed to a ``headlab.audit.lineage.Lineage``, which follows what depends on the
inputs: the steps before the scores and after the pattern, and the precision computed in.
Dropout is never applied (audits run modules in eval mode).

Axis legend: the canonical form of scores and patterns is ``(head, query_pos, key_pos)`` for a
batch of one, the heads flattened in the order the module lays them out.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from headlab.audit.errors import AuditError
from headlab.audit.lineage import Lineage, tensors_in

__all__ = ["AttentionCall", "AttentionInterceptor", "Override", "from_canonical", "to_canonical"]

_SOFTMAX: dict[Callable[..., Any], str] = {
    torch.softmax: "torch.softmax",
    F.softmax: "torch.nn.functional.softmax",
    torch.Tensor.softmax: "Tensor.softmax",
    torch.special.softmax: "torch.special.softmax",
}
_CONTRACTIONS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__,
                           torch.bmm, torch.Tensor.bmm, torch.einsum})
_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_MHA_SIGNATURE = inspect.signature(F.multi_head_attention_forward)
SDPA_NAME = "torch.nn.functional.scaled_dot_product_attention"
MHA_NAME = "torch.nn.functional.multi_head_attention_forward"


@dataclass
class AttentionCall:
    """One attention computation seen during a forward.

    Attributes:
        source: the torch function that computed it (e.g. ``"torch.softmax"``).
        scores: the pre-softmax scores, in the module's own layout, masks included.
        pattern: the pattern handed on to the values (after an override, if one applied).
        key_axis: the axis of ``scores`` the softmax normalises.
        query_axis: the query axis of ``scores``; None for a softmax call until the probes
            find it (``Override.query_axis``).
        z: the weighted sums of values; for softmax, the output of the pattern's consumer,
            None if no consumer was seen.
        z_query_axis: the query axis of ``z`` where the call itself fixes it (explicit math).
        q_width: width of the queries where the call shows them (scaled_dot_product_attention,
            multi_head_attention_forward), else None.
        kv_heads: key/value heads the call received (before grouped-query expansion), where shown.
        score_steps: the steps between the inputs and the scores that are not bilinear
            (``headlab.audit.lineage``).
    """

    source: str
    scores: Tensor
    pattern: Tensor
    key_axis: int
    query_axis: int | None = None
    z: Tensor | None = None
    z_query_axis: int | None = None
    q_width: int | None = None
    kv_heads: int | None = None
    score_steps: frozenset[str] = frozenset()

    def canonical_scores(self, query_axis: int | None = None) -> Tensor:
        """``(head, query_pos, key_pos)``; ``query_axis`` is needed for softmax calls."""
        return to_canonical(self.scores, self._query_axis(query_axis), self.key_axis)

    def canonical_pattern(self, query_axis: int | None = None) -> Tensor:
        """``(head, query_pos, key_pos)``; ``query_axis`` is needed for softmax calls."""
        return to_canonical(self.pattern, self._query_axis(query_axis), self.key_axis)

    def _query_axis(self, query_axis: int | None) -> int:
        axis = self.query_axis if self.query_axis is not None else query_axis
        if axis is None:
            raise ValueError(f"the query axis of this {self.source} call is not known; pass query_axis")
        return axis


@dataclass(frozen=True)
class Override:
    """Replace the patterns of the attention calls that make up the audited layer.

    Attributes:
        query_axes: the calls to steer, by their order in the forward (0 = the first attention
            computed), each with the query axis of its raw scores (None where the call fixes it,
            as the explicit-math calls do).
        replace: ``(pattern, first_head)`` → the pattern to use instead, same shape; ``pattern`` is
            the call's canonical ``(head, query_pos, key_pos)`` and ``first_head`` the layer's
            index of its head 0 (the steered calls' heads are numbered in the order computed).
    """

    query_axes: Mapping[int, int | None]
    replace: Callable[[Tensor, int], Tensor]


def to_canonical(t: Tensor, query_axis: int, key_axis: int) -> Tensor:
    """Raw scores or pattern → ``(head, query_pos, key_pos)``, every other axis flattened into heads."""
    q, k = query_axis % t.dim(), key_axis % t.dim()
    return t.movedim((q, k), (-2, -1)).reshape(-1, t.shape[q], t.shape[k])


def from_canonical(c: Tensor, shape: torch.Size, query_axis: int, key_axis: int) -> Tensor:
    """Inverse of ``to_canonical``: ``(head, query_pos, key_pos)`` → the raw ``shape``."""
    q, k = query_axis % len(shape), key_axis % len(shape)
    moved = [s for i, s in enumerate(shape) if i not in (q, k)] + [shape[q], shape[k]]
    return c.reshape(moved).movedim((-2, -1), (q, k))


class AttentionInterceptor(TorchFunctionMode):
    """Records every attention computation of the forwards run inside it.

    Args:
        override: replace the patterns of chosen attention calls, or None to change nothing.
        lineage: follows the tensors that depend on the inputs (which the caller marks); None:
            a lineage of its own that knows no input.

    Attributes:
        calls: the attention calls, in the order computed.
        lineage: the lineage.
    """

    def __init__(self, *, override: Override | None = None, lineage: Lineage | None = None) -> None:
        super().__init__()
        self.override = override
        self.lineage = Lineage(positions=()) if lineage is None else lineage
        self.calls: list[AttentionCall] = []
        self._first_head = 0  # the layer's index of the next steered call's head 0
        self._tracked: list[Tensor] = []  # the last softmax pattern and its same-shape successors
        self._consumer_of: AttentionCall | None = None

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _SOFTMAX:
            return self._softmax(func, args, kwargs)
        if func is F.scaled_dot_product_attention:
            return self._sdpa(args, kwargs)
        if func is F.multi_head_attention_forward:
            return self._mha(args, kwargs)
        out = func(*args, **kwargs)
        self.lineage.record(func, args, kwargs, out)
        if self._tracked and isinstance(out, Tensor):
            self._follow(func, args, kwargs, out)
        return out

    # --- softmax: the module's own scores and pattern; z from the pattern's consumer ---
    def _softmax(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Tensor:
        pattern = func(*args, **kwargs)
        scores = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not isinstance(scores, Tensor) or scores.dim() < 2 or not isinstance(dim, int):
            return pattern  # not an attention pattern: nothing to audit
        call = AttentionCall(source=_SOFTMAX[func], scores=scores.detach().clone(), pattern=pattern,
                             key_axis=dim % scores.dim(), score_steps=self.lineage.steps_of([scores]))
        pattern = self._steer(call, pattern)
        self.lineage.mark(pattern)  # the values' side starts here: the scores' steps stay behind
        call.pattern = pattern.detach()
        self.calls.append(call)
        self._tracked, self._consumer_of = [pattern], call
        return pattern

    def _follow(self, func: Callable[..., Any], args: tuple, kwargs: dict, out: Tensor) -> None:
        if not any(t is p for t in tensors_in(args, kwargs) for p in self._tracked):
            return
        if func in _CONTRACTIONS:
            assert self._consumer_of is not None  # set with the pattern it follows
            self._consumer_of.z = out.detach()
            self._tracked, self._consumer_of = [], None
        elif out.shape == self._tracked[0].shape:  # dropout, masked_fill, dtype casts, ...
            self._tracked.append(out)

    # --- scaled_dot_product_attention, in explicit math ---
    def _sdpa(self, args: tuple, kwargs: dict) -> Tensor:
        given = dict(zip(_SDPA_PARAMS, args)) | kwargs
        q, k, v = given["query"], given["key"], given["value"]
        kv_heads = k.shape[-3] if k.dim() >= 3 else 1
        if given.get("enable_gqa", False) and k.dim() >= 3 and k.shape[-3] != q.shape[-3]:
            repeat = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(repeat, dim=-3), v.repeat_interleave(repeat, dim=-3)
        scale = given.get("scale")
        scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
        if given.get("is_causal", False):
            allowed = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~allowed, float("-inf"))
        mask = given.get("attn_mask")
        if mask is not None:  # bool: True takes part in attention; float: added to the scores
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        steps = self.lineage.steps_of([given["query"], given["key"]] + ([mask] if isinstance(mask, Tensor) else []))
        z, _ = self._attend(SDPA_NAME, scores, v, q_width=q.shape[-1], kv_heads=kv_heads, score_steps=steps)
        self.lineage.mark(z, self.lineage.steps_of([given["value"]]))
        return z

    # --- multi_head_attention_forward, decomposed ---
    def _mha(self, args: tuple, kwargs: dict) -> tuple[Tensor, Tensor | None]:
        p = _MHA_SIGNATURE.bind(*args, **kwargs)
        p.apply_defaults()
        a = p.arguments
        extras = {"add_bias_kv": a["bias_k"] is not None or a["bias_v"] is not None,
                  "add_zero_attn": bool(a["add_zero_attn"]),
                  "static_k/static_v": a["static_k"] is not None or a["static_v"] is not None}
        if any(extras.values()):
            used = ", ".join(name for name, on in extras.items() if on)
            raise AuditError("unsupported", f"nn.MultiheadAttention uses {used}: an extra learned or fixed key/value "
                             "position that the audit cannot follow; audit it with these options off")
        query, key, value = a["query"], a["key"], a["value"]
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        q_len, batch, _ = query.shape
        k_len, n_heads = key.shape[0], a["num_heads"]
        if a["use_separate_proj_weight"]:
            weights = (a["q_proj_weight"], a["k_proj_weight"], a["v_proj_weight"])
        else:
            weights = a["in_proj_weight"].chunk(3)
        biases = (None,) * 3 if a["in_proj_bias"] is None else a["in_proj_bias"].chunk(3)

        def heads(x: Tensor, w: Tensor, b: Tensor | None, length: int) -> Tensor:
            return F.linear(x, w, b).reshape(length, batch, n_heads, -1).permute(1, 2, 0, 3)  # (batch, head, pos, d)

        q = heads(query, weights[0], biases[0], q_len)
        k = heads(key, weights[1], biases[1], k_len)
        v = heads(value, weights[2], biases[2], k_len)
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (batch, head, query_pos, key_pos)
        masks = []  # bool: True is not allowed; float: added to the scores
        if a["attn_mask"] is not None:  # (query_pos, key_pos) or (batch·head, query_pos, key_pos)
            mask = a["attn_mask"]
            masks.append(mask.reshape(batch, n_heads, q_len, k_len) if mask.dim() == 3 else mask)
        if a["key_padding_mask"] is not None:  # (batch, key_pos)
            masks.append(a["key_padding_mask"].reshape(batch, 1, 1, k_len))
        if a["is_causal"] and a["attn_mask"] is None:  # torch's own check, kept so that intercepting changes nothing
            raise RuntimeError("Need attn_mask if specifying the is_causal hint.")
        if a["is_causal"] and a["key_padding_mask"] is None and not a["need_weights"]:
            # torch then ignores attn_mask and asks scaled_dot_product_attention for a causal mask
            masks = [torch.ones(q_len, k_len, dtype=torch.bool, device=scores.device).triu(1)]
        for mask in masks:
            scores = scores.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        z, pattern = self._attend(MHA_NAME, scores, v, q_width=q.shape[-1], kv_heads=n_heads,
                                  score_steps=self.lineage.steps_of([a["query"], a["key"]]))
        out = F.linear(z.permute(2, 0, 1, 3).reshape(q_len, batch, -1), a["out_proj_weight"], a["out_proj_bias"])
        weights_out = None
        if a["need_weights"]:
            weights_out = pattern.mean(dim=1) if a["average_attn_weights"] else pattern
        if unbatched:
            out = out.squeeze(1)
            weights_out = None if weights_out is None else weights_out.squeeze(0)
        self.lineage.mark(out, self.lineage.steps_of([a["value"]]))
        return out, weights_out

    # --- shared by the explicit-math paths ---
    def _attend(self, source: str, scores: Tensor, v: Tensor, *, q_width: int, kv_heads: int,
                score_steps: frozenset[str]) -> tuple[Tensor, Tensor]:
        """Softmax over the last axis and weighted sum of values, with the override applied."""
        pattern = torch.softmax(scores, dim=-1)
        call = AttentionCall(source=source, scores=scores.detach(), pattern=pattern, key_axis=scores.dim() - 1,
                             query_axis=scores.dim() - 2, q_width=q_width, kv_heads=kv_heads, score_steps=score_steps)
        pattern = self._steer(call, pattern)
        z = pattern @ v
        call.pattern, call.z, call.z_query_axis = pattern.detach(), z.detach(), z.dim() - 2
        self.calls.append(call)
        return z, pattern

    def _steer(self, call: AttentionCall, pattern: Tensor) -> Tensor:
        o = self.override
        if o is None or len(self.calls) not in o.query_axes:
            return pattern
        query_axis = call._query_axis(o.query_axes[len(self.calls)])
        canonical = to_canonical(pattern, query_axis, call.key_axis)
        replaced = o.replace(canonical, self._first_head)
        self._first_head += canonical.shape[0]
        if replaced.shape != canonical.shape:
            raise ValueError(f"override returned shape {tuple(replaced.shape)}; expected {tuple(canonical.shape)}")
        return from_canonical(replaced.to(pattern.dtype), pattern.shape, query_axis, call.key_axis)
