"""The models area on a tiny plan: its rows, peers and goals, the equal-output check, the JSON round trip.
No timing is asserted."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from headlab.bench import Area, Plan, plan_for
from headlab.bench.models import (
    ATTACHED_GOAL,
    EVERY_PATTERN_GOAL,
    ONE_HEAD_GOAL,
    bench_models,
    check_models,
    running,
    tiny_causal_model,
)

pytest.importorskip("transformers")

SDPA, EAGER = "plain transformers (sdpa)", "transformers eager, output_attentions=True"


@pytest.fixture(scope="module")
def area() -> Area:
    import headlab
    from tests.support.bench import tiny_plan

    plan = tiny_plan()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops on a busy machine: one thread does not wait on descheduled workers
    try:
        return bench_models(plan, headlab.load())
    finally:
        torch.set_num_threads(threads)


def _cases(area: Area) -> list[str]:
    return list(dict.fromkeys(r.case for r in area.rows))


def test_every_model_has_a_row_per_goal_with_the_right_peer(area: Area) -> None:
    minilm, llama, vit, bart = _cases(area)
    assert "default model" in minilm and "12 heads" in minilm
    assert "Llama" in llama and "2 kv heads" in llama and "causal" in llama and "pos 16" in llama
    assert "ViT" in vit and "224 × 224" in vit and "BART" in bart and "self and cross" in bart
    sites = {minilm: 6, llama: 4, vit: 6, bart: 4 + 4 + 4}  # BART: encoder, decoder self and cross
    for case, layers in sites.items():
        rows = {(r.contender, r.peer): r.goal for r in area.rows if r.case == case}
        assert rows == {
            ("A/A: plain transformers (timing noise)", SDPA): None,
            ("headlab attached, nothing inspected", SDPA): ATTACHED_GOAL,
            ("headlab attached, output_attentions=True", EAGER): EVERY_PATTERN_GOAL,
            ("headlab attached, one head's pattern (layer 0, head 0)", SDPA): ONE_HEAD_GOAL,
            (f"headlab attached, one head's pattern in every layer (head 0 of {layers})", SDPA): ONE_HEAD_GOAL,
        }


def test_goals_are_the_issues(area: Area) -> None:
    assert (ATTACHED_GOAL, EVERY_PATTERN_GOAL, ONE_HEAD_GOAL) == (1.02, 1.00, 1.15)
    assert all(r.met() is not None for r in area.rows if not r.contender.startswith("A/A"))


def test_rows_share_the_peer_timing_of_their_group(area: Area) -> None:
    for case in _cases(area):
        plain = {r.peer_time for r in area.rows if r.case == case and r.peer == SDPA}
        assert len(plain) == 1  # one interleaved group per model: every sdpa row divides by the same timing
        rows = [r for r in area.rows if r.case == case]
        assert all(r.tokens and r.tokens > 0 for r in rows)
        assert len({len(r.contender_time.samples) for r in rows}) == 1


def test_area_round_trips_through_json(area: Area) -> None:
    again = Area.from_dict(json.loads(json.dumps(area.to_dict())))
    assert again == area
    assert [r["goal"] for r in again.to_dict()["rows"]] == [r.goal for r in area.rows]


@pytest.fixture(scope="module")
def causal() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    import headlab

    model = headlab.attach(tiny_causal_model(positions=12)).model
    return model, {"input_ids": torch.randint(0, 1024, (2, 12), generator=torch.Generator().manual_seed(1))}


def test_peers_are_the_same_model_under_transformers_own_attention(causal: tuple) -> None:
    from headlab.models import headed

    attached, _ = causal
    weights = [p.data_ptr() for p in attached.parameters()]
    for implementation in ("sdpa", "eager"):
        with running(attached, implementation) as peer:
            assert peer is attached and peer.config._attn_implementation == implementation
            with pytest.raises(ValueError, match=f"runs attn_implementation='{implementation}' now"):
                _ = headed(attached).sites  # headlab's taps and gates would not run
        assert attached.config._attn_implementation == "headlab" and headed(attached).sites
    with pytest.raises(RuntimeError, match="inside"), running(attached, "sdpa"):
        raise RuntimeError("inside")
    assert attached.config._attn_implementation == "headlab"
    assert [p.data_ptr() for p in attached.parameters()] == weights


def test_check_passes_equal_models_and_names_the_ones_that_differ(causal: tuple) -> None:
    from headlab import heads

    attached, batch = causal
    with torch.inference_mode():
        check_models("tiny", attached, batch, dtype=torch.float32)
    masked = copy.deepcopy(attached)
    heads.mask(masked, {1: [3]})  # headlab's attention now computes another model: timings would not compare
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"tiny: .* disagree, so their timings"):
        check_models("tiny", masked, batch, dtype=torch.float32)


def test_plan_carries_the_causal_shape(tiny_plan: Plan) -> None:
    assert [plan_for("cpu", quick=q).causal_shape[1] for q in (False, True)] == [512, 512]
    assert Plan.from_dict(json.loads(json.dumps(tiny_plan.to_dict()))) == tiny_plan
    data = tiny_plan.to_dict()
    del data["causal_shape"]  # a run stored before the models area
    assert Plan.from_dict(data).causal_shape == Plan.__dataclass_fields__["causal_shape"].default
