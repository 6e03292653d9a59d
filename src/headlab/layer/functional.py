"""The attention math, as pure functions (no parameters, no state).

Axis legend:
    q        (batch, n_heads, query_pos, d_head)
    k        (batch, n_kv_heads, key_pos, d_head)
    v        (batch, n_kv_heads, key_pos, d_head_v)
    pattern  (batch, head, query_pos, key_pos)   softmax over key_pos
    z        (batch, n_heads, query_pos, d_head_v)   each head's weighted sum of values

Two paths compute z. The fast path is ``torch.nn.functional.scaled_dot_product_attention``
and never forms a pattern. The explicit path forms the pattern (softmax(q kᵀ · scale + bias))
and multiplies it with v; it is used when every head's pattern is wanted anyway, since the
softmax is then paid for regardless. Patterns of a few heads are computed beside the fast
path, for those heads only: where the fused kernel also returns each row's log-sum-exp
(``fused_attention_with_lse``: CPU, no dropout, no gradient asked), a head's pattern is
``exp(q kᵀ · scale + bias − lse)``, one matmul and one exp with the kernel's own normaliser
instead of a second softmax; elsewhere the explicit softmax of those heads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from headlab.layer.masks import AttentionMask

_SDPA_HAS_GQA = torch.__version__ >= "2.5"  # scaled_dot_product_attention(enable_gqa=...) arrived in 2.5
# The dtypes of torch's fused CPU kernel (``_scaled_dot_product_flash_attention_for_cpu``), the one that
# scaled_dot_product_attention runs on CPU for these inputs; it also returns each row's log-sum-exp.
_LSE_KERNEL_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def expand_kv(x: Tensor, n_heads: int, kv_index: Tensor | None = None) -> Tensor:
    """Give every query head its key/value head.

    ``(batch, n_kv_heads, key_pos, d) -> (batch, n_heads, key_pos, d)``: with ``kv_index`` None,
    each key/value head serves n_heads / n_kv_heads consecutive query heads (standard,
    grouped-query, multi-query); else query head h reads key/value head ``kv_index[h]``.
    """
    if kv_index is not None:
        return x.index_select(1, kv_index)
    batch, n_kv_heads, k_len, d = x.shape
    if n_kv_heads == n_heads:
        return x
    group_size = n_heads // n_kv_heads
    return x[:, :, None].expand(batch, n_kv_heads, group_size, k_len, d).reshape(batch, n_heads, k_len, d)


def attention_pattern(q: Tensor, k: Tensor, bias: Tensor | None, dead: Tensor | None, *, scale: float) -> Tensor:
    """softmax(q kᵀ · scale + bias) over key_pos, with rows that see no key set to zero.

    Args:
        q: ``(batch, head, query_pos, d_head)``.
        k: ``(batch, head, key_pos, d_head)``, already aligned head for head with q.
        bias: broadcastable to ``(batch, head, query_pos, key_pos)``: float additive, or bool
            with True = not allowed; or None.
        dead: bool, broadcastable to ``(batch, head, query_pos)``: rows to zero, or None.
        scale: factor on q·k.

    Returns:
        pattern ``(batch, head, query_pos, key_pos)`` in q's dtype.
    """
    # Scale q, not the scores: (query_pos × d_head) multiplies instead of (query_pos × key_pos).
    scores = torch.matmul(q * scale, k.transpose(-1, -2))  # (batch, head, query_pos, key_pos)
    return masked_softmax(scores, bias, dead)


def masked_softmax(scores: Tensor, bias: Tensor | None, dead: Tensor | None) -> Tensor:
    """softmax(scores + bias) over key_pos, rows in ``dead`` set to zero. May reuse ``scores``' memory.

    Args:
        scores: ``(batch, head, query_pos, key_pos)``, a fresh tensor the caller gives up.
        bias: broadcastable to scores: float additive, or bool with True = not allowed; or None.
        dead: bool, broadcastable to ``(batch, head, query_pos)``, or None.
    """
    # In place: the matmul that made scores keeps its inputs, not its output.
    if bias is not None and bias.dtype == torch.bool:
        scores.masked_fill_(bias, float("-inf"))
    elif bias is not None:
        scores += bias
    pattern = key_softmax(scores)
    if dead is not None:
        pattern = pattern.masked_fill(dead[..., None], 0.0)
    return pattern


def key_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis, summed in float32 or wider, in ``scores``' dtype. May reuse ``scores``' memory.

    Half precision is normalised in float32 (a half-precision sum loses mass on long rows). On CUDA
    torch's kernel accumulates in float32 itself: its half-precision softmax is the float32 path's to
    the bit (bfloat16 and float16 on an H200) without the float32 copy, which took as long as the
    matmul and the softmax together.

    Args:
        scores: ``(..., key_pos)``, a fresh tensor the caller gives up.
    """
    half = scores.dtype in (torch.float16, torch.bfloat16)
    if half and scores.device.type != "cuda":
        return scores.softmax(dim=-1, dtype=torch.float32).to(scores.dtype)
    if half or scores.requires_grad or not scores.is_contiguous():
        return scores.softmax(dim=-1)
    # Inference: softmax in place. A fresh (query_pos × key_pos) buffer per head costs more in first-touch
    # page faults than the softmax itself on large inputs. (Only on contiguous scores: out= aliasing a
    # strided input gives wrong rows.)
    return torch.ops.aten._softmax.out(scores, -1, False, out=scores)


