"""What the bench tests share: a plan that runs every benchmark in seconds, and a hand-made run."""

from __future__ import annotations

from headlab.bench import (
    Area,
    Ceilings,
    Comparison,
    Plan,
    SuiteResult,
    Timing,
    plan_for,
)


def tiny_plan() -> Plan:
    """Every benchmark of the suite on sizes that take seconds (no timing is asserted)."""
    return Plan(device="cpu", dtype="float32", d_model=32, n_heads=4, layer_shapes=((2, 8), (1, 16)),
                gqa_kv_heads=(2, 1), gqa_shape=(2, 8), decode_context=8, decode_steps=3, rounds=2,
                min_block_s=1e-4, corpus_items=4, capture_rounds=1, hf_batch_size=2, analysis_items=3,
                analysis_rounds=1, importance_pairs=2, matmul_size=32, copy_mib=1, causal_shape=(1, 16),
                circuit_tokens=16, circuit_edges=8, memory_rounds=1)


def comparison(contender: float, peer: float, **kwargs: object) -> Comparison:
    """A comparison of "headlab" (median ``contender`` s of three timings) with "peer" (one timing of ``peer`` s)."""
    return Comparison("case", "headlab", "peer", Timing((contender, contender * 2, contender / 2)),
                      Timing((peer,)), **kwargs)


def suite_result() -> SuiteResult:
    """A quick CPU run of two areas: "layer" (a goal met, a goal missed, a note) and "decode" (no goal)."""
    plan = plan_for("cpu", quick=True)
    ceilings = Ceilings(device="cpu", dtype="float32", matmul_size=100, matmul=Timing((1e-3, 2e-3)), copy_bytes=4096,
                        copy=Timing((1e-6,)))
    rows = [comparison(1.0, 1.0, goal=1.05, flops=2 * 10**6),
            comparison(2.0, 1.0, goal=1.0, tokens=50, details={"padding": 1.5}), comparison(1.0, 2.0)]
    return SuiteResult(plan=plan, quick=True, command="headlab bench --quick", started="2026-01-01T00:00:00+00:00",
                       seconds=12.0, machine={"cpu": "test"}, ceilings=ceilings,
                       areas=[Area("layer", "Layer", "what ran", rows[:2], notes=["a note"]),
                              Area("decode", "D", "d", rows[2:])])
