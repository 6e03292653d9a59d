"""headlab's attention implementation, registered in transformers' ``AttentionInterface``.

transformers 5.x dispatches the attention of nearly every architecture through one registry:
the model computes query, key and value with its own projections and positions and calls
``attention(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs)``.
Registered as ``"headlab"``, this function sees every head of every such model:

- nothing asked of the module: transformers' own SDPA function runs (the fused kernel);
- heads inspected (a ``Tap`` on the module's ``AttentionSite``): the fused kernel for z, and
  the explicit pattern for the tapped heads only;
- ``output_attentions=True``, or soft-capped logits (Gemma 2): every head's pattern, computed
  as the model's own eager path computes it, and z from it;
- gates (mask, scale, zero/mean ablation, importance gates) act on z before the output
  projection, whichever path ran; replacements and deltas of some heads' q, k, v act on them
  before anything reads them (path patching, edge attribution);
- a position bias (T5's relative attention) is added to the scores as the eager path adds it, on
  every path (the fused kernel then takes it as a mask per head);
- windowed heads (``headlab.heads.windowed``: sink and recent keys only) get their dropped keys
  added to the call's mask, one mask per head, which every path then reads;
- an observer set in this context (``observing``: the probe of ``headlab.attach``) is told of each
  call. The registration itself never changes, and what one call leaves for the next (the last mask
  made) is kept per thread: threads running models side by side see only their own calls.

Axis legend (transformers' layout):
    query           (batch, n_heads, query_pos, d_head)
    key             (batch, n_kv_heads, key_pos, d_head)
    value           (batch, n_kv_heads, key_pos, d_head_v)
    attention_mask  (batch | 1, 1, query_pos, key_pos): bool True = attend, or float added; or None
    pattern         (batch, head, query_pos, key_pos)
    z               (batch, head, query_pos, d_head_v)
    returned output (batch, query_pos, n_heads, d_head_v), transformers' layout
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch
from torch import Tensor, nn

from headlab.layer.functional import (
    additive_bias,
    copy_heads,
    expand_kv,
    fused_attention_with_lse,
    has_lse_kernel,
    key_softmax,
    select_heads,
    softmax_from_lse,
)
from headlab.layer.pattern_rows import PatternRows
from headlab.layer.taps import SITE_ATTRIBUTE, TapOutput
from headlab.models.site import SAVED_HEADS_ATTRIBUTE, AttentionSite, SharedSites

IMPLEMENTATION = "headlab"  # the name under which the function is registered

# transformers' pieces read on every call, imported on first use (importing headlab does not import transformers).
_collector: Any = None  # the output recorder (a ContextVar wrapper)
_sdpa_forward: Any = None  # transformers' own SDPA attention function
# Per thread, ``last``: the last additive mask made, with what it was made from: every layer of a forward
# gets the same mask (transformers builds one per forward), so only the first layer pays for the conversion.
_masks = threading.local()
# Per context (thread): who is told of every attention call (``observing``; the probe of ``attach``), or None.
_observer: ContextVar[Callable[..., None] | None] = ContextVar("headlab_attention_observer", default=None)
# Per thread, ``pool``: the pattern buffers while ``reuse_pattern_memory`` is active (absent outside it);
# and how many references a buffer's memory has when only the pool holds it (None: this torch cannot
# tell, so nothing is reused).
_pattern_memory = threading.local()
_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _references(tensor: Tensor) -> int:
    """How many tensors (and storage objects) reference ``tensor``'s memory, this call's own included."""
    assert _storage_use_count is not None
    storage = tensor.untyped_storage()  # held while it is counted
    return _storage_use_count(storage._cdata)


_POOL_ONLY = None if _storage_use_count is None else _references(torch.empty(1))


def register() -> None:
    """Register ``attention`` (and transformers' SDPA mask builder) under ``"headlab"``; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


def attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """One attention call of a transformers model (the ``AttentionInterface`` contract).

    Args:
        module: the model's attention module; its ``AttentionSite`` (if attached) says what
            to take and which gates to apply.
        query, key, value, attention_mask: see the module legend.
        scaling: factor on q·k; None for 1/sqrt(d_head).
        dropout: dropout probability on the weights (0 outside training).
        **kwargs: transformers' extras; ``softcap``, ``is_causal``, ``output_attentions`` and
            ``position_bias`` (T5's relative position bias, added to the scores; of every head of the
            module before pruning) change the result.

    Returns:
        ``(output, weights)``: output ``(batch, query_pos, n_heads, d_head_v)``; every head's
        pattern ``(batch, n_heads, query_pos, key_pos)`` when attentions are requested, else None.
    """
    observer = _observer.get()
    if observer is not None:  # the observed call itself runs as any other
        token = _observer.set(None)
        try:
            out = attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        finally:
            _observer.reset(token)
        observer(module, query, key, value, eager_mask(module, query, key, attention_mask, kwargs.get("is_causal")),
                 out[0])
        return out
    site: AttentionSite | SharedSites | None = getattr(module, SITE_ATTRIBUTE, None)
    if isinstance(site, SharedSites):  # a module run in several layers (ALBERT): this call's
        site = site.next()
    saved = getattr(module, SAVED_HEADS_ATTRIBUTE, None) if site is None else None  # a pruned model loading
    bias = kwargs.get("position_bias")  # (batch | 1, n_heads, query_pos, key_pos): T5's relative position bias
    if bias is not None and bias.shape[1] != query.shape[1]:  # heads pruned: the kept ones' (of the original heads)
        heads = site.head_ids if site is not None else None if saved is None else saved[0]
        if heads is not None:
            kwargs["position_bias"] = bias = select_heads(bias, heads)
    softcap = kwargs.get("softcap")
    wants_weights = _weights_requested(kwargs)
    if site is None:
        _check_plain(module)
        if saved is not None and query.shape[1] % key.shape[1]:  # uneven groups left by pruning
            regroup = torch.tensor(saved[1], device=key.device)
            key, value = key.index_select(1, regroup), value.index_select(1, regroup)
    if not wants_weights and softcap is None and (site is None or site.idle):
        return _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, kwargs=kwargs)
    if site is not None:  # some heads' q, k or v replaced, or given a delta (headlab.circuits): before anything reads
        query, key, value = site.gate_inputs(query, key, value)

    if bias is not None:  # added to the scores as the eager path adds it: one more additive mask, per head
        del kwargs["position_bias"]
        mask = eager_mask(module, query, key, attention_mask, kwargs.get("is_causal"))
        attention_mask = bias if mask is None else bias + mask
    if site is not None and site.windows:  # one additive mask per head, read by every path below
        attention_mask = site.window_mask(eager_mask(module, query, key, attention_mask, kwargs.get("is_causal")),
                                          query, key, end_aligned=attention_mask is not None)
    n_heads, scaling = query.shape[1], query.shape[-1] ** -0.5 if scaling is None else scaling
    if site is not None and not site.uniform_groups:  # such a module's num_key_value_groups is 1 (see prune)
        regroup = site.kv_index(query.device)  # every path below then reads one key/value head per query head
        key, value = key.index_select(1, regroup), value.index_select(1, regroup)
    kv_of = _kv_heads(n_heads, key.shape[1])  # each query head's key/value head (host ints), or None
    tap = None if site is None else site.tap
    blocks = tap is not None and tap.pattern is not None and tap.blocks  # the patterns handed as PatternRows
    tapped_every = tap is not None and tap.pattern is not None and len(tap.pattern) == n_heads and not blocks
    every_pattern = wants_weights or softcap is not None or tapped_every
    patterns = weights = None  # every head's pattern (the explicit path), and what transformers returns
    tapped_patterns = None  # the tapped heads' patterns, when the fused kernel's log-sum-exp gave them
    tapped_rows = None  # or, for a tap that asks for blocks, what makes them (PatternRows)
    if every_pattern:
        key_all, value_all = (expand_kv(x, n_heads) for x in (key, value))
        mask = eager_mask(module, query, key, attention_mask, kwargs.get("is_causal"))
        patterns = eager_pattern(query, key_all, mask, scaling=scaling, softcap=softcap)
        weights = nn.functional.dropout(patterns, p=dropout, training=module.training) if dropout > 0 else patterns
        z = torch.matmul(weights, value_all)  # (batch, n_heads, query_pos, d_head_v)
    else:
        fused = None
        if tap is not None and tap.pattern is not None:
            fused = _fused_with_lse(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                    kwargs=kwargs)
        if fused is None or tap is None or tap.pattern is None:  # a fused result comes with a tapped pattern
            z = _sdpa(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                      kwargs=kwargs)[0].transpose(1, 2)
        else:
            z, lse, bias, causal = fused
            if blocks:
                tapped_rows = _rows(query, key, kv_of, tap.pattern, scaling=scaling, bias=bias, causal=causal, lse=lse)
            else:
                tapped_patterns = _patterns_from_lse(query, key, bias, causal, lse, kv_of, tap.pattern,
                                                     scaling=scaling)
    if site is not None:
        z = site.gate(z)
        if tap is not None:
            taken = TapOutput(z=None if tap.z is None else copy_heads(z, tap.z),
                              result=None if tap.result is None else site.result(z, tap.result),
                              q=None if tap.q is None else copy_heads(query, tap.q),
                              k=None if tap.k is None else _per_head(key, kv_of, tap.k),
                              v=None if tap.v is None else _per_head(value, kv_of, tap.v))
            if tap.pattern is not None and patterns is not None:
                chosen = patterns if len(tap.pattern) == n_heads else copy_heads(patterns, tap.pattern)
                if blocks:  # formed whole anyway: the rows are sliced from them
                    taken.pattern_rows = PatternRows.of(chosen)
                else:
                    taken.pattern = chosen
            elif tapped_rows is not None:
                taken.pattern_rows = tapped_rows
            elif tap.pattern is not None and tapped_patterns is not None:
                taken.pattern = tapped_patterns
            elif tap.pattern is not None and blocks:  # no log-sum-exp here: each block's rows normalised
                bias, causal = _mask_of_rows(module, query, key, attention_mask, kwargs.get("is_causal"))
                taken.pattern_rows = _rows(query, key, kv_of, tap.pattern, scaling=scaling, bias=bias, causal=causal)
            elif tap.pattern is not None:
                mask = eager_mask(module, query, key, attention_mask, kwargs.get("is_causal"))
                taken.pattern = _head_patterns(query, key, mask, kv_of, tap.pattern, scaling=scaling)
            tap.sink(site.layer, taken)
    return z.transpose(1, 2).contiguous(), weights if wants_weights else None


