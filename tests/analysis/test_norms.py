"""ValueWeighted (Kobayashi et al. 2020) against an explicit float64 loop, on hand-built batches and a tiny model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headlab.analysis.norms import COLUMNS, ValueWeighted, compact_projections, value_norms, weighted_pattern
from headlab.capture import CaptureBatch, capture
from tests.support.analysis import hand_batch, w_o


def reference(batches: list[CaptureBatch], W_O: dict[int, torch.Tensor]) -> dict[tuple[int, int], dict[str, float]]:
    """Every column of ``ValueWeighted.result`` by explicit loops in float64."""
    acc: dict[tuple[int, int], dict[str, list[float]]] = {}
    for batch in batches:
        for layer, taken in batch.layers.items():
            for hi, head in enumerate(taken.heads):
                out = acc.setdefault((layer, head), {k: [] for k in ("rf", "rs", "wf", "ws", "nf", "ns", "no")})
                w = W_O[layer][head].double()
                for row in range(len(batch)):
                    n = int(batch.lengths[row])
                    special = [bool(batch.special_tokens_mask[row, j]) for j in range(n)]
                    norms = [float(torch.linalg.vector_norm(taken.v[row, hi, j].double() @ w)) for j in range(n)]
                    for j in range(n):
                        out["nf" if j == 0 else "ns" if special[j] else "no"].append(norms[j])
                    for i in range(n):
                        alpha = [float(taken.pattern[row, hi, i, j]) for j in range(n)]
                        weighted = [a * nj for a, nj in zip(alpha, norms)]
                        total = sum(weighted)
                        out["rf"].append(alpha[0])
                        out["rs"].append(sum(alpha[j] for j in range(1, n) if special[j]))
                        if total > 0:
                            out["wf"].append(weighted[0] / total)
                            out["ws"].append(sum(weighted[j] for j in range(1, n) if special[j]) / total)
    result = {}
    for key, out in acc.items():
        mean = {k: float(np.mean(v)) if v else math.nan for k, v in out.items()}
        result[key] = {"raw_first": mean["rf"], "raw_special": mean["rs"], "weighted_first": mean["wf"],
                       "weighted_special": mean["ws"], "raw_sink": mean["rf"] + mean["rs"],
                       "weighted_sink": mean["wf"] + mean["ws"], "norm_first": mean["nf"],
                       "norm_special": mean["ns"], "norm_other": mean["no"], "n_queries": len(out["rf"])}
    return result


def _check(table, expected) -> None:
    assert sorted(table.heads) == table.heads == sorted(expected)
    for key, columns in expected.items():
        for name, value in columns.items():
            got = table.value(name, *key)
            assert (math.isnan(got) and math.isnan(value)) or got == pytest.approx(value, rel=1e-5, abs=1e-6), (
                key, name)


def test_hand_built_batches_equal_the_loop_and_halves_merge_into_the_whole():
    heads = {0: (0, 1, 2), 2: (1, 3)}
    W_O = w_o({0: 3, 2: 4})
    batches = [hand_batch([5, 3, 4], heads=heads, seed=0), hand_batch([6, 6], heads=heads, seed=1),
               hand_batch([2], heads=heads, seed=2, special_last=False)]
    whole = ValueWeighted(W_O)
    for b in batches:
        whole.update(b)
    _check(whole.result(), reference(batches, W_O))
    first, second = ValueWeighted(W_O), ValueWeighted(W_O)
    first.update(batches[0])
    for b in batches[1:]:
        second.update(b)
    merged = first.merge(second).result()
    for name in whole.result().columns:
        np.testing.assert_allclose(merged[name], whole.result()[name], rtol=1e-12, equal_nan=True)
    assert list(merged.columns) == ["n_queries", *COLUMNS]


def test_a_short_first_value_moves_weight_off_the_first_token():
    # one head, one item: α = 0.8 on [CLS], whose f(x) is 1/100 of the others' → weighted share ≈ 0.8·0.01 / (…)
    batch = hand_batch([3], heads={0: (0,)}, special_last=False)
    batch.layers[0].pattern = torch.tensor([[[[0.8, 0.1, 0.1]] * 3]])
    batch.layers[0].v = torch.tensor([[[[0.01, 0, 0], [1.0, 0, 0], [1.0, 0, 0]]]])
    acc = ValueWeighted({0: torch.eye(3)[None].expand(1, 3, 3)})
    acc.update(batch)
    table = acc.result()
    assert table.value("raw_first", 0, 0) == pytest.approx(0.8)
    assert table.value("weighted_first", 0, 0) == pytest.approx(0.008 / 0.208)
    assert table.value("norm_first", 0, 0) == pytest.approx(0.01)
    assert table.value("norm_other", 0, 0) == pytest.approx(1)


def test_norms_and_weighted_pattern_match_their_definitions():
    g = torch.Generator().manual_seed(3)
    v, w = torch.randn(2, 3, 4, 5, generator=g), torch.randn(3, 5, 7, generator=g, dtype=torch.float64)
    norms = value_norms(v, w)
    assert norms.dtype == torch.float64  # v's float32 widened to W_O's dtype
    np.testing.assert_allclose(norms, torch.linalg.vector_norm(torch.einsum("bhkd,hdm->bhkm", v.double(), w), dim=-1),
                               rtol=1e-10)
    np.testing.assert_allclose(value_norms(v, w.float()), norms, rtol=1e-5)  # float32 throughout
    pattern = torch.softmax(torch.randn(2, 3, 4, 4, generator=g), -1)
    weighted = weighted_pattern(pattern, norms)
    np.testing.assert_allclose(weighted.sum(-1), 1.0, rtol=1e-12)
    assert float(weighted[0, 1, 2, 3]) == pytest.approx(float(pattern[0, 1, 2, 3] * norms[0, 1, 3]
                                                              / (pattern[0, 1, 2] * norms[0, 1]).sum()))
    assert (weighted_pattern(pattern, torch.zeros(2, 3, 4, dtype=torch.float64)) == 0).all()


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_tiny_model_equals_the_loop_and_v_through_W_O_gives_the_heads_result(kind):
    from tests.support.tiny import tiny

    model = tiny(kind)
    texts = ["the cat sat on the mat", "a big red dog ran on the mat and the cat sat", "the dog"]
    kept: list[CaptureBatch] = []

    class Keep:
        def update(self, batch):
            kept.append(batch)

    acc = ValueWeighted.from_model(model)
    capture(model, corpus=texts, take=("pattern", "v", "result"), consumers=[acc, Keep()], progress=False)
    W_O = acc_w(model)
    _check(acc.result(), reference(kept, W_O))
    for batch in kept:  # f_h(x_j) is what the head adds: Σ_j α_ij v_j W_O[h] is its captured result
        for layer, taken in batch.layers.items():
            real = batch.attention_mask.bool()
            mixed = torch.einsum("bhqk,bhkd,hdm->bhqm", taken.pattern.double(), taken.v.double(), W_O[layer])
            np.testing.assert_allclose(mixed.transpose(1, 2)[real], taken.result.double().transpose(1, 2)[real],
                                       atol=1e-4)


def acc_w(model) -> dict[int, torch.Tensor]:
    from headlab.analysis.norms import out_projections

    return out_projections(model)


def test_compact_projections_give_every_norm_w_o_gives():
    """The stand-in shipped to Ray workers: d_head wide, the same ‖v W_O[h]‖ for any v, and a W_O no wider
    than its heads kept as it is."""
    torch.manual_seed(0)
    W_O = {0: torch.randn(3, 4, 16), 2: torch.randn(3, 4, 16, dtype=torch.float64)}
    compact = compact_projections(W_O)
    v = torch.randn(5, 3, 4, dtype=torch.float64)  # (tokens, head, d_head)
    for layer, w in W_O.items():
        assert compact[layer].shape == (3, 4, 4) and compact[layer].dtype == torch.float64
        full = torch.einsum("thd,hdm->thm", v, w.double()).norm(dim=-1)
        small = torch.einsum("thd,hdm->thm", v, compact[layer]).norm(dim=-1)
        torch.testing.assert_close(small, full, rtol=1e-12, atol=1e-12)
    narrow = {1: torch.randn(2, 8, 8, dtype=torch.float64)}
    assert torch.equal(compact_projections(narrow)[1], narrow[1])


def test_bad_input_is_named():
    batch = hand_batch([3], heads={0: (0,)})
    batch.layers[0].v = None
    with pytest.raises(ValueError, match=r"layer 0 was captured without v; capture with take=\('pattern', 'v'\)"):
        ValueWeighted({0: torch.ones(1, 3, 5)}).update(batch)
    with pytest.raises(ValueError, match="layer 0 has no W_O here"):
        ValueWeighted({1: torch.ones(1, 3, 5)}).update(hand_batch([3], heads={0: (0,)}))
    with pytest.raises(ValueError, match=r"W_O of layer 0 has shape \(3, 5\); expected \(n_heads, d_head_v, d_model\)"):
        ValueWeighted({0: torch.ones(3, 5)})
    with pytest.raises(ValueError, match="ValueWeighted has no data"):
        ValueWeighted({0: torch.ones(1, 3, 5)}).result()