def fused_attention_with_lse(q: Tensor, k: Tensor, v: Tensor, *, bias: Tensor | None, is_causal: bool,
                             scale: float, dropout_p: float = 0.0) -> tuple[Tensor, Tensor] | None:
    """z from the fused kernel together with each row's log-sum-exp, where a kernel gives both; else None.

    torch's fused CPU kernel (what ``scaled_dot_product_attention`` runs on CPU for these inputs)
    returns ``logsumexp(q kᵀ · scale + bias)`` per row beside z. None (the caller falls back) on
    other devices and dtypes, with dropout, where ``scaled_dot_product_attention`` would not pick
    that kernel (q's and v's head sizes differ, an empty axis, a last axis that is not contiguous,
    grouped key/value heads before torch 2.5), where this torch lacks the kernel, and when autograd
    would need the log-sum-exp's gradient, which the kernel does not give.

    Args:
        q: ``(batch, n_heads, query_pos, d_head)``.
        k, v: ``(batch, n_kv_heads, key_pos, d_head)``; n_kv_heads divides n_heads, each key/value
            head serving consecutive query heads.
        bias: float additive, broadcastable to ``(batch, n_heads, query_pos, key_pos)`` (``-inf``
            where not allowed), or None.
        is_causal: the square causal mask, applied by the kernel (bias must then be None).
        scale: factor on q·k.
        dropout_p: dropout on the weights; only 0 has a kernel here.

    Returns:
        ``(z (batch, n_heads, query_pos, d_head), lse (batch, n_heads, query_pos) float32 or float64)``,
        or None.
    """
    grouped = q.shape[1] != k.shape[1]
    if (not has_lse_kernel(q.device) or q.dtype not in _LSE_KERNEL_DTYPES or dropout_p > 0.0
            or q.shape[-1] != v.shape[-1] or q.shape[1] % k.shape[1] or (grouped and not _SDPA_HAS_GQA)
            or not (q.shape[2] and k.shape[2]) or any(x.stride(-1) != 1 for x in (q, k, v))
            or (torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)))):
        return None
    z, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=bias,
                                                                         scale=scale)
    return z, lse


def has_lse_kernel(device: torch.device) -> bool:
    """Whether this torch has, on ``device``, the fused kernel that ``fused_attention_with_lse`` calls: the CPU's."""
    kernel = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    return device.type == "cpu" and kernel is not None