def eager_mask(module: nn.Module, query: Tensor, key: Tensor, attention_mask: Tensor | None,
               is_causal: bool | None) -> Tensor | None:
    """The additive mask transformers' eager path would add to the scores, or None.

    The SDPA mask builder leaves the mask out (None) where SDPA's own ``is_causal`` serves;
    the rule for when that is causal is transformers' SDPA function's: more than one query,
    and the call's or module's ``is_causal`` (default True). Boolean masks become 0 / the
    dtype's most negative number, as ``eager_mask`` builds them.

    Returns:
        ``(batch | 1, 1, query_pos, key_pos)`` in query's dtype, or None (nothing masked).
    """
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        if not sdpa_causal(module, query, attention_mask, is_causal):
            return None
        source: Any = ("causal", q_len, k_len, query.device, query.dtype, torch.is_inference_mode_enabled())
    elif attention_mask.dtype == torch.bool:
        source = (attention_mask, query.dtype)
    else:
        return attention_mask
    last = getattr(_masks, "last", None)
    if last is not None and len(last[0]) == len(source) and all(
            a is b or (not isinstance(a, Tensor) and not isinstance(b, Tensor) and a == b)
            for a, b in zip(last[0], source)):
        return last[1]
    if attention_mask is None:
        # SDPA's is_causal aligns the mask top-left; keys past q_len (an empty static cache) are cropped.
        rows = torch.arange(q_len, device=query.device)[:, None]
        cols = torch.arange(k_len, device=query.device)[None, :]
        attention_mask = (cols <= rows)[None, None]
    zero = torch.zeros((), dtype=query.dtype, device=query.device)
    mask = torch.where(attention_mask, zero, torch.finfo(query.dtype).min)
    _masks.last = (source, mask)
    return mask


