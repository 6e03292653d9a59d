"""Heads count: a run for each number of heads, with d_model fixed and with d_head fixed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from headlab.experiments import heads_count
from headlab.experiments.heads_count import (
    D_HEAD,
    D_MODEL,
    HEADS,
    SETTINGS,
    config_for,
    plot_heads_count,
    run_heads_count,
)
from headlab.experiments.seeds import Spread
from headlab.layer.accounting import account


@pytest.fixture(scope="module")
def result():
    return run_heads_count(seed=0, steps=3)


def test_configs():
    for h in HEADS:
        fixed_width = config_for("d_model", h)
        assert (fixed_width.d_model, fixed_width.n_heads, fixed_width.d_head) == (D_MODEL, h, D_MODEL // h)
        fixed_head = config_for("d_head", h)
        assert (fixed_head.d_model, fixed_head.n_heads, fixed_head.d_head) == (D_MODEL, h, D_HEAD)
    with pytest.raises(ValueError, match="unknown setting 'd_ff'"):
        config_for("d_ff", 2)


def test_a_row_per_setting_and_number_of_heads(result):
    assert [(r.setting, r.n_heads) for r in result.rows] == [(s, h) for s in SETTINGS for h in HEADS]
    for r in result.rows:
        config = config_for(r.setting, r.n_heads)
        assert r.d_head == config.d_head and r.parameters == account(config).total_parameters
        assert len(r.accuracy.values) == 3 and len(r.steps_to_90) == 3
    # Fixed d_model: the heads split one budget; fixed d_head: the layer grows with the heads.
    assert len({result.row("d_model", h).parameters for h in HEADS}) == 1
    grown = [result.row("d_head", h).parameters for h in HEADS]
    assert grown == sorted(grown) and grown[0] < grown[-1]
    assert len(result.runs) == len(SETTINGS) * len(HEADS) * 3
    assert set(result.best_heads) == set(SETTINGS) and all(h in HEADS for h in result.best_heads.values())


def test_json_table_sentences_plot(result):
    document = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert document["experiment"] == "heads-count" and len(document["rows"]) == 10
    headers, rows = result.table()
    assert headers[:3] == ["fixed", "heads", "d_head"] and len(rows) == 10
    text = " ".join(result.sentences())
    assert f"d_model = {D_MODEL}" in text and f"d_head = {D_HEAD}" in text
    assert plot_heads_count(result).startswith(b"\x89PNG")


def _figure(result, monkeypatch):
    drawn = []
    monkeypatch.setattr(heads_count, "png", lambda fig: drawn.append(fig) or b"")
    plot_heads_count(result)
    return drawn[0].axes[:2]  # accuracy, speed


def test_accuracy_bars_stay_within_what_accuracy_can_take(result, monkeypatch):
    rows = [replace(r, accuracy=Spread.of([1.0, 1.0, 0.7])) for r in result.rows]  # mean + std > 1
    accuracy, _ = _figure(replace(result, rows=rows), monkeypatch)
    tops = [y for bars in accuracy.collections for segment in bars.get_segments() for _, y in segment]
    assert tops and max(tops) == 1.0 and min(tops) == pytest.approx(0.7)


def test_the_speed_panel_says_when_no_seed_reached_90(result, monkeypatch):
    assert all(s is None for r in result.rows for s in r.steps_to_90)  # 3 steps: none got there
    _, speed = _figure(result, monkeypatch)
    assert "missing" not in speed.get_title() and "step reaching 90%" in speed.get_title()
    assert any("no seed reached 90% accuracy" in t.get_text() for t in speed.texts)
    some = [replace(r, steps_to_90=[60, None, 80]) if r.n_heads == 4 else r for r in result.rows]
    _, speed = _figure(replace(result, rows=some), monkeypatch)
    notes = " ".join(t.get_text() for t in speed.texts)
    assert "fixed d_model: 1, 2, 8, 16\nfixed d_head: 1, 2, 8, 16" in notes
