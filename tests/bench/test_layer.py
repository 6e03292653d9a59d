"""The layer benchmark's pieces: FLOPs from the accounting, the raw floor, the same-output check."""

from __future__ import annotations

import pytest
import torch

from headlab.bench.layer import check_same, layer_flops, raw_floor
from headlab.layer import AttentionConfig, MultiHeadAttention


@pytest.mark.parametrize("n_kv_heads", [8, 2, 1])
def test_flops_are_the_accountings_matrix_multiplies(n_kv_heads: int) -> None:
    d, h, L, batch = 64, 8, 32, 3
    c = AttentionConfig(d_model=d, n_heads=h, n_kv_heads=n_kv_heads)
    kv = n_kv_heads * c.d_head
    by_hand = 2 * L * d * (d + 2 * kv) + 2 * 2 * h * L * L * c.d_head + 2 * L * d * d
    assert layer_flops(c, batch=batch, pos=L) == batch * by_hand


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_raw_floor_computes_the_layer(n_kv_heads: int) -> None:
    layer = MultiHeadAttention(AttentionConfig(d_model=32, n_heads=4, n_kv_heads=n_kv_heads)).eval()
    with torch.no_grad():
        layer.projection.in_proj_bias.normal_()
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(raw_floor(layer)(x), layer(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("n_kv_heads", "head"), [(4, 0), (4, 3), (2, 3), (1, 2)])
def test_raw_floor_with_a_pattern_gives_that_heads_pattern(n_kv_heads: int, head: int) -> None:
    layer = MultiHeadAttention(AttentionConfig(d_model=32, n_heads=4, n_kv_heads=n_kv_heads)).eval()
    x = torch.randn(2, 7, 32)
    output, pattern = raw_floor(layer, pattern_head=head)(x)
    got = layer(x, return_pattern=[head])
    torch.testing.assert_close(output, got.output, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pattern, got.pattern, atol=1e-6, rtol=1e-5)


def test_raw_floor_refuses_other_projections() -> None:
    with pytest.raises(ValueError, match="projection='narrow'"):
        raw_floor(MultiHeadAttention(AttentionConfig(d_model=32, n_heads=4, projection="narrow")))


def test_check_same_refuses_contenders_that_compute_different_things() -> None:
    x = torch.randn(3, 4)
    check_same("case", {"a": x, "b": x + 1e-7}, torch.float32)
    with pytest.raises(RuntimeError, match="case: b and a disagree"):
        check_same("case", {"a": x, "b": x + 1.0}, torch.float32)


@pytest.mark.parametrize(("floor", "headlab", "noted"), [
    (0.95, 0.97, True),  # nn.MHA only 5% above the floor: 0.85 is out of reach, and the goal is missed
    (0.70, 0.97, False),  # reachable: the miss is headlab's own
    (0.95, 0.80, False),  # met
])
def test_the_goal_against_nn_mha_is_called_out_of_reach_only_when_the_floor_is_above_it(monkeypatch, floor, headlab,
                                                                                        noted):
    from headlab.bench import layer as layer_area
    from headlab.bench.plan import plan_for
    from headlab.bench.timing import Timing

    seconds = {"headlab": headlab, "floor": floor, "floor again": floor, "mha": 1.0, "mha weights": 1.1}
    monkeypatch.setattr(layer_area, "time_interleaved",
                        lambda fns, **_: {name: Timing((seconds[name],)) for name in fns})
    mha, layer = layer_area.standard_pair(plan_for("cpu", quick=True))
    rows, notes = layer_area._forward_rows(plan_for("cpu", quick=True), "case", 1, 8, mha, layer)
    bound = next(r for r in rows if r.contender == "raw floor (the bound)")
    assert bound.peer == "nn.MHA need_weights=False" and bound.ratio == pytest.approx(floor)
    assert len(notes) == noted
    if noted:
        assert f"raw floor alone takes {floor:.2f}×" in notes[0] and "out of reach" in notes[0]


@pytest.mark.parametrize(("bound", "one", "noted"), [
    (1.14, 1.20, True),  # one head's matmul and softmax alone cost 14%: 1.10 is out of reach, and the goal is missed
    (1.04, 1.20, False),  # reachable: the miss is headlab's own
    (1.14, 1.08, False),  # met
])
def test_the_one_head_goal_is_called_out_of_reach_only_when_the_floor_with_a_pattern_is_above_it(
        monkeypatch, bound, one, noted):
    from headlab.bench import inspection
    from headlab.bench.plan import plan_for
    from headlab.bench.timing import Timing

    seconds = {"forward": 1.0, "floor": 0.9, "floor pattern": bound, "one pattern": one, "all patterns": 1.5,
               "head outputs": 1.2, "mha weights": 3.0, "mha all weights": 3.0}
    monkeypatch.setattr(inspection, "time_interleaved",
                        lambda fns, **_: {name: Timing((seconds[name],)) for name in fns})
    plan = plan_for("cpu", quick=True)
    area = inspection.bench_inspection(plan)
    rows = [r for r in area.rows if r.contender == "raw floor + one head's pattern (the bound)"]
    assert len(rows) == len(plan.layer_shapes) and all(r.ratio == pytest.approx(bound) for r in rows)
    notes = [n for n in area.notes if "raw floor + one head's pattern alone" in n]
    assert len(notes) == (len(plan.layer_shapes) if noted else 0)
    if noted:
        assert f"takes {bound:.2f}× its time" in notes[0] and "goal of 1.10× headlab forward" in notes[0]
