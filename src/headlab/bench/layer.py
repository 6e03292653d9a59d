"""headlab's own layer against its peers: forward and forward + backward, standard and grouped-query.

Axis legend: x ``(batch, pos, d_model)``.

Peers, all carrying the same weights:
    raw floor      one fused ``F.linear`` for q, k, v, ``scaled_dot_product_attention`` and the
                   output ``F.linear``: the least work any implementation can do (grouped-query:
                   the kernel's ``enable_gqa``, no expanded keys)
    nn.MHA         ``torch.nn.MultiheadAttention`` with need_weights False (its fused inference
                   path) and True (it then forms the head-averaged pattern)
FLOPs of a call are ``batch ×`` the layer's forward FLOPs from ``headlab.layer.accounting``;
forward + backward counts the backward as twice the forward. headlab's attention inside real
transformers models is measured in ``headlab.bench.models``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import time_interleaved
from headlab.interop import from_torch
from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.accounting import account
from headlab.layer.projections import WideProjection

__all__ = ["bench_layer", "bound_note", "case_name", "check_same", "layer_flops", "raw_floor", "standard_pair"]

FORWARD_FLOOR_GOAL = 1.05  # headlab forward / raw floor
FORWARD_MHA_GOAL = 0.85  # headlab forward / nn.MultiheadAttention(need_weights=False)
BACKWARD_FACTOR = 3  # forward + backward FLOPs ≈ 3 × forward (the backward multiplies twice per forward multiply)


def case_name(batch: int, pos: int, config: AttentionConfig) -> str:
    """``"batch 2 · pos 1024 · d_model 768 · 12 heads"`` (with key/value heads when grouped)."""
    kv = f" · {config.n_kv_heads} kv heads" if config.n_kv_heads != config.n_heads else ""
    return f"batch {batch} · pos {pos} · d_model {config.d_model} · {config.n_heads} heads{kv}"


def layer_flops(config: AttentionConfig, *, batch: int, pos: int) -> int:
    """Forward FLOPs of one self-attention call on ``(batch, pos, d_model)``, from the accounting."""
    return batch * account(config, seq_len=pos).total_flops


@overload
def raw_floor(layer: MultiHeadAttention, *, pattern_head: None = None) -> Callable[[Tensor], Tensor]: ...
@overload
def raw_floor(layer: MultiHeadAttention, *, pattern_head: int) -> Callable[[Tensor], tuple[Tensor, Tensor]]: ...
def raw_floor(layer: MultiHeadAttention, *,
              pattern_head: int | None = None) -> Callable[[Tensor], Tensor | tuple[Tensor, Tensor]]:
    """Fused linear + ``scaled_dot_product_attention`` + linear, reading ``layer``'s (wide) weights.

    Args:
        layer: a ``wide`` layer with fused input weights (self-attention).
        pattern_head: also form this query head's pattern beside the kernel, with one matmul and one
            softmax: the least eager PyTorch does to show one head. None for the layer alone.

    Returns:
        ``forward(x) -> output`` for x ``(batch, pos, d_model)``, without masks; with ``pattern_head``,
        ``forward(x) -> (output, pattern (batch, 1, pos, pos))``.
    """
    c, p = layer.config, layer.projection
    if c.projection != "wide" or not isinstance(p, WideProjection) or p.in_proj_weight is None:
        raise ValueError(f"the raw floor reads fused wide weights; got projection={c.projection!r}")
    in_proj_weight = p.in_proj_weight
    sizes = [c.n_heads * c.d_head, c.n_kv_heads * c.d_head, c.n_kv_heads * c.d_head_v]
    gqa: dict[str, Any] = {"enable_gqa": True} if c.n_kv_heads != c.n_heads else {}

    def forward(x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        batch, pos, _ = x.shape
        q, k, v = F.linear(x, in_proj_weight, p.in_proj_bias).split(sizes, dim=-1)
        q = q.view(batch, pos, c.n_heads, c.d_head).transpose(1, 2)  # (batch, n_heads, pos, d_head)
        k = k.view(batch, pos, c.n_kv_heads, c.d_head).transpose(1, 2)  # (batch, n_kv_heads, pos, d_head)
        v = v.view(batch, pos, c.n_kv_heads, c.d_head_v).transpose(1, 2)
        z = F.scaled_dot_product_attention(q, k, v, scale=c.softmax_scale, **gqa)
        output = F.linear(z.transpose(1, 2).reshape(batch, pos, -1), p.out_proj.weight, p.out_proj.bias)
        if pattern_head is None:
            return output
        q_h = q.narrow(1, pattern_head, 1) * c.softmax_scale
        k_h = k.narrow(1, c.kv_head_of[pattern_head], 1)
        return output, torch.matmul(q_h, k_h.transpose(-1, -2)).softmax(-1)

    return forward


def bound_note(case: str, row: Comparison, bound: Comparison, why: str) -> str | None:
    """A note when ``row`` missed its goal and ``bound`` (the least eager PyTorch does for the same thing, against
    the same peer) already took more than the goal: no implementation in eager PyTorch could meet it in this run.
    None otherwise.

    Args:
        case: the sizes, as the rows name them.
        row: a goal row against a peer.
        bound: the raw floor (with whatever the row adds) timed against that peer in the same group.
        why: a sentence on where the time goes.
    """
    if row.met() is not False or row.goal is None or bound.ratio <= row.goal:
        return None
    return (f"{case}: the goal of {row.goal:.2f}× {row.peer} is out of reach here for any implementation in eager "
            f"PyTorch: {bound.contender.removesuffix(' (the bound)')} alone takes {bound.ratio:.2f}× its time. {why}")


def standard_pair(plan: Plan) -> tuple[nn.MultiheadAttention, MultiHeadAttention]:
    """A seeded ``nn.MultiheadAttention`` and the headlab layer imported from it, on the plan's device and dtype."""
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(plan.d_model, plan.n_heads, batch_first=True)
    mha = mha.to(device=plan.device, dtype=plan.torch_dtype)
    return mha, from_torch(mha)


