"""The synthetic tasks: every target is what its definition says, batches follow the generator."""

from __future__ import annotations

import pytest
import torch

from headlab.experiments.tasks import MixTask, RecallTask, RepeatTask


def draw(task, n=16, seed=0):
    return task.sample(n, generator=torch.Generator().manual_seed(seed))


def test_recall_targets_are_the_values_of_the_matching_keys():
    task = RecallTask(n_keys=10, n_values=7, n_pairs=5, n_queries=4)
    b = draw(task)
    assert b.inputs.shape == (16, 9, 2) and b.targets.shape == b.scored.shape == (16, 9)
    assert b.scored[:, 5:].all() and not b.scored[:, :5].any()
    for row, targets in zip(b.inputs.tolist(), b.targets.tolist()):
        context = dict(row[:5])
        assert len(context) == 5  # distinct keys
        for (key, value), target in zip(row[5:], targets[5:]):
            assert value == task.n_values and target == context[key]  # empty value field, the key's value
    assert b.inputs[..., 0].max() < task.vocab_sizes[0] and b.inputs[..., 1].max() < task.vocab_sizes[1]


def test_mix_targets_pair_the_matched_value_with_the_previous_value():
    task = MixTask()
    b = draw(task)
    n = task.n_pairs
    for row, targets in zip(b.inputs.tolist(), b.targets.tolist()):
        context = dict(row[:n])
        for t in range(n, task.seq_len):
            matched, previous = divmod(targets[t], task.n_values)
            assert matched == context[row[t][0]] and previous == row[t - 1][1]
    assert b.targets[b.scored].max() < task.n_classes


def test_repeat_second_copy_repeats_the_first_at_varying_offsets():
    task = RepeatTask()
    b = draw(task, n=64)
    tokens = b.inputs[..., 0]
    assert (tokens[:, 0] == task.bos).all() and (tokens[:, 1:] < task.vocab).all()
    spans = set()
    for row, scored, targets in zip(tokens.tolist(), b.scored.tolist(), b.targets.tolist()):
        span = sum(scored) + 1
        spans.add(span)
        r = row[1 : span + 1]
        assert len(set(r)) == span and row[span + 1 : 2 * span + 1] == r
        assert [i for i, s in enumerate(scored) if s] == list(range(span + 1, 2 * span))
        assert all(targets[i] == row[i + 1] for i in range(span + 1, 2 * span))
    assert len(spans) > 3 and min(spans) >= task.min_span and max(spans) <= task.max_span


@pytest.mark.parametrize("task", [RecallTask(), MixTask(), RepeatTask()], ids=lambda t: t.name)
def test_same_generator_same_batch(task):
    a, b, c = draw(task, seed=5), draw(task, seed=5), draw(task, seed=6)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="n_pairs=9 distinct keys"):
        RecallTask(n_keys=8, n_pairs=9)
    with pytest.raises(ValueError, match="n_values=0"):
        MixTask(n_values=0)
    with pytest.raises(ValueError, match="length=20"):
        RepeatTask(length=20, max_span=12)
    with pytest.raises(ValueError, match="batch_size=0"):
        RecallTask().sample(0, generator=torch.Generator())
