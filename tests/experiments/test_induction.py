"""Induction: a previous-token head in layer 0 and an induction head in layer 1, found by headlab's detectors."""

from __future__ import annotations

import json

import pytest
import torch

from headlab.analysis.roles import INDUCTION, PREVIOUS_TOKEN, previous_token_score
from headlab.experiments.induction import head_scores, plot_induction, run_induction
from headlab.experiments.model import build_model
from headlab.experiments.tasks import RepeatTask
from headlab.layer import AttentionConfig


@pytest.fixture(scope="module")
def result():
    return run_induction(seed=0, quick=True)


def test_previous_token_score_of_forced_patterns():
    n = 6
    previous = torch.zeros(n, n)
    previous[0, 0] = 1
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1
    patterns = torch.stack([previous, torch.eye(n)])[None].expand(2, -1, -1, -1)  # (batch, head, q, k)
    assert previous_token_score(patterns).tolist() == [1.0, 0.0]


def test_heads_specialise_in_the_expected_layers(result):
    assert result.loss_drop > 1.0 and result.final_loss < result.initial_loss / 2
    assert result.loss_halved_step is not None and result.final_accuracy > 0.9
    assert result.previous_token_heads and all(layer == 0 for layer, _ in result.previous_token_heads)
    assert result.induction_heads and all(layer == 1 for layer, _ in result.induction_heads)
    assert result.best_previous_token["score"] > PREVIOUS_TOKEN and result.best_induction["score"] > INDUCTION
    assert result.previous_token_step is not None and result.induction_step is not None
    assert result.scores[0]["induction"][1][0] < INDUCTION  # not there at initialisation


def test_head_scores_shapes():
    task = RepeatTask()
    config = AttentionConfig(d_model=16, n_heads=2, rotary=True)
    model = build_model(task, [config] * 3, seed=0)
    probe = torch.cat([torch.full((2, 1), task.bos), torch.arange(8).repeat(2, 2)], dim=1)
    scores = head_scores(model, probe, 8)
    assert set(scores) == {"previous_token", "duplicate_token", "induction"}
    assert all(len(s) == 3 and len(s[0]) == 2 for s in scores.values())
    assert model.training


def test_reproducible_json_table_sentences_plot(result):
    again = run_induction(seed=0, steps=result.steps)
    assert json.dumps(again.to_dict(), allow_nan=False) == json.dumps(result.to_dict(), allow_nan=False)
    document = again.to_dict()
    assert document["experiment"] == "induction" and len(document["scores"]) == len(document["history"]["steps"])
    headers, rows = result.table()
    assert headers == ["claim", "value"] and len(rows) == 9
    text = " ".join(result.sentences())
    assert "layer 0" in text and "layer 1" in text
    assert plot_induction(result).startswith(b"\x89PNG")
