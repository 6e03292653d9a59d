"""Plans: the sizes the issue asks for on each device, --quick smaller, round trip, bad device."""

from __future__ import annotations

import pytest
import torch

from headlab.bench import Plan, plan_for


def test_cpu_runs_float32_at_128_1k_and_2k_positions() -> None:
    plan = plan_for("cpu", quick=False)
    assert plan.torch_dtype == torch.float32
    assert [pos for _, pos in plan.layer_shapes] == [128, 1024, 2048]
    assert plan.corpus_items is None and plan.importance_pairs is None


def test_quick_keeps_every_benchmark_on_smaller_budgets() -> None:
    full, quick = plan_for("cpu", quick=False), plan_for("cpu", quick=True)
    assert max(p for _, p in quick.layer_shapes) < max(p for _, p in full.layer_shapes)
    assert sum(b * p for b, p in quick.layer_shapes) < sum(b * p for b, p in full.layer_shapes)
    assert 1024 in [p for _, p in quick.layer_shapes]  # the one-head goal starts at 1k positions
    assert quick.rounds < full.rounds and quick.corpus_items and quick.gqa_kv_heads == full.gqa_kv_heads


def test_cuda_runs_bfloat16_up_to_4k_positions_with_the_ceiling_goal_there() -> None:
    plan = plan_for("cuda", quick=False)
    assert plan.torch_dtype == torch.bfloat16
    assert max(pos for _, pos in plan.layer_shapes) == 4096 == plan.ceiling_goal_positions
    assert plan.ceiling_goal == 0.5


def test_plan_round_trips() -> None:
    plan = plan_for("cuda", quick=True)
    assert Plan.from_dict(plan.to_dict()) == plan


def test_unknown_device_is_named() -> None:
    with pytest.raises(ValueError, match="device='tpu'"):
        plan_for("tpu", quick=False)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_circuits_run_128_tokens_and_time_edge_patching_on_a_sample(device: str) -> None:
    quick, full = plan_for(device, quick=True), plan_for(device, quick=False)
    assert quick.circuit_tokens == full.circuit_tokens == 128
    assert quick.circuit_edges == 200 and full.circuit_edges is not None and full.circuit_edges >= 200
    assert 1 <= quick.memory_rounds <= full.memory_rounds


def test_a_plan_stored_before_the_circuits_area_reads_with_its_defaults() -> None:
    stored = plan_for("cpu", quick=False).to_dict()
    for key in ("circuit_tokens", "circuit_edges", "memory_rounds"):
        del stored[key]
    plan = Plan.from_dict(stored)
    assert (plan.circuit_tokens, plan.circuit_edges, plan.memory_rounds) == (128, 200, 3)
