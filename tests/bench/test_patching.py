"""The patching area on a tiny plan: a row per model with its peer, goal and details, the JSON round
trip, and the tied logit difference against a language-model head. No timing is asserted."""

from __future__ import annotations

import json

import pytest
import torch

from headlab.bench import Area
from headlab.bench.patching import ATP_GOAL, tied_logit_difference

pytest.importorskip("transformers")

EXACT, ATP = "exact activation patching, every head", "attribution patching (AtP), every head"


@pytest.fixture(scope="module")
def area() -> Area:
    import headlab
    from headlab.bench.patching import bench_patching
    from tests.support.bench import tiny_plan

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops on a busy machine: one thread does not wait on descheduled workers
    try:
        return bench_patching(tiny_plan(), headlab.load())
    finally:
        torch.set_num_threads(threads)


def test_a_row_per_model_against_exact_patching(area: Area) -> None:
    assert area.name == "patching"
    minilm, llama = area.rows
    assert "default model" in minilm.case and "9 tokens" in minilm.case
    assert "Llama" in llama.case and "pos 16" in llama.case and "4 positions corrupted" in llama.case
    for row, heads in ((minilm, 72), (llama, 32)):
        assert (row.contender, row.peer, row.goal) == (ATP, EXACT, ATP_GOAL)
        assert len(row.contender_time.samples) == len(row.peer_time.samples) == 2  # the tiny plan's rounds
        details = row.details
        assert (details["heads"], details["exact forwards"], details["AtP forwards"], details["AtP backwards"]) == (
            heads, heads + 2, 2, 1)
        assert -1.0 <= details["spearman signed effect"] <= 1.0 and -1.0 <= details["spearman |effect|"] <= 1.0


def test_atp_ranks_minilm_heads_like_exact_patching(area: Area) -> None:
    details = area.rows[0].details  # float32 on CPU: the same numbers on every run
    assert details["spearman |effect|"] > 0.8 and details["spearman signed effect"] > 0.8


def test_area_round_trips_through_json(area: Area) -> None:
    again = Area.from_dict(json.loads(json.dumps(area.to_dict())))
    assert again == area
    assert again.rows[1].details == area.rows[1].details


def test_tied_logit_difference_is_a_tied_heads_logit_difference() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from headlab.bench.models import CAUSAL_CONFIG

    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(**CAUSAL_CONFIG, tie_word_embeddings=True)).eval()
    ids = torch.randint(0, CAUSAL_CONFIG["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = lm(input_ids=ids).logits[:, -1]  # (batch, vocab)
        value = tied_logit_difference(lm.model, 7, 11)(lm.model(input_ids=ids))
    torch.testing.assert_close(value, (logits[:, 7] - logits[:, 11]).mean())
