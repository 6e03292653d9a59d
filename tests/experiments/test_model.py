"""TinyTransformer: shapes, causal patterns, bad inputs, seeded construction."""

from __future__ import annotations

import pytest
import torch

from headlab.experiments.model import TinyTransformer, build_model
from headlab.experiments.tasks import MixTask, RepeatTask
from headlab.layer import AttentionConfig


def test_logits_and_causal_patterns_per_layer():
    task = RepeatTask()
    config = AttentionConfig(d_model=16, n_heads=2, rotary=True)
    model = build_model(task, [config, config], seed=0)
    batch = task.sample(3, generator=torch.Generator().manual_seed(0))
    out = model(batch.inputs, return_pattern=True)
    assert out.logits.shape == (3, task.seq_len, task.n_classes)
    assert len(out.pattern) == 2 and out.pattern[0].shape == (3, 2, task.seq_len, task.seq_len)
    assert all(m.config.causal for m in model.attention)
    upper = torch.triu(torch.ones(task.seq_len, task.seq_len, dtype=torch.bool), diagonal=1)
    assert (out.pattern[1][..., upper] == 0).all()
    assert model(batch.inputs).pattern is None


def test_build_model_is_seeded_and_leaves_the_global_generator_alone():
    task = MixTask()
    config = AttentionConfig(d_model=16, n_heads=4)
    state = torch.get_rng_state()
    a, b, c = (build_model(task, [config], seed=s) for s in (1, 1, 2))
    assert torch.equal(torch.get_rng_state(), state)
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name
    assert not all(torch.equal(p, r) for p, r in zip(a.parameters(), c.parameters()))


def test_bad_inputs_are_refused():
    task = MixTask()
    model = build_model(task, [AttentionConfig(d_model=16, n_heads=4)], seed=0)
    with pytest.raises(ValueError, match="expected \\(batch, pos ≤ 12, 2\\)"):
        model(torch.zeros(2, 13, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="field 1 has symbols outside \\[0, 4\\)"):
        model(torch.full((2, 5, 2), 3, dtype=torch.long).index_fill_(2, torch.tensor([1]), 4))
    with pytest.raises(ValueError, match="same d_model"):
        TinyTransformer(vocab_sizes=(4,), n_classes=4, max_len=8,
                        layers=[AttentionConfig(d_model=16, n_heads=2), AttentionConfig(d_model=8, n_heads=2)])
    with pytest.raises(ValueError, match="layers is empty"):
        TinyTransformer(vocab_sizes=(4,), n_classes=4, max_len=8, layers=[])