def sdpa_causal(module: nn.Module, query: Tensor, attention_mask: Tensor | None, is_causal: bool | None) -> bool:
    """transformers' SDPA rule for a causal call: no mask, more than one query, and the call's or (when it says
    nothing) the module's ``is_causal`` (default True)."""
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    return bool(attention_mask is None and causal and query.shape[2] > 1)


def eager_pattern(query: Tensor, key: Tensor, mask: Tensor | None, *, scaling: float,
                  softcap: float | None = None) -> Tensor:
    """softmax(q kᵀ · scaling, soft-capped, + mask) over key_pos, summed in float32 (or float64), in query's dtype.

    The order and precision of transformers' eager functions (Gemma 2's soft-capping before
    the mask; the softmax upcast to float32, which ``key_softmax`` gives without the float32 copy on
    CUDA; in 16-bit dtypes the scaling after q kᵀ). In float32 the scaling multiplies the query
    (``_scores``; rounding differs in the last bit), and float64 stays float64: cast to float32, a
    padding row's mask (float64's most negative number) becomes -inf everywhere, its softmax NaN, and
    0 · NaN carries that into the real tokens of the next layer.

    Args:
        query: ``(batch, head, query_pos, d_head)``.
        key: ``(batch, head, key_pos, d_head)``, aligned head for head with query.
        mask: additive, broadcastable to the scores, or None.
        scaling: factor on q·k.
        softcap: logits become ``softcap · tanh(logits / softcap)``, or None.

    Returns:
        ``(batch, head, query_pos, key_pos)``.
    """
    scores = _scores(query, key, scaling)  # (batch, head, query_pos, key_pos)
    if scores.requires_grad:
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if mask is not None:
            scores = scores + mask
        return key_softmax(scores)
    # Without autograd, in place: the same operations in the same order, on one (query_pos × key_pos)
    # buffer per head instead of three (a fresh buffer costs more in first-touch page faults than the math).
    if softcap is not None:
        scores.div_(softcap).tanh_().mul_(softcap)
    if mask is not None:
        scores.add_(mask)
    return key_softmax(scores)


