"""What inspecting heads costs: one head's pattern, every head's pattern, every head's output.

Axis legend: x ``(batch, pos, d_model)``; patterns ``(batch, head, query_pos, key_pos)``.

Each is timed against headlab's plain forward in the same group, and against what
``torch.nn.MultiheadAttention`` offers instead: ``need_weights=True`` (the head-averaged
pattern; the only way it shows anything of one head) and ``average_attn_weights=False``
(every head's pattern). Goals: one head's pattern costs at most ``ONE_HEAD_GOAL`` × the plain
forward at every position count (the fused kernel's log-sum-exp gives it with one q·kᵀ and
one exp); when one head's pattern is wanted, headlab is at least twice as fast as
nn.MultiheadAttention with need_weights=True at 1k positions and above. The bound beside the first
goal is the raw floor (``headlab.bench.layer``) plus one head's q·kᵀ and softmax, the least eager
PyTorch does to show that head; where it alone takes more than the goal, a note says so.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from headlab.bench.layer import bound_note, case_name, layer_flops, raw_floor, standard_pair
from headlab.bench.plan import Plan
from headlab.bench.records import Area, Comparison
from headlab.bench.timing import time_interleaved

__all__ = ["ONE_HEAD_GOAL", "ONE_HEAD_VS_WEIGHTS_GOAL", "ONE_HEAD_VS_WEIGHTS_FROM", "bench_inspection"]

ONE_HEAD_GOAL = 1.10  # forward + one head's pattern / plain forward, at every position count
ONE_HEAD_VS_WEIGHTS_GOAL = 0.5  # forward + one head's pattern / nn.MHA need_weights=True …
ONE_HEAD_VS_WEIGHTS_FROM = 1024  # … at this many positions and above


def bench_inspection(plan: Plan, *, tick: Callable[[str], None] = lambda _: None) -> Area:
    """Inspection costs at every ``plan.layer_shapes``.

    Args:
        plan: sizes, device, dtype and rounds.
        tick: called with a label as each case starts (progress).

    Returns:
        The "inspection" area.
    """
    area = Area("inspection", "Inspection: patterns and head outputs", (
        f"{plan.dtype} on {plan.device}, inference. Every contender is timed in one interleaved group per case "
        f"({plan.rounds} rounds, median). The patterns of a few heads are computed beside the fused kernel for those "
        "heads only; every head's pattern takes the explicit path (the softmax is paid for anyway)."))
    mha, layer = standard_pair(plan)
    mha.eval(), layer.eval()
    for batch, pos in plan.layer_shapes:
        case = case_name(batch, pos, layer.config)
        tick(f"inspection {case}")
        x = torch.randn(batch, pos, plan.d_model, device=plan.device, dtype=plan.torch_dtype)
        floor, floor_pattern = raw_floor(layer), raw_floor(layer, pattern_head=0)
        with torch.inference_mode():
            _check(case, layer, mha, floor_pattern, x)
            t = time_interleaved({  # partial binds this case's x and floors now (a lambda reads them when called)
                "forward": partial(layer, x),
                "floor": partial(floor, x),
                "floor pattern": partial(floor_pattern, x),
                "one pattern": partial(layer, x, return_pattern=[0]),
                "all patterns": partial(layer, x, return_pattern=True),
                "head outputs": partial(layer, x, return_result=True),
                "mha weights": partial(mha, x, x, x, need_weights=True),
                "mha all weights": partial(mha, x, x, x, need_weights=True, average_attn_weights=False),
            }, rounds=plan.rounds, min_block_s=plan.min_block_s, device=plan.device)
        flops = layer_flops(layer.config, batch=batch, pos=pos)
        vs_forward = Comparison(case, "forward + one head's pattern", "headlab forward", t["one pattern"], t["forward"],
                                goal=ONE_HEAD_GOAL, flops=flops)
        pattern_bound = Comparison(case, "raw floor + one head's pattern (the bound)", "headlab forward",
                                   t["floor pattern"], t["forward"], flops=flops)
        vs_weights = Comparison(case, "forward + one head's pattern", "nn.MHA need_weights=True (head average)",
                                t["one pattern"], t["mha weights"], flops=flops,
                                goal=ONE_HEAD_VS_WEIGHTS_GOAL if pos >= ONE_HEAD_VS_WEIGHTS_FROM else None)
        bound = Comparison(case, "raw floor, no pattern (the bound)", "nn.MHA need_weights=True (head average)",
                           t["floor"], t["mha weights"], flops=flops)
        notes = (
            bound_note(case, vs_forward, pattern_bound, "One head's pattern writes query × key scores to memory and "
                       "softmaxes them, and on small inputs adds kernel launches, beside a fused forward that never "
                       "writes a score."),
            bound_note(case, vs_weights, bound, "The raw floor forms no pattern; need_weights=True only adds the "
                       "explicit softmax over query × key positions, which is small next to the projections until "
                       "positions grow."),
        )
        area.notes += [note for note in notes if note]
        area.rows += [
            vs_forward,
            pattern_bound,
            vs_weights,
            bound,
            Comparison(case, "forward + every head's pattern", "headlab forward", t["all patterns"], t["forward"],
                       flops=flops),
            Comparison(case, "forward + every head's pattern", "nn.MHA average_attn_weights=False",
                       t["all patterns"], t["mha all weights"], flops=flops),
            Comparison(case, "forward + every head's output", "headlab forward", t["head outputs"], t["forward"],
                       flops=flops),
        ]
    return area


def _check(case: str, layer: torch.nn.Module, mha: torch.nn.Module, floor_pattern: Callable, x: torch.Tensor) -> None:
    """The patterns timed are the patterns nn.MultiheadAttention gives (so the timings compare like with like)."""
    tol = 1e-4 if x.dtype in (torch.float32, torch.float64) else 3e-2
    ours = layer(x, return_pattern=True).pattern
    theirs = mha(x, x, x, need_weights=True, average_attn_weights=False)[1]
    one = layer(x, return_pattern=[0]).pattern
    bound = floor_pattern(x)[1]
    for name, got, want in (("headlab's every head's pattern", ours, theirs),
                            ("headlab's one head's pattern", one, theirs[:, :1]),
                            ("the raw floor's pattern", bound, theirs[:, :1])):
        try:
            torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
        except AssertionError as err:
            raise RuntimeError(f"{case}: {name} differs from nn.MultiheadAttention's: {err}") from None
