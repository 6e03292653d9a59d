"""Decoding one token at a time with the kv cache: headlab's layer against a raw floor.

Axis legend: token ``(batch, 1, d_model)``; cached keys ``(batch, n_kv_heads, key_pos, d_head)``.

Each timed call decodes ``plan.decode_steps`` tokens after ``plan.decode_context`` cached
positions (the cache is rewound before each call). The floor writes each new key and value
into a preallocated buffer and calls ``scaled_dot_product_attention`` on the filled part:
the least work per token. Tokens/s is at batch 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from headlab.bench.layer import check_same
from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import time_interleaved
from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.projections import WideProjection

__all__ = ["bench_decode"]


def bench_decode(plan: Plan, *, tick: Callable[[str], None] = lambda _: None) -> Area:
    """Decoding tokens/s, standard and grouped-query (the plan's first ``gqa_kv_heads``).

    Args:
        plan: sizes, device, dtype and rounds.
        tick: called with a label as each case starts (progress).

    Returns:
        The "decode" area.
    """
    area = Area("decode", "Decoding with the kv cache", (
        f"{plan.dtype} on {plan.device}, batch 1, causal self-attention: {plan.decode_steps} tokens decoded one at a "
        f"time after {plan.decode_context} cached positions per timed call ({plan.rounds} interleaved rounds, "
        "median). The floor is fused linear + SDPA over a preallocated key/value buffer + linear."))
    for n_kv in dict.fromkeys((plan.n_heads, *plan.gqa_kv_heads[:1])):
        config = AttentionConfig(d_model=plan.d_model, n_heads=plan.n_heads, n_kv_heads=n_kv, causal=True)
        case = (f"{plan.decode_steps} tokens after {plan.decode_context} cached · d_model {plan.d_model} · "
                f"{plan.n_heads} heads" + (f" · {n_kv} kv heads" if n_kv != plan.n_heads else ""))
        tick(f"decode {case}")
        headlab_decode, floor_decode = _decoders(plan, config)
        with torch.inference_mode():
            check_same(case, {"headlab": torch.cat(headlab_decode(), 1), "raw floor": torch.cat(floor_decode(), 1)},
                       plan.torch_dtype)
            t = time_interleaved({"headlab": headlab_decode, "floor": floor_decode}, rounds=plan.rounds,
                                 min_block_s=plan.min_block_s, device=plan.device)
        area.rows.append(Comparison(case, "headlab layer + KVCache", "raw floor, preallocated cache",
                                    t["headlab"], t["floor"], tokens=plan.decode_steps))
    return area


def _decoders(plan: Plan, config: AttentionConfig) -> tuple[Callable[[], list[Tensor]], Callable[[], list[Tensor]]]:
    """Two functions that decode the same tokens after the same context and return each step's output."""
    c, ctx, steps = config, plan.decode_context, plan.decode_steps
    torch.manual_seed(0)
    layer = MultiHeadAttention(config).to(device=plan.device, dtype=plan.torch_dtype).eval()
    p = layer.projection
    assert isinstance(p, WideProjection) and p.in_proj_weight is not None  # wide self-attention: one fused weight
    in_proj_weight = p.in_proj_weight
    prompt = torch.randn(1, ctx, c.d_model, device=plan.device, dtype=plan.torch_dtype)
    tokens = torch.randn(1, steps, c.d_model, device=plan.device, dtype=plan.torch_dtype)
    cache = layer.new_kv_cache(batch_size=1, max_len=ctx + steps)
    with torch.inference_mode():
        layer(prompt, kv_cache=cache)
    keys, values = cache.keys.clone(), cache.values.clone()  # the context; positions ≥ ctx are overwritten
    sizes = [c.n_heads * c.d_head, c.n_kv_heads * c.d_head, c.n_kv_heads * c.d_head_v]
    gqa: dict[str, Any] = {"enable_gqa": True} if c.n_kv_heads != c.n_heads else {}

    def headlab_decode() -> list[Tensor]:
        cache.length = ctx  # rewind: every call decodes the same positions
        return [layer(tokens[:, i : i + 1], kv_cache=cache) for i in range(steps)]

    def floor_decode() -> list[Tensor]:
        out = []
        for i in range(steps):
            pos = ctx + i
            q, k, v = F.linear(tokens[:, i : i + 1], in_proj_weight, p.in_proj_bias).split(sizes, dim=-1)
            keys[:, :, pos] = k.view(1, c.n_kv_heads, c.d_head)
            values[:, :, pos] = v.view(1, c.n_kv_heads, c.d_head_v)
            z = F.scaled_dot_product_attention(q.view(1, 1, c.n_heads, c.d_head).transpose(1, 2),
                                               keys[:, :, : pos + 1], values[:, :, : pos + 1],
                                               scale=c.softmax_scale, **gqa)  # (1, n_heads, 1, d_head_v)
            out.append(F.linear(z.transpose(1, 2).reshape(1, 1, -1), p.out_proj.weight, p.out_proj.bias))
        return out

    return headlab_decode, floor_decode