@contextmanager
def observing(observer: Callable[..., None]) -> Iterator[None]:
    """Tell ``observer`` of every call of ``attention`` in this context (thread) while the block lasts.

    Args:
        observer: called after each call as ``observer(module, query, key, value, mask, output)``: the
            call's arguments, the additive mask of the eager path (``eager_mask``; a position bias is
            not in it) and the output ``(batch, query_pos, n_heads, d_head_v)``.
    """
    token = _observer.set(observer)
    try:
        yield
    finally:
        _observer.reset(token)


@contextmanager
def reuse_pattern_memory() -> Iterator[None]:
    """While the block runs, patterns are computed in buffers reused across forwards (see the module
    docstring); they are released on exit. Nested blocks share the outer one's buffers."""
    if getattr(_pattern_memory, "pool", None) is not None:
        yield
        return
    _pattern_memory.pool = []
    try:
        yield
    finally:
        _pattern_memory.pool = None


def _scores(query: Tensor, key: Tensor, scaling: float) -> Tensor:
    """``q kᵀ · scaling``: ``(batch, head, query_pos, key_pos)``, in a pooled buffer where one is free.

    In float32 and float64 the query is scaled, (query_pos × d_head) multiplies instead of (query_pos ×
    key_pos); the rounding differs from transformers' order in the last bit. In 16-bit dtypes the scores
    are scaled after the product, transformers' eager order: there each order rounds to ~0.4%, and over
    a model's layers the other order moves hidden states by more than the dtype's own rounding.
    """
    low_precision = query.dtype.itemsize < 4
    if not low_precision:
        query = query * scaling
    shape = (*query.shape[:-1], key.shape[-2])
    out = None
    pool = getattr(_pattern_memory, "pool", None)
    if pool is not None and _POOL_ONLY is not None and torch.is_inference_mode_enabled() \
            and query.shape[:-2] == key.shape[:-2]:
        out = _pooled(pool, shape, query.dtype, query.device)
    scores = torch.matmul(query, key.transpose(-1, -2), out=out)
    return scores.mul_(scaling) if low_precision else scores


