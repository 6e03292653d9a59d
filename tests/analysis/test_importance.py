"""Head importance (Michel et al. 2019): gradient vs finite differences, ablation, Spearman, pruning curves."""

import numpy as np
import pytest
import torch

import headlab
from headlab.analysis.importance import (
    ImportanceResult,
    ablation_importance,
    causal_lm_loss,
    embed,
    fidelity_metric,
    gradient_importance,
    lm_batches,
    pair_batches,
    paraphrase_loss,
    plot_pruning_curve,
    pruning_curve,
    retrieval_metric,
    spearman,
)
from headlab.heads import HeadTable, mask, restore, scale, summary
from headlab.models import Tap, headed
from tests.support.minilm import minilm
from tests.support.tiny import batch as random_batch
from tests.support.tiny import build

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny():
    """A random 2-layer, 4-head BERT in float64, headlab's attention attached."""
    return headlab.attach(build("bert").double()).model


def batches(n: int = 2):
    return [random_batch(padding="right", seed=s) for s in range(n)]


def readout_loss(net, batch):
    ids, attention = batch
    hidden = net(input_ids=ids, attention_mask=attention).last_hidden_state  # (batch, pos, d_model)
    w = torch.linspace(-1, 1, hidden.shape[-1], dtype=hidden.dtype)
    return ((hidden @ w) ** 2 * attention).sum() / attention.sum()


def loss_at(net, gates, batch):
    for site, gate in zip(headed(net).sites, gates):
        site.head_mask = gate
    try:
        with torch.no_grad():
            return float(readout_loss(net, batch))
    finally:
        for site in headed(net).sites:
            site.head_mask = None


def test_gradient_equals_finite_differences(tiny):
    result = gradient_importance(tiny, batches(), readout_loss, normalize=False)
    eps, expected = 1e-6, []
    for layer in range(2):
        for h in range(4):
            total = 0.0
            for b in batches():
                plus = [torch.ones(4, dtype=torch.float64) for _ in range(2)]
                minus = [torch.ones(4, dtype=torch.float64) for _ in range(2)]
                plus[layer][h] += eps
                minus[layer][h] -= eps
                total += abs((loss_at(tiny, plus, b) - loss_at(tiny, minus, b)) / (2 * eps))
            expected.append(total)
    assert result.table.heads == [(layer, h) for layer in range(2) for h in range(4)]
    np.testing.assert_allclose(result.table["raw"], expected, rtol=1e-6)
    np.testing.assert_array_equal(result.table["score"], result.table["raw"])  # normalize=False
    assert result.table.value("raw", 1, 2) == pytest.approx(expected[4 + 2], rel=1e-6)
    assert all(site.head_mask is None for site in headed(tiny).sites)
    assert all(p.grad is None for p in tiny.parameters())


def test_gradient_is_the_sum_of_head_contributions_on_a_linear_readout(tiny):
    """A loss linear in one layer's output is linear in its gates: d loss/d gate_h = ⟨w, head h's
    contribution⟩, which is also exactly minus the change when h is ablated."""
    last = headed(tiny).sites[-1]
    ids, attention = random_batch(padding="none")
    w = torch.linspace(-1, 1, 32, dtype=torch.float64)
    taken = {}
    hook = last.out_proj.module.register_forward_hook(lambda module, args, out: taken.__setitem__("out", out))

    def readout(net, batch):  # ⟨w, the last attention layer's output projection⟩; earlier layers' inputs fixed
        net(input_ids=ids, attention_mask=attention)
        return (taken["out"] @ w).sum()

    try:
        result = gradient_importance(tiny, [None], readout, normalize=False)
        ablation = ablation_importance(tiny, [None], readout)
    finally:
        hook.remove()
    last.tap = Tap(sink=lambda layer, out: taken.__setitem__("results", out.result), result=[0, 1, 2, 3])
    try:
        with torch.no_grad():
            tiny(input_ids=ids, attention_mask=attention)
    finally:
        last.tap = None
    contributions = (taken["results"] @ w).sum(dim=(0, 2))  # (head,)
    last_layer = [result.table.value("raw", 1, h) for h in range(4)]
    np.testing.assert_allclose(last_layer, contributions.abs().detach().numpy(), rtol=1e-10)
    assert all(result.table.value("raw", 0, h) > 0 for h in range(4))  # through the second layer's input
    ablated = [ablation.table.value("raw", 1, h) for h in range(4)]
    np.testing.assert_allclose(ablated, -contributions.detach().numpy(), rtol=1e-9, atol=1e-12)


