"""Induction: a previous-token head in layer 0 and an induction head in layer 1, found by headlab's detectors,
timed by one rule over seeds, their order said only beyond the seeds' noise."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from headlab.analysis.roles import INDUCTION, PREVIOUS_TOKEN, previous_token_score
from headlab.experiments.induction import FRACTION, change_step, head_scores, plot_induction, run_induction
from headlab.experiments.model import build_model
from headlab.experiments.seeds import Gap
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
    assert result.final_accuracy > 0.9
    assert result.previous_token_heads and all(layer == 0 for layer, _ in result.previous_token_heads)
    assert result.induction_heads and all(layer == 1 for layer, _ in result.induction_heads)
    assert result.best_previous_token["score"] > PREVIOUS_TOKEN and result.best_induction["score"] > INDUCTION
    assert result.scores[0]["induction"][1][0] < INDUCTION  # not there at initialisation


def test_change_step_is_one_rule_for_rising_and_falling_curves():
    steps = [0, 10, 20, 30]
    assert change_step(steps, [0.1, 0.2, 0.6, 0.9]) == 20  # 0.6 covers 62% of the rise 0.1 → 0.9
    assert change_step(steps, [4.0, 3.5, 2.0, 0.0]) == 20  # 2.0 covers half of the drop 4 → 0
    assert change_step(steps, [0.2, 0.3, 0.2, 0.2]) is None  # ends where it started
    with pytest.raises(ValueError, match="fraction=0 must be in"):
        change_step(steps, [0.0, 1.0, 1.0, 1.0], fraction=0)


def test_every_seed_is_timed_by_the_same_rule(result):
    assert result.seeds == [0, 1, 2] and [run.seed for run in result.runs] == result.seeds
    assert result.runs[0].loss == result.history.loss
    assert result.runs[0].induction == [max(s["induction"][1]) for s in result.scores]
    for run in result.runs:
        for curve in ("previous_token", "induction", "loss"):
            assert run.emergence[curve] == change_step(run.steps, getattr(run, curve), fraction=FRACTION) is not None
    for name, (a, b) in {"induction_after_previous_token": ("previous_token", "induction"),
                         "loss_after_induction": ("induction", "loss")}.items():
        gap = getattr(result, name)
        assert gap == Gap.of(result.emergence(a), result.emergence(b), resolution=result.eval_every)
    text = " ".join(result.sentences())
    steps = ", ".join(str(s) for s in result.emergence("induction"))
    assert f"the best layer-1 induction score at {steps}" in text


def _with_steps(result, previous, induction, loss):
    runs = [replace(run, emergence={"previous_token": p, "induction": i, "loss": ls})
            for run, p, i, ls in zip(result.runs, previous, induction, loss)]
    return replace(result, runs=runs,
                   induction_after_previous_token=Gap.of(previous, induction, resolution=result.eval_every),
                   loss_after_induction=Gap.of(induction, loss, resolution=result.eval_every))


def test_which_head_came_first_is_said_only_beyond_the_seeds_noise(result):
    # Timed by two different thresholds, one seed once read "previous-token at step 90, induction at 70".
    within = " ".join(_with_steps(result, [90, 80, 110], [70, 90, 100], [70, 90, 100]).sentences())
    assert "formed together, within the noise" in within and "formed first" not in within
    assert "The loss on the repeated half dropped as the induction head rose" in within
    ahead = " ".join(_with_steps(result, [60, 70, 65], [100, 110, 105], [140, 150, 145]).sentences())
    assert "The previous-token head formed first, beyond the noise" in ahead and "+40 ± 0 steps" in ahead
    assert "dropped after the induction head rose, beyond the noise" in ahead
    missing = " ".join(_with_steps(result, [60, None, 65], [100, 110, 105], [100, 110, 105]).sentences())
    assert "cannot be told: not every seed formed both" in missing and "at steps 60, never, 65" in missing


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
    short = run_induction(seed=0, steps=20)  # the same seed twice, the same numbers: a short run shows it
    again = run_induction(seed=0, steps=20)
    assert json.dumps(again.to_dict(), allow_nan=False) == json.dumps(short.to_dict(), allow_nan=False)
    document = result.to_dict()
    assert document["experiment"] == "induction" and len(document["scores"]) == len(document["history"]["steps"])
    headers, rows = result.table()
    assert headers == ["claim", "value"] and len(rows) == 11
    text = " ".join(result.sentences())
    assert "layer 0" in text and "layer 1" in text
    assert document["runs"][1]["emergence"] == result.runs[1].emergence
    assert document["loss_after_induction"]["gaps"] == list(result.loss_after_induction.gaps)
    assert plot_induction(result).startswith(b"\x89PNG")