def _pooled(pool: list[Tensor], shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A tensor of ``shape`` on a buffer of ``pool`` nothing else references (a new buffer when none is free)."""
    numel = 1
    for size in shape:
        numel *= size
    for buffer in pool:
        if (buffer.dtype == dtype and buffer.device == device and buffer.numel() >= numel
                and _references(buffer) == _POOL_ONLY):
            return buffer[:numel].view(shape)
    buffer = torch.empty(numel, dtype=dtype, device=device)
    pool.append(buffer)
    return buffer.view(shape)


def _per_head(x: Tensor, kv_of: list[int] | None, heads: list[int]) -> Tensor:
    """The key (or value) each of the query heads ``heads`` reads: ``(batch, len(heads), key_pos, d)``, a copy."""
    return copy_heads(x, heads if kv_of is None else [kv_of[h] for h in heads])


def _head_patterns(query: Tensor, key: Tensor, mask: Tensor | None, kv_of: list[int] | None, heads: list[int], *,
                   scaling: float) -> Tensor:
    """The eager patterns of the query heads ``heads`` only: ``(batch, len(heads), query_pos, key_pos)``."""
    if mask is not None and mask.shape[1] > 1:  # a mask per head
        mask = select_heads(mask, heads)
    return eager_pattern(*_query_and_key(query, key, kv_of, heads), mask, scaling=scaling)


def _query_and_key(query: Tensor, key: Tensor, kv_of: list[int] | None, heads: list[int]) -> tuple[Tensor, Tensor]:
    """The query heads ``heads`` and the key head each reads, views where the heads run consecutively."""
    return select_heads(query, heads), select_heads(key, heads if kv_of is None else [kv_of[h] for h in heads])


def _fused_with_lse(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, *,
                    scaling: float, dropout: float,
                    kwargs: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor | None, bool] | None:
    """z as transformers' SDPA function computes it, with the fused kernel's log-sum-exp, or None (no such kernel).

    The same kernel ``scaled_dot_product_attention`` runs, on the same mask: transformers' rule for
    ``is_causal`` (several queries, no mask, the call's or module's flag) and its cropping of the
    keys past the queries (an empty static cache), a bool mask as 0 / -inf (as SDPA converts it);
    grouped-query heads read their key/value head directly, as SDPA's ``enable_gqa`` does.

    Returns:
        ``(z (batch, n_heads, query_pos, d_head_v), lse (batch, n_heads, query_pos), bias, causal)``: the
        log-sum-exp was taken under ``bias`` (float additive, broadcastable to the scores over every key, or None)
        and, where ``causal``, the causal mask (top-left aligned, as the kernel applies it; never formed here).
    """
    if kwargs.get("cache") is not None:  # a paged cache is updated inside transformers' function
        return None
    if not has_lse_kernel(query.device):  # before the mask is converted for it
        return None
    q_len, k_len = query.shape[2], key.shape[2]
    causal = sdpa_causal(module, query, attention_mask, kwargs.get("is_causal"))
    bias = attention_mask  # transformers' bool masks say True = allowed
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        bias = additive_bias(~attention_mask, query.dtype)
    keys = q_len if causal else k_len  # transformers crops the keys a causal prefill cannot see
    fused = fused_attention_with_lse(query, key[:, :, :keys], value[:, :, :keys], bias=bias, is_causal=causal,
                                     scale=scaling, dropout_p=dropout)
    if fused is None:
        return None
    return fused[0], fused[1], bias, bool(causal)


def _patterns_from_lse(query: Tensor, key: Tensor, bias: Tensor | None, causal: bool, lse: Tensor,
                       kv_of: list[int] | None, heads: list[int], *, scaling: float) -> Tensor:
    """The patterns of the query heads ``heads`` from the kernel's log-sum-exp (``bias`` and ``causal`` as
    ``_fused_with_lse`` gives them).

    Returns:
        ``(batch, len(heads), query_pos, key_pos)``.
    """
    if bias is not None and bias.dim() == 4 and bias.shape[1] > 1:  # a mask per head
        bias = select_heads(bias, heads)
    if causal:  # top-left aligned, as the kernel applies it
        q_len, k_len = query.shape[2], key.shape[2]
        bias = torch.arange(k_len, device=query.device)[None, :] > torch.arange(q_len, device=query.device)[:, None]
    scores = _scores(*_query_and_key(query, key, kv_of, heads), scaling)
    return softmax_from_lse(scores, bias, select_heads(lse, heads))


def _rows(query: Tensor, key: Tensor, kv_of: list[int] | None, heads: list[int], *, scaling: float,
          bias: Tensor | None, causal: bool, lse: Tensor | None = None) -> PatternRows:
    """The patterns of the query heads ``heads`` as ``PatternRows`` (``bias``, ``causal`` and ``lse`` as
    ``_fused_with_lse`` or ``_mask_of_rows`` give them): q, k, the mask and the log-sum-exp, linear in the length."""
    if bias is not None and bias.dim() == 4 and bias.shape[1] > 1:  # a mask per head
        bias = select_heads(bias, heads)
    lse = None if lse is None else select_heads(lse, heads)
    if kv_of is not None and heads == list(range(query.shape[1])):  # every head: each key/value head read once
        return PatternRows(query, key, scale=scaling, bias=bias, causal=causal, lse=lse)
    q, k = _query_and_key(query, key, kv_of, heads)
    return PatternRows(q, k, scale=scaling, bias=bias, causal=causal, lse=lse)


def _mask_of_rows(module: nn.Module, query: Tensor, key: Tensor, attention_mask: Tensor | None,
                  is_causal: bool | None) -> tuple[Tensor | None, bool]:
    """``(bias, causal)``: the mask the eager path adds (``eager_mask``), without forming the causal mask: bool
    (True = not allowed) or float additive, or None; ``causal`` for transformers' SDPA rule (no mask, several
    queries, the call's or module's flag), which ``PatternRows`` applies row block by row block."""
    if attention_mask is None:
        return None, sdpa_causal(module, query, attention_mask, is_causal)
    if attention_mask.dtype == torch.bool:  # transformers' bool masks say True = allowed
        return ~attention_mask, False
    return attention_mask, False


def _sdpa(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, *,
          scaling: float | None, dropout: float, kwargs: dict[str, Any]) -> tuple[Tensor, None]:
    """transformers' own SDPA function, exactly as the plain ``"sdpa"`` model runs it."""
    global _sdpa_forward
    if _sdpa_forward is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        _sdpa_forward = sdpa_attention_forward
    return _sdpa_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


