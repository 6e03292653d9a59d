"""Head similarity (Jensen–Shannon distances), MDS, and the plot."""

import math

import numpy as np
import pytest
import torch

from headlab.analysis.similarity import MAX_JS_DISTANCE, HeadSimilarity, js_distance, mds, plot_mds
from headlab.capture.batch import CaptureBatch, LayerCapture
from headlab.heads import Heads
from tests.support.minilm import minilm


def js_reference(p, q) -> float:
    """sqrt(½ KL(p‖m) + ½ KL(q‖m)) by a plain loop, natural log."""
    m = [(a + b) / 2 for a, b in zip(p, q)]

    def kl(x):
        return sum(a * math.log(a / c) for a, c in zip(x, m) if a > 0)

    return math.sqrt(max(0.5 * kl(p) + 0.5 * kl(q), 0.0))


def test_js_identical_disjoint_and_reference():
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert float(js_distance(p, p)) == pytest.approx(0.0, abs=1e-7)
    a, b = torch.tensor([0.5, 0.5, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.25, 0.75])
    assert float(js_distance(a.double(), b.double())) == pytest.approx(MAX_JS_DISTANCE, rel=1e-12)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        x = torch.rand(6, generator=generator, dtype=torch.float64) ** 3
        y = torch.rand(6, generator=generator, dtype=torch.float64) ** 3
        x[0] = 0.0
        x, y = x / x.sum(), y / y.sum()
        assert float(js_distance(x, y)) == pytest.approx(js_reference(x.tolist(), y.tolist()), rel=1e-9, abs=1e-12)
        assert float(js_distance(x, y)) == pytest.approx(float(js_distance(y, x)), abs=1e-15)


def random_batch(seed: int, *, n_layers: int = 2, n_heads: int = 3, batch: int = 3, pos: int = 5) -> CaptureBatch:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, pos + 1, (batch,), generator=generator)
    lengths[0] = pos
    attention = (torch.arange(pos)[None] < lengths[:, None]).long()
    layers = {}
    for layer in range(n_layers):
        scores = torch.randn(batch, n_heads, pos, pos, generator=generator) * 2
        scores = scores.masked_fill(attention[:, None, None, :] == 0, float("-inf"))
        layers[layer] = LayerCapture(layer=layer, heads=tuple(range(n_heads)), pattern=scores.softmax(-1))
    zeros = torch.zeros(batch, pos, dtype=torch.long)
    return CaptureBatch(
        input_ids=zeros, attention_mask=attention, lengths=lengths, offsets=torch.zeros(batch, pos, 2),
        word_ids=zeros - 1, special_tokens_mask=zeros.bool(), corpus_indices=torch.arange(batch),
        truncated=torch.zeros(batch, dtype=torch.bool), texts=[""] * batch, tokens=[[]] * batch, layers=layers,
    )


def slow_matrix(batches) -> np.ndarray:
    """Mean over real query rows of the JS distance, pair by pair, row by row."""
    heads = [(layer, h) for layer, t in sorted(batches[0].layers.items()) for h in range(len(t.heads))]
    n = len(heads)
    sums, count = np.zeros((n, n)), 0
    for batch in batches:
        for item in range(len(batch)):
            for row in range(int(batch.lengths[item])):
                count += 1
                rows = [batch.layers[layer].pattern[item, h, row].double().tolist() for layer, h in heads]
                for i in range(n):
                    for j in range(n):
                        if i != j:
                            sums[i, j] += js_reference(rows[i], rows[j])
    return sums / count