def softmax_from_lse(scores: Tensor, bias: Tensor | None, lse: Tensor) -> Tensor:
    """softmax(scores + bias) over key_pos from its log-sum-exp: ``exp(scores + bias − lse)``, in ``scores``' memory.

    Args:
        scores: ``(batch, head, query_pos, key_pos)``, a fresh tensor the caller gives up (no gradient).
        bias: broadcastable to scores: float additive, or bool with True = not allowed; or None.
        lse: ``(batch, head, query_pos)``: ``logsumexp(scores + bias)`` over key_pos, as a fused kernel gave it.

    Returns:
        The pattern, in scores' dtype (half precision goes through float32, as ``key_softmax`` on the CPU).
    """
    if scores.dtype in (torch.float16, torch.bfloat16):
        return softmax_from_lse(scores.float(), bias, lse.float()).to(scores.dtype)
    if bias is not None and bias.dtype == torch.bool:
        scores.masked_fill_(bias, float("-inf"))
    elif bias is not None:
        scores += bias
    scores -= lse.to(scores.dtype)[..., None]
    return scores.exp_()


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: AttentionMask,
    *,
    scale: float,
    dropout_p: float = 0.0,
    pattern_heads: list[int] | None = None,
    kv_index: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Attention of every head, plus the patterns of the heads asked for.

    Args:
        q, k, v: see the module legend; n_kv_heads must divide n_heads.
        mask: merged masks (``headlab.layer.masks.build_mask``).
        scale: factor on q·k.
        dropout_p: dropout on the attention weights (0 outside training).
        pattern_heads: query-head indices whose patterns to return, or None for none.
        kv_index: key/value head of each query head ``(n_heads,)``; None for consecutive groups.

    Returns:
        ``(z, patterns)``: z ``(batch, n_heads, query_pos, d_head_v)``; patterns
        ``(batch, len(pattern_heads), query_pos, key_pos)`` (before dropout) or None.
    """
    n_heads = q.shape[1]
    if pattern_heads == list(range(n_heads)):
        bias = mask.explicit_bias(q.shape[2], device=q.device)
        patterns = attention_pattern(q, expand_kv(k, n_heads, kv_index), bias, mask.dead, scale=scale)
        weights = F.dropout(patterns, dropout_p) if dropout_p > 0.0 else patterns
        z = torch.matmul(weights, expand_kv(v, n_heads, kv_index))
    else:
        grouped = kv_index is None and k.shape[1] != n_heads and sdpa_reads_groups(q, k, v, mask, dropout_p)
        k_all, v_all = (k, v) if grouped else (expand_kv(k, n_heads, kv_index), expand_kv(v, n_heads, kv_index))
        fused = None if pattern_heads is None else fused_attention_with_lse(
            q, k_all, v_all, bias=additive_bias(mask.bias, q.dtype), is_causal=mask.is_causal, scale=scale,
            dropout_p=dropout_p)
        if fused is not None:
            z, lse = fused
        else:
            z, lse = F.scaled_dot_product_attention(
                q, k_all, v_all, attn_mask=mask.kernel_mask(), dropout_p=dropout_p, is_causal=mask.is_causal,
                scale=scale, **({"enable_gqa": True} if grouped else {}),
            ), None
        patterns = None
        if pattern_heads is not None:
            patterns = head_patterns(q, k, mask, pattern_heads, scale=scale, kv_index=kv_index, lse=lse)
    if mask.dead is not None:
        z = z.masked_fill(mask.dead[..., None], 0.0)
    return z, patterns


def sdpa_reads_groups(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, dropout_p: float) -> bool:
    """Whether ``scaled_dot_product_attention(enable_gqa=True)`` runs a fused kernel on these grouped heads.

    On the CPU its kernel reads each key/value head for its whole group, with no expanded copy. On CUDA
    only the flash kernel does (no mask, 16-bit dtypes, sm80 and up, head sizes up to 256): for any other
    input torch falls back to the math path, which forms every score, so the caller expands the heads and
    the efficient kernel runs. torch's own check (``can_use_flash_attention``) decides.

    Args:
        q: ``(batch, n_heads, query_pos, d_head)``.
        k, v: ``(batch, n_kv_heads, key_pos, d)``, each key/value head serving consecutive query heads.
        mask: the call's merged mask.
        dropout_p: dropout on the weights.
    """
    if not _SDPA_HAS_GQA:
        return False
    if q.device.type == "cpu":
        return True
    if q.device.type != "cuda" or mask.bias is not None or not torch.backends.cuda.flash_sdp_enabled():
        return False
    params = torch.backends.cuda.SDPAParams(q, k, v, None, dropout_p, mask.is_causal, True)
    return torch.backends.cuda.can_use_flash_attention(params, False)


def additive_bias(bias: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A mask as the kernel adds it: bool (True = not allowed) becomes 0 / -inf in ``dtype``, as
    ``scaled_dot_product_attention`` converts a bool mask itself; a float mask or None as it is."""
    if bias is None or bias.dtype != torch.bool:
        return bias
    return torch.zeros(bias.shape, dtype=dtype, device=bias.device).masked_fill_(bias, float("-inf"))


