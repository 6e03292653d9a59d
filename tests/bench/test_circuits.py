"""The circuits area on a tiny plan (the default model at 16 tokens, 8 sampled edges): its rows, peers, goals
and finite numbers, the extrapolation of edge patching, the JSON round trip, and the inputs it builds. No
timing is asserted."""

from __future__ import annotations

import json
import math

import pytest
import torch

from headlab.bench import Area
from headlab.bench.circuits import EAP_GOAL, EAP_IG_GOAL, EAP_IG_STEPS, MEMORY_GOAL, PEER, circuit_inputs
from headlab.bench.memory import peak_memory_available

pytest.importorskip("transformers")

EDGES = 6769  # MiniLM's graph: 6 layers × 12 heads
SAMPLED = 8  # the tiny plan's circuit_edges


@pytest.fixture(scope="module")
def area() -> Area:
    from headlab.bench.circuits import bench_circuits
    from tests.support.bench import tiny_plan
    from tests.support.minilm import minilm

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops on a busy machine: one thread does not wait on descheduled workers
    try:
        return bench_circuits(tiny_plan(), minilm())
    finally:
        torch.set_num_threads(threads)


def test_rows_time_each_method_against_one_forward_and_backward(area: Area) -> None:
    assert area.name == "circuits" and area.error is None
    eap, ig, exact = area.rows[:3]
    assert [(r.contender, r.peer, r.goal, r.unit) for r in area.rows[:3]] == [
        ("EAP, every edge", PEER, EAP_GOAL, "s"),
        (f"EAP-IG ({EAP_IG_STEPS} steps), every edge", PEER, EAP_IG_GOAL, "s"),
        (f"exact edge patching, every edge (extrapolated from {SAMPLED} sampled)", PEER, None, "s")]
    for row in area.rows:
        assert "default model" in row.case and "16 tokens" in row.case and f"{EDGES:,} edges" in row.case
        assert math.isfinite(row.ratio) and row.ratio > 0
        assert len(row.contender_time.samples) == len(row.peer_time.samples) == (2 if row.unit == "s" else 1)
    for row, passes in ((eap, (2, 1)), (ig, (2 + EAP_IG_STEPS, EAP_IG_STEPS))):
        assert row.details["edges"] == EDGES and (row.details["forwards"], row.details["backwards"]) == passes
        for key in (f"spearman |score| vs edge patching ({SAMPLED} edges)", "spearman signed vs edge patching"):
            assert -1.0 <= row.details[key] <= 1.0
    assert exact.details["edges"] == EDGES and exact.details["sampled edges"] == SAMPLED


def test_edge_patching_is_extrapolated_per_forward_from_the_sample(area: Area) -> None:
    exact = area.rows[2]
    sampled, every = exact.details["forwards for the sample"], exact.details["forwards for every edge"]
    assert (sampled, every) == (SAMPLED + 2, EDGES + 2)  # one forward per edge and the two unpatched runs
    assert exact.contender_time.median == pytest.approx(exact.details["seconds for the sample"] * every / sampled)
    assert any("extrapolated, not timed" in note and f"{SAMPLED} of the {EDGES:,} edges" in note
               for note in area.notes)


def test_the_rank_agreement_is_stated_in_a_note(area: Area) -> None:
    eap = area.rows[0].details[f"spearman |score| vs edge patching ({SAMPLED} edges)"]
    note = next(n for n in area.notes if n.startswith("Rank agreement"))
    assert f"EAP {eap:.3f}" in note


@pytest.mark.skipif(peak_memory_available() is not None, reason="peak memory cannot be measured here")
def test_peak_memory_rows_compare_bytes_with_the_peer(area: Area) -> None:
    rows = area.rows[3:]
    assert [(r.contender, r.goal, r.unit) for r in rows] == [
        ("peak memory of EAP", MEMORY_GOAL, "bytes"),
        (f"peak memory of EAP-IG ({EAP_IG_STEPS} steps)", MEMORY_GOAL, "bytes")]
    for row in rows:
        assert row.peer == f"peak memory of the {PEER}"
        assert row.contender_time.median >= 4096 and row.peer_time.median >= 4096
        assert row.peer_time == rows[0].peer_time  # one peer measurement for both
        assert row.tokens_per_s() is None and row.flops_per_s() is None


def test_area_round_trips_through_json(area: Area) -> None:
    again = Area.from_dict(json.loads(json.dumps(area.to_dict())))
    assert again == area


def test_inputs_are_the_corpus_with_an_eighth_of_its_word_pieces_replaced() -> None:
    from tests.support.minilm import minilm_tokenizer

    tokenizer = minilm_tokenizer()
    clean, corrupted, replaced = circuit_inputs(tokenizer, 128)
    assert clean.shape == corrupted.shape == (1, 128)
    assert int((clean != corrupted).sum()) == replaced == round(126 / 8)  # [CLS] and [SEP] are not word pieces
    assert clean[0, 0] == corrupted[0, 0] == tokenizer.cls_token_id
    assert clean[0, -1] == corrupted[0, -1] == tokenizer.sep_token_id
    again = circuit_inputs(tokenizer, 128)
    assert torch.equal(again[0], clean) and torch.equal(again[1], corrupted)  # seeded
    assert not torch.equal(circuit_inputs(tokenizer, 128, seed=1)[1], corrupted)


def test_a_corpus_too_short_for_the_tokens_is_refused() -> None:
    from tests.support.minilm import minilm_tokenizer

    with pytest.raises(ValueError, match="needs 100000"):
        circuit_inputs(minilm_tokenizer(), 100_000)