def _kv_heads(n_heads: int, n_kv_heads: int) -> list[int] | None:
    """The key/value head each query head reads (equal consecutive groups), as host ints; None when every head has
    its own."""
    if n_kv_heads == n_heads:
        return None
    if n_heads % n_kv_heads:
        raise ValueError(f"{n_heads} query heads cannot share {n_kv_heads} key/value heads in equal groups")
    return [h // (n_heads // n_kv_heads) for h in range(n_heads)]


def _weights_requested(kwargs: dict[str, Any]) -> bool:
    """Whether this forward returns attention weights: the ``output_attentions`` argument, or
    transformers' output recorder collecting "attentions" (some models pop the argument and
    record the attention modules' second output through hooks)."""
    global _collector
    if kwargs.get("output_attentions"):
        return True
    if _collector is None:
        from transformers.utils.output_capturing import _active_collector

        _collector = _active_collector
    collected = _collector.get()
    return collected is not None and "attentions" in collected


def _check_plain(module: nn.Module) -> None:
    """Refuse what the fused kernel would silently get wrong on a module headlab has not attached."""
    if isinstance(getattr(module, "sinks", None), Tensor):
        raise ValueError(f"{type(module).__name__} adds learned per-head sink logits to the softmax, which headlab's "
                         "attention does not compute")