def test_matrix_symmetric_merge_equals_whole():
    batches = [random_batch(seed) for seed in range(4)]
    whole, first, second = HeadSimilarity(), HeadSimilarity(), HeadSimilarity()
    for b in batches:
        whole.update(b)
    for b in batches[:2]:
        first.update(b)
    for b in batches[2:]:
        second.update(b)
    merged = first.merge(second).result()
    result = whole.result()
    assert result.heads == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert result.rows == sum(int(b.lengths.sum()) for b in batches)
    np.testing.assert_allclose(merged.distances, result.distances, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(result.distances, result.distances.T)
    assert np.all(np.diag(result.distances) == 0)
    assert np.all((result.distances >= 0) & (result.distances <= MAX_JS_DISTANCE + 1e-12))
    # float32 patterns are reduced in float32 (entropies ~1e-7-exact)
    np.testing.assert_allclose(result.distances, slow_matrix(batches), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk_elements", [None, 1, 250])
def test_float64_patterns_are_reduced_in_float64(chunk_elements, monkeypatch):
    """The pair loop gives the same distances however its chunks cut the pairs (one pair each; a few)."""
    if chunk_elements is not None:
        monkeypatch.setattr("headlab.analysis.similarity._CPU_CHUNK_ELEMENTS", chunk_elements)
    batches = [random_batch(seed) for seed in range(2)]
    for b in batches:
        for taken in b.layers.values():
            taken.pattern = taken.pattern.double()
    similarity = HeadSimilarity()
    for b in batches:
        similarity.update(b)
    np.testing.assert_allclose(similarity.result().distances, slow_matrix(batches), rtol=1e-9, atol=1e-12)


def test_heads_must_match():
    similarity = HeadSimilarity()
    similarity.update(random_batch(0))
    with pytest.raises(ValueError, match="differ"):
        similarity.update(random_batch(1, n_heads=2))


def test_minilm_patterns_match_slow_loop():
    from headlab.capture import capture

    loaded = minilm()
    texts = ["The cat sat on the mat.", "Heads attend to different things in a sentence, don't they?", "Hi."]
    kept = []

    class Keep:
        def update(self, batch):
            kept.append(batch)

    similarity = HeadSimilarity()
    capture(loaded, corpus=texts, heads=Heads(layers=[0, 5], heads=[0, 3, 7]), consumers=[similarity, Keep()],
            progress=False)
    result = similarity.result()
    assert len(result.heads) == 6
    np.testing.assert_allclose(result.distances, slow_matrix(kept), rtol=1e-4, atol=1e-6)


def test_mds_recovers_a_planar_configuration():
    rng = np.random.default_rng(3)
    points = rng.normal(size=(12, 2))
    distances = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    embedding = mds(distances, dim=2, seed=0)
    assert embedding.stress < 1e-4
    recovered = np.sqrt(((embedding.coords[:, None] - embedding.coords[None]) ** 2).sum(-1))
    np.testing.assert_allclose(recovered, distances, atol=1e-3)


def test_mds_smacof_improves_a_non_euclidean_start():
    rng = np.random.default_rng(1)
    points = rng.normal(size=(10, 3))
    distances = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))  # 3-D data squeezed into 2-D
    result = mds(distances, dim=2)
    assert 0 < result.stress < 0.5 and result.iterations > 1
    with pytest.raises(ValueError, match="symmetric"):
        mds(distances + np.triu(np.ones_like(distances)))


def test_plot_mds(tmp_path):
    similarity = HeadSimilarity()
    similarity.update(random_batch(0))
    path = plot_mds(similarity.result(), tmp_path / "mds.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_row_sample_is_reproducible_and_close_to_every_row():
    from headlab.capture import capture
    from tests.support.minilm import minilm

    texts = ["The cat sat on the mat, and the dog watched it from the door.",
             "Attention heads learn different things when their weights start apart."] * 3
    full, sampled, again = HeadSimilarity(), HeadSimilarity(row_fraction=0.15), HeadSimilarity(row_fraction=0.15)
    for acc in (full, sampled, again):
        capture(minilm(), corpus=texts, heads=Heads(layers=[0, 1]), consumers=[acc], progress=False)
    assert sampled.result().rows == full.result().rows == full.result().sampled  # every real row, stood for
    assert sampled.result().sampled < full.result().rows
    np.testing.assert_array_equal(sampled.result().distances, again.result().distances)
    error = np.abs(sampled.result().distances - full.result().distances)
    assert error.mean() < 0.03 and error.max() < 0.15  # ~16 rows: a sampling error, not a bias


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, True, "0.1"])
def test_row_fraction_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match=f"row_fraction={bad!r}"):
        HeadSimilarity(row_fraction=bad)


def _one_item_batch(length: int) -> CaptureBatch:
    """One item of ``length`` real tokens; head 0 attends to the first key only, head 1 to every key alike:
    every row has the same distance, which depends on the length."""
    first = torch.zeros(1, 1, length, length)
    first[..., 0] = 1.0
    uniform = torch.full((1, 1, length, length), 1.0 / length)
    ids = torch.zeros(1, length, dtype=torch.long)
    return CaptureBatch(
        input_ids=ids, attention_mask=ids + 1, lengths=torch.tensor([length]), offsets=torch.zeros(1, length, 2),
        word_ids=ids - 1, special_tokens_mask=ids.bool(), corpus_indices=torch.arange(1),
        truncated=torch.zeros(1, dtype=torch.bool), texts=[""], tokens=[[]],
        layers={0: LayerCapture(layer=0, heads=(0, 1), pattern=torch.cat([first, uniform], dim=1))},
    )


def test_a_sample_stands_for_every_row_of_its_batch():
    """6 rows at one distance and 4 at another: ⌈0.25 · 6⌉ = 2 and ⌈0.25 · 4⌉ = 1 rows read, yet the mean is
    (6 d₆ + 4 d₄) / 10, that of every row; counting each read row once would give (2 d₆ + d₄) / 3."""
    batches = [_one_item_batch(6), _one_item_batch(4)]
    sampled = HeadSimilarity(row_fraction=0.25)
    for batch in batches:
        sampled.update(batch)
    d = {n: float(js_distance(torch.eye(n)[0].double(), torch.full((n,), 1.0 / n, dtype=torch.float64)))
         for n in (6, 4)}
    result = sampled.result()
    assert (result.rows, result.sampled) == (10, 3)
    assert result.distances[0, 1] == pytest.approx((6 * d[6] + 4 * d[4]) / 10, rel=1e-6)
    assert result.distances[0, 1] == pytest.approx(slow_matrix(batches)[0, 1], rel=1e-6)