def check_same(case: str, outputs: dict[str, Tensor], dtype: torch.dtype) -> None:
    """Raise RuntimeError unless every contender computed the same output (timings of different
    functions are not comparable)."""
    tol = 1e-4 if dtype in (torch.float32, torch.float64) else 3e-2
    names = list(outputs)
    for name in names[1:]:
        try:
            torch.testing.assert_close(outputs[name].float(), outputs[names[0]].float(), atol=tol, rtol=tol)
        except AssertionError as err:
            raise RuntimeError(f"{case}: {name} and {names[0]} disagree, so their timings are not comparable: "
                               f"{err}") from None


def bench_layer(plan: Plan, *, tick: Callable[[str], None] = lambda _: None) -> Area:
    """Forward and forward + backward at every ``plan.layer_shapes``, then the grouped-query cases.

    Args:
        plan: sizes, device, dtype and rounds.
        tick: called with a label as each case starts (progress).

    Returns:
        The "layer" area.
    """
    area = Area("layer", "Layer: headlab's own layer, forward and forward + backward", (
        f"{plan.dtype} on {plan.device}. Ratio = contender time / peer time, both timed in the same interleaved "
        f"group ({plan.rounds} rounds, median). The A/A row times the raw floor against itself: its distance from "
        "1.00 is this run's noise. % of ceiling: the contender's FLOP/s (headlab.layer.accounting; forward + "
        f"backward counted as {BACKWARD_FACTOR}× forward) over the matmul ceiling measured in this run."))
    mha, layer = standard_pair(plan)
    for batch, pos in plan.layer_shapes:
        case = case_name(batch, pos, layer.config)
        tick(f"layer {case}")
        rows, notes = _forward_rows(plan, case, batch, pos, mha, layer)
        area.rows += rows + _backward_rows(plan, case, batch, pos, mha, layer)
        area.notes += notes
    for n_kv in plan.gqa_kv_heads:
        batch, pos = plan.gqa_shape
        config = AttentionConfig(d_model=plan.d_model, n_heads=plan.n_heads, n_kv_heads=n_kv)
        torch.manual_seed(0)
        grouped = MultiHeadAttention(config).to(device=plan.device, dtype=plan.torch_dtype).eval()
        case = case_name(batch, pos, config)
        tick(f"layer {case}")
        floor = raw_floor(grouped)
        x = torch.randn(batch, pos, plan.d_model, device=plan.device, dtype=plan.torch_dtype)
        with torch.inference_mode():
            check_same(case, {"headlab": grouped(x), "raw floor": floor(x)}, plan.torch_dtype)
            t = time_interleaved({"headlab": partial(grouped, x), "floor": partial(floor, x)},
                                 rounds=plan.rounds, min_block_s=plan.min_block_s, device=plan.device)
        label = "multi-query" if n_kv == 1 else "grouped-query"
        area.rows.append(Comparison(case, f"headlab {label} forward", f"raw {label} floor (SDPA enable_gqa)",
                                    t["headlab"], t["floor"], goal=FORWARD_FLOOR_GOAL,
                                    flops=layer_flops(config, batch=batch, pos=pos)))
    return area


