"""Activation and attribution patching: exact where the metric is linear in z, AtP agreeing in sign
and rank on a planted head, the model put back after both, clear refusals."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import headlab
from headlab.analysis.importance import spearman
from headlab.analysis.patching import activation_patching, attribution_patching, logit_difference, plot_patching
from headlab.models import headed
from tests.support.tiny import build, first_output


def _pair(length: int = 7, changed: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Clean and corrupted ids: the same but for ``changed`` random positions."""
    generator = torch.Generator().manual_seed(3)
    clean = torch.randint(3, 100, (2, length), generator=generator)
    corrupted = clean.clone()
    positions = torch.randperm(length, generator=generator)[:changed]
    corrupted[:, positions] = torch.randint(3, 100, (2, changed), generator=generator)
    return clean, corrupted


def test_attribution_equals_exact_patching_when_the_metric_is_linear_in_z():
    """⟨w, the last layer's output projection⟩ is linear in that layer's z: the first-order
    estimate is then exact, head by head (float64)."""
    model = headlab.attach(build("llama").double()).model
    last = headed(model).sites[-1]
    taken = {}
    hook = last.out_proj.module.register_forward_hook(lambda m, a, out: taken.__setitem__("out", out))
    w = torch.linspace(-1, 1, taken.setdefault("width", last.out_proj.module.out_features), dtype=torch.float64)

    def metric(output):
        return (taken["out"] @ w).sum()

    clean, corrupted = _pair()
    try:
        exact = activation_patching(model, clean, corrupted, metric, heads={last.layer: None})
        atp = attribution_patching(model, clean, corrupted, metric, heads={last.layer: None})
    finally:
        hook.remove()
    np.testing.assert_allclose(atp.table["change"], exact.table["change"], rtol=1e-9, atol=1e-12)
    assert exact.table.heads == atp.table.heads == [(last.layer, h) for h in range(last.n_heads)]
    assert (exact.forwards, exact.backwards, atp.forwards, atp.backwards) == (2 + last.n_heads, 0, 2, 1)
    assert exact.clean_metric == pytest.approx(atp.clean_metric, rel=1e-12)


@pytest.fixture(scope="module")
def planted():
    """A tiny causal model in which one head (layer 1, head 2) carries the logit difference: every
    other head's output projection is scaled down 100×."""
    model = build("gpt2", n_layer=2).double()
    headlab.attach(model)
    with torch.no_grad():
        for site in headed(model).sites:
            for h in range(site.n_heads):
                if (site.layer, h) != (1, 2):
                    site.W_O[h].mul_(0.01)
    return model


def test_attribution_agrees_with_exact_patching_on_a_planted_head(planted):
    clean, corrupted = _pair()
    metric = logit_difference(5, 7)
    exact = activation_patching(planted, clean, corrupted, metric)
    atp = attribution_patching(planted, clean, corrupted, metric)
    magnitude = {name: np.abs(r.table["change"]) for name, r in (("exact", exact), ("atp", atp))}
    planted_row = exact.table.index(1, 2)
    assert int(np.argmax(magnitude["exact"])) == int(np.argmax(magnitude["atp"])) == planted_row
    assert np.sign(exact.table.value("change", 1, 2)) == np.sign(atp.table.value("change", 1, 2)) != 0
    assert spearman(magnitude["exact"], magnitude["atp"]) > 0.8


def test_the_model_is_put_back_after_patching(planted):
    clean, corrupted = _pair()
    with torch.no_grad():
        before = first_output(planted(input_ids=corrupted))
    state = copy.deepcopy(planted.state_dict())
    activation_patching(planted, clean, corrupted, logit_difference(5, 7), heads={1: [2]})
    attribution_patching(planted, clean, corrupted, logit_difference(5, 7))
    assert all(site.idle for site in headed(planted).sites)
    assert all(torch.equal(v, state[k]) for k, v in planted.state_dict().items())
    with torch.no_grad():
        torch.testing.assert_close(first_output(planted(input_ids=corrupted)), before, atol=0, rtol=0)


def test_refusals(planted, tmp_path):
    clean, corrupted = _pair()
    with pytest.raises(ValueError, match="score the same"):
        activation_patching(planted, clean, clean, logit_difference(5, 7))
    with pytest.raises(ValueError, match=r"same shape to patch between them: clean \(2, 7\), corrupted \(2, 5\)"):
        attribution_patching(planted, clean, corrupted[:, :5], logit_difference(5, 7))
    with pytest.raises(ValueError, match="does not depend on the model's heads"):
        attribution_patching(planted, clean, corrupted, lambda output: torch.tensor(1.0))
    result = attribution_patching(planted, clean, corrupted, logit_difference(5, 7), heads={0: [1]})
    assert result.to_dict()["heads"]["rows"] == [{"layer": 0, "head": 1, **{
        k: result.table.value(k, 0, 1) for k in ("effect", "change")}}]
    assert plot_patching([result], tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_attribution_ranks_minilm_heads_as_exact_patching_does():
    """On the real model, AtP finds the same most important head and ranks the heads alike."""
    from headlab.analysis.patching import text_metric
    from tests.support.minilm import minilm

    loaded = minilm()
    clean, corrupted = "The cat sat on the mat.", "The dog sat on the mat."
    metric, _ = text_metric(loaded, clean)
    exact = activation_patching(loaded, clean, corrupted, metric)
    atp = attribution_patching(loaded, clean, corrupted, metric)
    assert exact.clean_metric == pytest.approx(1.0) and exact.corrupted_metric < 0.95
    assert exact.table.top("effect", 1, absolute=True) == atp.table.top("effect", 1, absolute=True)
    assert spearman(exact.table["effect"], atp.table["effect"]) > 0.7