def test_ablation_of_a_masked_head_is_zero_and_matches_masking(tiny):
    mask(tiny, [(0, 1)])
    try:
        result = ablation_importance(tiny, batches(1), readout_loss)
        scores = result.table
        assert scores.value("raw", 0, 1) == 0.0
        assert np.abs(scores["raw"]).sum() > 0
        with torch.no_grad():
            base = float(readout_loss(tiny, batches(1)[0]))
            mask(tiny, [(1, 2)])
            masked = float(readout_loss(tiny, batches(1)[0]))
        assert scores.value("raw", 1, 2) == pytest.approx(masked - base, rel=1e-9, abs=1e-12)
    finally:
        restore(tiny)
    assert all(site.head_mask is None for site in headed(tiny).sites)


def test_spearman_known_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)  # scipy.stats.spearmanr
    # ranks (4, 1.5, 1.5, 3, 5) and (2, 1, 3.5, 3.5, 5): Pearson of the ranks = 5.25 / 9.5
    assert spearman([3, 1, 1, 2, 5], [2, 1, 3, 3, 4]) == pytest.approx(5.25 / 9.5, rel=1e-12)
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="equally long"):
        spearman([1, 2], [1, 2, 3])


def test_pruning_curve_starts_unpruned_and_restores(tiny):
    scale(tiny, [(1, 0)], 0.5)  # an intervention that must survive the curve
    try:
        before = summary(tiny)

        def metric(net):
            return readout_loss(net, batches(1)[0]).detach().item()

        unpruned = metric(tiny)
        order = [(layer, h) for layer in (1, 0) for h in range(4)]
        curve = pruning_curve(tiny, order, metric)
        assert curve.fractions[0] == 0 and curve.values[0] == unpruned
        assert curve.fractions[-1] == 1.0 and curve.removed == sorted(set(curve.removed))
        assert summary(tiny) == before and metric(tiny) == unpruned
        mask(tiny, order)
        assert curve.values[-1] == pytest.approx(metric(tiny))
    finally:
        restore(tiny)
    result = ImportanceResult(table=HeadTable(order, {"score": np.arange(8.0)[::-1], "raw": np.zeros(8)}),
                              method="x", normalized=False, batches=1, seconds=0.0)
    assert result.order() == order[::-1]
    tied = ImportanceResult(table=HeadTable(order, {"score": [1.0, 0.0] * 4, "raw": np.zeros(8)}), method="x",
                            normalized=False, batches=1, seconds=0.0)
    assert tied.order() == order[1::2] + order[0::2]  # ties keep table order
    assert tied.to_dict()["rows"][1] == {"layer": 1, "head": 1, "score": 0.0, "raw": 0.0}
    assert len(pruning_curve(tiny, result, metric, step=0.5).values) == 3


def test_plot_pruning_curve(tmp_path, tiny):
    curve = pruning_curve(tiny, [(0, 0), (1, 1)], lambda net: 1.0, step=0.25)
    assert curve.removed == [0, 2]
    assert plot_pruning_curve({"gradient": curve}, tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert curve.to_dict()["values"] == [1.0, 1.0]


def test_causal_lm_loss_gradient_importance():
    model = headlab.attach(build("gpt2")).model
    ids, attention = random_batch(padding="right")
    result = gradient_importance(model, [{"input_ids": ids, "attention_mask": attention}], causal_lm_loss)
    assert len(result.table) == 8 and np.all(result.table["score"] >= 0)
    for layer in range(2):
        score = [result.table.value("score", layer, h) for h in range(4)]
        raw = [result.table.value("raw", layer, h) for h in range(4)]
        assert np.linalg.norm(score) == pytest.approx(1.0)
        np.testing.assert_allclose(score, np.array(raw) / np.linalg.norm(raw), rtol=1e-12)


def test_minilm_pairs_task():
    from headlab.data.pairs import load_pairs

    loaded = minilm()
    pairs = load_pairs()[:9]  # three of each label, interleaved
    vectors = embed(loaded, loaded.tokenizer, [p.sentence_a for p in pairs])
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(len(pairs)), atol=1e-5)
    assert retrieval_metric(loaded.tokenizer, pairs)(loaded) == 1.0
    fidelity = fidelity_metric(loaded, loaded.tokenizer, [p.sentence_a for p in pairs[:4]])
    assert fidelity(loaded) == pytest.approx(1.0, abs=1e-5)
    paraphrases = [p for p in pairs if p.label == "paraphrase"]
    result = gradient_importance(loaded, pair_batches(loaded.tokenizer, paraphrases), paraphrase_loss)
    assert len(result.table) == 72 and np.all(np.isfinite(result.table["score"]))
    texts = [p.sentence_a for p in pairs[:2]]
    assert lm_batches(loaded.tokenizer, texts)[0]["input_ids"].shape[0] == 2