def _forward_rows(plan: Plan, case: str, batch: int, pos: int, mha: nn.MultiheadAttention,
                  layer: MultiHeadAttention) -> tuple[list[Comparison], list[str]]:
    """The forward's rows of one shape, and a note when the goal against nn.MHA was out of reach in this run."""
    floor = raw_floor(layer)
    mha.eval(), layer.eval()
    x = torch.randn(batch, pos, plan.d_model, device=plan.device, dtype=plan.torch_dtype)
    fns = {
        "headlab": lambda: layer(x),
        "floor": lambda: floor(x),
        "floor again": lambda: floor(x),
        "mha": lambda: mha(x, x, x, need_weights=False),
        "mha weights": lambda: mha(x, x, x, need_weights=True),
    }
    with torch.inference_mode():
        check_same(case, {"headlab": layer(x), "raw floor": floor(x), "nn.MHA": mha(x, x, x, need_weights=False)[0]},
                   plan.torch_dtype)
        t = time_interleaved(fns, rounds=plan.rounds, min_block_s=plan.min_block_s, device=plan.device)
    flops = layer_flops(layer.config, batch=batch, pos=pos)
    ceiling_goal = plan.ceiling_goal if pos == plan.ceiling_goal_positions else None
    vs_mha = Comparison(case, "headlab forward", "nn.MHA need_weights=False", t["headlab"], t["mha"],
                        goal=FORWARD_MHA_GOAL, flops=flops)
    bound = Comparison(case, "raw floor (the bound)", "nn.MHA need_weights=False", t["floor"], t["mha"], flops=flops)
    note = bound_note(case, vs_mha, bound, "nn.MHA's overhead over the fused kernel is all there is to gain, and it "
                      "varies from run to run.")
    return [
        Comparison(case, "A/A: raw floor (timing noise)", "raw floor", t["floor again"], t["floor"], flops=flops),
        Comparison(case, "headlab forward", "raw floor", t["headlab"], t["floor"], goal=FORWARD_FLOOR_GOAL,
                   flops=flops, ceiling_goal=ceiling_goal),
        vs_mha,
        bound,
        Comparison(case, "headlab forward", "nn.MHA need_weights=True", t["headlab"], t["mha weights"], flops=flops),
    ], [note] if note else []


def _backward_rows(plan: Plan, case: str, batch: int, pos: int, mha: nn.MultiheadAttention,
                   layer: MultiHeadAttention) -> list[Comparison]:
    floor = raw_floor(layer)
    mha.train(), layer.train()  # dropout is 0; train mode as in training (no inference fast paths)
    x = torch.randn(batch, pos, plan.d_model, device=plan.device, dtype=plan.torch_dtype, requires_grad=True)
    grad = torch.randn_like(x)
    fns = {
        "headlab": lambda: layer(x).backward(grad),
        "floor": lambda: floor(x).backward(grad),
        "mha": lambda: mha(x, x, x, need_weights=False)[0].backward(grad),
    }
    t = time_interleaved(fns, rounds=plan.rounds, min_block_s=plan.min_block_s, device=plan.device)
    flops = BACKWARD_FACTOR * layer_flops(layer.config, batch=batch, pos=pos)
    rows = [
        Comparison(case, "headlab forward + backward", "raw floor", t["headlab"], t["floor"], flops=flops),
        Comparison(case, "headlab forward + backward", "nn.MHA need_weights=False", t["headlab"], t["mha"],
                   flops=flops),
    ]
    mha.eval(), layer.eval()
    return rows
