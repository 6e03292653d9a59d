"""Variants: every variant trains; parameters and FLOPs are headlab.layer.accounting's; budgets as stated."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from headlab.experiments.model import build_model
from headlab.experiments.tasks import MixTask
from headlab.experiments.train import train_config
from headlab.experiments.variants import (
    BUDGETS,
    D_MODEL,
    N_HEADS,
    NAMES,
    WIDTHS,
    config_for,
    plot_variants,
    run_variants,
    variant_at,
)
from headlab.layer.accounting import account


@pytest.fixture(scope="module")
def result():
    return run_variants(seed=0, steps=4, quick=True)


@pytest.mark.parametrize("name", NAMES)
def test_every_variant_trains(name):
    task = MixTask()
    run = train_config(task, config_for(name, "d_model"), label=name, seed=0, steps=40, lr=1e-2, eval_every=40)
    assert run.history.final_loss < run.history.loss[0] - 0.05


def test_budgets():
    target = account(variant_at("wide", d_model=D_MODEL)).total_parameters
    for name in NAMES:
        fixed = config_for(name, "d_model")
        assert fixed == variant_at(name, d_model=D_MODEL)
        assert fixed.d_model == D_MODEL and fixed.n_heads == (1 if name == "single-head" else N_HEADS)
        gap = abs(account(config_for(name, "parameters")).total_parameters - target)
        assert gap == min(abs(account(variant_at(name, d_model=d)).total_parameters - target) for d in WIDTHS)
    assert config_for("shared", "parameters").d_model > D_MODEL > config_for("bilinear", "parameters").d_model
    with pytest.raises(ValueError, match="unknown variant 'tiny'"):
        config_for("tiny", "d_model")
    with pytest.raises(ValueError, match="unknown budget 'flops'"):
        config_for("wide", "flops")


def test_counts_are_the_accounting_of_the_trained_layer(result):
    assert {(s.budget, s.variant) for s in result.summaries} == {(b, n) for b in BUDGETS for n in NAMES}
    for s in result.summaries:
        config = config_for(s.variant, s.budget)
        layer = build_model(MixTask(), [config], seed=0).attention[0]
        assert s.parameters == account(config).total_parameters == sum(p.numel() for p in layer.parameters())
        assert s.flops == account(config, seq_len=MixTask().seq_len).total_flops
        assert len(s.accuracy.values) == 3 and 0 <= s.accuracy.mean <= 1 and len(s.steps_to_90) == 3
    assert result.target_parameters == account(config_for("wide", "d_model")).total_parameters
    unique = {config_for(n, b) for b in BUDGETS for n in NAMES}
    assert len(result.runs) == 3 * len(unique) < 3 * len(BUDGETS) * len(NAMES)  # shared configs train once
    assert sorted(result.ranking) == ["mix/d_model", "mix/parameters"]
    assert sorted(result.ranking["mix/d_model"]) == sorted(NAMES)


def test_json_table_sentences_plot(result):
    document = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert document["experiment"] == "variants" and document["seeds"] == [0, 1, 2]
    assert document["summaries"][0]["accuracy"].keys() == {"mean", "std", "values"}
    headers, rows = result.table()
    assert len(rows) == len(result.summaries) and len(headers) == len(rows[0])
    assert any("single-head" in s for s in result.sentences())
    assert plot_variants(result).startswith(b"\x89PNG")


def _reaching(result, steps_by_variant):
    """The result with these variants reaching 90% with every seed at these steps, and no other variant."""
    summaries = [replace(s, steps_to_90=[steps_by_variant.get(s.variant)] * 3,
                         mean_steps_to_90=steps_by_variant.get(s.variant)) for s in result.summaries]
    return replace(result, summaries=summaries)


def test_the_speed_sentence_is_right_whatever_the_number_of_variants_reaching_90(result):
    one = _reaching(result, {"wide": 120}).sentences()[0]
    assert "only wide reached 90% with every seed (step 120 on average)" in one
    assert "first" not in one and "last" not in one
    none = _reaching(result, {}).sentences()[0]
    assert "no variant reached 90% with every seed" in none and "first" not in none
    tied = _reaching(result, {"wide": 120, "narrow": 120}).sentences()[0]
    assert "wide and narrow reached 90% with every seed, all at step 120 on average" in tied
    several = _reaching(result, {"wide": 100, "narrow": 140, "shared": 100}).sentences()[0]
    assert ("of the 3 reaching 90% with every seed, wide and shared got there first (step 100 on average) and "
            "narrow last (140)") in several
