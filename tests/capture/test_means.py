"""Mean z over a corpus, and mean-ablation with it."""

from __future__ import annotations

import pytest
import torch

import headlab
from headlab import heads
from headlab.capture import MeanZ, capture, mean_z
from headlab.heads import Heads
from headlab.models import headed
from tests.support.minilm import minilm
from tests.support.reference import model_reference


def _reference_means(model, tokenizer, texts):
    """Per layer, every head's z averaged over every token of every item, one unpadded item at a time."""
    sums, count = {}, 0
    with torch.no_grad():
        for text in texts:
            ids = tokenizer.encode(text).ids
            for layer, taken in enumerate(model_reference(model, ids)):
                sums[layer] = sums.get(layer, 0) + taken["z"].double().sum(dim=1)
            count += len(ids)
    return {layer: total / count for layer, total in sums.items()}


def test_mean_z_equals_per_item_reference(model, tokenizer, texts):
    means = mean_z(headlab.attach(model, tokenizer=tokenizer), texts, progress=False, batch_tokens=40)
    expected = _reference_means(model, tokenizer, texts)
    assert sorted(means) == [0, 1, 2]
    for layer in means:
        torch.testing.assert_close(means[layer], expected[layer], atol=1e-6, rtol=1e-6)


def test_merge_of_halves_equals_the_whole(model, tokenizer, texts):
    """The same batches into one accumulator or split over two and merged: float64 sums, equal to 1e-12.
    (Captures of two halves of a corpus batch it differently, and float32 kernels need not give
    bit-equal z for another padding: that is the forward's rounding, not the merge's.)"""
    whole, first, second = MeanZ(), MeanZ(), MeanZ()

    class Split:  # every batch to the whole; the first two to one half, the rest to the other
        seen = 0

        def update(self, batch):
            whole.update(batch)
            (first if self.seen < 2 else second).update(batch)
            self.seen += 1

    split = Split()
    capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, take=("z",), consumers=[split], progress=False,
            batch_tokens=40)
    assert split.seen > 2
    merged = first.merge(second).result()
    for layer, mean in whole.result().items():
        torch.testing.assert_close(merged[layer], mean, atol=1e-12, rtol=0)


def test_mean_z_needs_z(model, tokenizer, texts):
    with pytest.raises(ValueError, match="captured without z"):
        capture(headlab.attach(model, tokenizer=tokenizer), corpus=texts, take=("pattern",), consumers=[MeanZ()],
                progress=False)


def test_mean_ablation_of_minilm_with_corpus_means():
    loaded = minilm()
    texts = ["The cat sat.", "A longer sentence about heads and layers, with a clause that runs on."]
    means = mean_z(loaded, texts, heads=Heads(layers=[1]), progress=False)
    site = headed(loaded.model).sites[1]
    assert means[1].shape == (site.n_heads, site.d_head_v)
    heads.mean_ablate(loaded.model, {1: [4]}, means)
    try:
        assert heads.summary(loaded.model) == [{"layer": 1, "head": 4, "scale": 0.0, "shifted": True,
                                                "kind": "mean-ablated"}]
        seen = []
        capture(loaded, corpus=texts, heads=Heads(layers=[1], heads=[4, 5]), take=("z",), progress=False,
                consumers=[type("Keep", (), {"update": lambda self, b: seen.append(b.layers[1].z[:, 0][
                    b.attention_mask.bool()])})()])
        z = torch.cat(seen)  # head 4's z at every real token: now the corpus mean, everywhere
        torch.testing.assert_close(z, means[1][4].float().expand_as(z), atol=1e-6, rtol=0)
    finally:
        heads.restore(loaded.model)