def head_patterns(q: Tensor, k: Tensor, mask: AttentionMask, heads: list[int], *, scale: float,
                  kv_index: Tensor | None = None, lse: Tensor | None = None) -> Tensor:
    """The patterns of the given query heads only: ``(batch, len(heads), query_pos, key_pos)``.

    Args:
        q, k, mask, scale, kv_index: as ``attend`` takes them.
        heads: query-head indices.
        lse: ``(batch, n_heads, query_pos)``, every head's log-sum-exp from ``fused_attention_with_lse``
            with this mask: the patterns are then ``exp(q kᵀ · scale + bias − lse)``; None for the softmax.
    """
    n_heads, n_kv_heads = q.shape[1], k.shape[1]
    k_heads = [h // (n_heads // n_kv_heads) for h in heads] if kv_index is None else kv_index[heads].tolist()
    bias = mask.explicit_bias(q.shape[2], device=q.device)
    if bias is not None and bias.shape[1] == n_heads:
        bias = select_heads(bias, heads)
    dead = mask.dead
    if dead is not None and dead.shape[1] == n_heads:
        dead = select_heads(dead, heads)
    q, k = select_heads(q, heads), select_heads(k, k_heads)
    if lse is None:
        return attention_pattern(q, k, bias, dead, scale=scale)
    pattern = softmax_from_lse(torch.matmul(q * scale, k.transpose(-1, -2)), bias, select_heads(lse, heads))
    return pattern if dead is None else pattern.masked_fill_(dead[..., None], 0.0)


def copy_heads(x: Tensor, heads: Sequence[int], *, dim: int = 1) -> Tensor:
    """``x[:, heads]`` (the head axis ``dim``) as a tensor of its own, indexed with host ints.

    Indexing with a list (or ``index_select`` with a fresh index tensor) first copies the index to
    ``x``'s device, and on a GPU that copy waits for every kernel queued before it: a stall per call.
    The heads' views stacked are one copy kernel and no wait.

    Args:
        x: ``(batch, head, ...)``, or the head axis at ``dim``.
        heads: indices into the head axis (may repeat).
        dim: the head axis.

    Returns:
        ``x`` with ``len(heads)`` entries on the head axis, contiguous.
    """
    return torch.stack([x.select(dim, h) for h in heads], dim=dim)


def head_results(z: Tensor, W_O: Tensor, heads: Sequence[int] | None = None) -> Tensor:
    """Each head's contribution to the output, without the output bias.

    Args:
        z: ``(batch, n_heads, query_pos, d_head_v)``.
        W_O: ``(n_heads, d_head_v, d_model)``; the heads used are cast to z's dtype.
        heads: query heads to compute, or None for all.

    Returns:
        ``(batch, len(heads), query_pos, d_model)``; over all heads they sum, with the output bias, to
        the output projection's output.
    """
    if heads is not None and list(heads) != list(range(z.shape[1])):  # every head in order: no copy
        z, W_O = copy_heads(z, heads), copy_heads(W_O, heads, dim=0)
    return torch.einsum("bhqd,hdm->bhqm", z, W_O.to(z.dtype))


def select_heads(x: Tensor, heads: list[int]) -> Tensor:
    """``x[:, heads]``: a view for a run of consecutive heads, else a copy of those heads only.

    ``index_select`` on a strided ``x`` (the heads of a fused projection, viewed as
    ``(batch, head, pos, d)``) copies all of ``x`` first: for one head of twelve that is most of
    the cost of a pattern.

    Args:
        x: ``(batch, head, ...)``.
        heads: indices into the head axis (may repeat).

    Returns:
        ``(batch, len(heads), ...)``.
    """
    first = heads[0]
    if heads == list(range(first, first + len(heads))):
        return x.narrow(1, first, len(heads))
    return copy_heads(x, heads)
