"""The large-model area on small sizes: every row against its peer, the dtype chosen and stated, the model of the
stated shapes, the pruned checkpoint loading back to the same outputs. No timing is asserted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import headlab
from headlab import heads
from headlab.bench import Plan, plan_for
from headlab.bench.large import (
    CANDIDATE_DTYPES,
    INIT_STD,
    bench_large,
    build_large_model,
    half_the_groups,
    large_config,
    save_large_model,
)
from headlab.bench.memory import peak_memory_available
from headlab.bench.suite import AREAS


@pytest.fixture(scope="module")
def area():
    from tests.support.bench import tiny_plan

    plan = tiny_plan()  # the fixture's value, in a module-scoped fixture
    return plan, bench_large(plan)


def test_the_area_is_one_of_the_suite_and_quick_runs_a_much_smaller_model() -> None:
    assert "large" in AREAS
    full, quick = plan_for("cpu", quick=False), plan_for("cpu", quick=True)
    assert full.large_model == (16, 2048) and quick.large_model == (4, 512)
    assert quick.large_shape[1] < full.large_shape[1]


def test_every_row_is_measured_against_its_peer_with_the_issues_goals(area: tuple[Plan, object]) -> None:
    plan, measured = area
    rows = {(r.contender, r.peer): r for r in measured.rows}
    goals = {pair: r.goal for pair, r in rows.items() if r.goal is not None}
    plain_load, plain = "transformers from_pretrained (sdpa)", "plain transformers (sdpa)"
    assert goals == {
        ("headlab.load (attached)", plain_load): 1.05,
        ("headlab.load (attached) + one forward of 16 tokens", f"{plain_load} + one forward of 16 tokens"): 1.05,
        ("headlab.load, half the heads pruned (headlab.heads.save)", "headlab.load, unpruned"): 1.2,
        ("headlab attached, nothing inspected", plain): 1.02,
        ("headlab attached, one head's pattern in every layer (head 0)", plain): 1.15,
        **({("peak memory of headlab.load, half the heads pruned", "peak memory of headlab.load, unpruned"): 1.0}
           if peak_memory_available() is None else {}),
    }
    assert ("A/A: plain transformers (timing noise)", plain) in rows
    assert ("A/A: transformers from_pretrained (timing noise)", plain_load) in rows
    assert ("headlab.load (attached) + one forward of 16 tokens", f"{plain_load} + a forward of attach's probe inputs "
            "+ one forward of 16 tokens (the bound)") in rows
    for row in measured.rows:
        assert row.ratio == pytest.approx(row.contender_time.median / row.peer_time.median)
        assert len(row.peer_time.samples) >= 1 and len(row.contender_time.samples) >= 1
    if peak_memory_available() is None:
        memory = [r for r in measured.rows if r.unit == "bytes"]
        assert {r.contender for r in memory} == {
            "peak memory of headlab.load, half the heads pruned", "peak memory of headlab.load (attached)",
            "peak memory of headlab.load (attached) + one forward of 16 tokens",
            "peak memory of the attached forward, nothing inspected",
            "peak memory of the attached forward, head 0 of every layer tapped"}
        assert all(len(r.contender_time.samples) == plan.memory_rounds for r in memory)
    assert measured.error is None and any("probe forward" in note for note in measured.notes)


def test_the_chosen_dtype_and_both_forward_times_are_stated(area: tuple[Plan, object]) -> None:
    _, measured = area
    stated = re.search(r"dtype (\w+): one forward of batch 1 × 32 positions took ([\d.e-]+) s in float32 and "
                       r"([\d.e-]+) s in bfloat16", measured.description)
    assert stated is not None, measured.description
    chosen, float32, bfloat16 = stated.group(1), float(stated.group(2)), float(stated.group(3))
    assert chosen in CANDIDATE_DTYPES and chosen == ("float32" if float32 < bfloat16 else "bfloat16")
    assert all(chosen in row.case for row in measured.rows)
    [choice] = [r for r in measured.rows if "dtype choice" in r.contender]
    assert f"{choice.contender_time.median:.3g}" == stated.group(3)


def test_the_config_has_a_1b_llamas_shapes_and_refuses_a_width_without_two_kv_heads() -> None:
    config = large_config(layers=16, d_model=2048)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
            config.intermediate_size) == (16, 2048, 32, 8, 8192)
    with pytest.raises(ValueError, match="d_model=256; expected layers ≥ 1 and d_model a multiple of 512"):
        large_config(layers=2, d_model=256)


def test_the_model_built_has_the_stated_shapes_and_finite_varied_weights() -> None:
    model = build_large_model(large_config(layers=2, d_model=512), dtype=torch.float32)
    attention, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert len(model.model.layers) == 2
    assert attention.q_proj.weight.shape == (512, 512) and attention.k_proj.weight.shape == (128, 512)
    assert attention.v_proj.weight.shape == (128, 512) and attention.o_proj.weight.shape == (512, 512)
    assert mlp.up_proj.weight.shape == (2048, 512) and model.lm_head.weight.shape == (8192, 512)
    weights = [p for p in model.parameters() if p.ndim == 2]
    assert all(torch.isfinite(w).all() for w in weights)
    assert all(w.std().item() == pytest.approx(INIT_STD, rel=0.05) for w in weights)
    assert not torch.equal(attention.q_proj.weight, attention.k_proj.weight.repeat(4, 1))  # each drawn on its own
    assert all(torch.equal(p, torch.ones_like(p)) for p in model.parameters() if p.ndim == 1)
    again = build_large_model(large_config(layers=2, d_model=512), dtype=torch.float32)
    assert torch.equal(again.model.layers[1].self_attn.q_proj.weight, attention.q_proj.weight)  # seeded
    ids = torch.arange(12).reshape(1, 12)
    with torch.inference_mode():
        hidden = model.model(input_ids=ids).last_hidden_state
    assert torch.isfinite(hidden).all() and hidden.std() > 0.1


def test_the_pruned_checkpoint_loads_back_to_the_pruned_models_outputs(tmp_path: Path) -> None:
    config = large_config(layers=2, d_model=512)
    folder = save_large_model(config, tmp_path / "model", dtype=torch.float32)
    loaded = headlab.load(folder)
    assert half_the_groups(32, 8) == list(range(16, 32)) and half_the_groups(8, 2) == [4, 5, 6, 7]
    heads.prune(loaded, {site.layer: half_the_groups(8, 2) for site in loaded.sites})
    heads.save(loaded, tmp_path / "pruned")
    again = headlab.load(tmp_path / "pruned")
    attention = again.model.model.layers[0].self_attn
    assert attention.q_proj.weight.shape == (256, 512) and attention.k_proj.weight.shape == (64, 512)
    assert [site.n_heads for site in again.sites] == [4, 4]
    ids = torch.arange(20).reshape(2, 10)
    with torch.inference_mode():
        torch.testing.assert_close(again.model(input_ids=ids).logits, loaded.model(input_ids=ids).logits)
