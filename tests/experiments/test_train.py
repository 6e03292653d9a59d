"""The training loop: reproducible from the seed, evaluations recorded, bad budgets refused."""

from __future__ import annotations

import pytest

from headlab.experiments.model import build_model
from headlab.experiments.tasks import RecallTask
from headlab.experiments.train import History, train, train_config
from headlab.layer import AttentionConfig
from headlab.layer.accounting import account

CONFIG = AttentionConfig(d_model=16, n_heads=2)


def test_same_seed_same_run_bit_for_bit_and_learning():
    task = RecallTask(n_keys=6, n_values=6, n_pairs=4, n_queries=4)
    runs = [train_config(task, CONFIG, label="x", seed=s, steps=60, lr=1e-2, eval_every=20) for s in (3, 3, 4)]
    assert runs[0].history == runs[1].history
    assert runs[0].history != runs[2].history
    h = runs[0].history
    assert h.steps == [0, 20, 40, 60] and h.final_loss < h.loss[0]
    assert runs[0].parameters == account(CONFIG).total_parameters
    assert runs[0].flops == account(CONFIG, seq_len=task.seq_len).total_flops


def test_on_eval_sees_every_evaluation():
    task = RecallTask()
    seen = []
    history = train(build_model(task, [CONFIG], seed=0), task, steps=7, seed=0, eval_every=3,
                    on_eval=lambda step, model: seen.append(step))
    assert seen == history.steps == [0, 3, 6, 7]


def test_history_steps_to():
    h = History(steps=[0, 10, 20], loss=[3.0, 2.0, 1.0], accuracy=[0.1, 0.95, 0.9])
    assert h.steps_to(0.9) == 10 and h.steps_to(0.99) is None and h.final_accuracy == 0.9


@pytest.mark.parametrize("kwargs, match", [
    ({"steps": 0}, "steps=0"), ({"batch_size": -1}, "batch_size=-1"), ({"lr": 0.0}, "lr=0.0"),
    ({"eval_every": 1.5}, "eval_every=1.5"), ({"seed": -1}, "seed=-1"),
])
def test_bad_training_arguments(kwargs, match):
    task = RecallTask()
    options = {"steps": 1, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=match):
        train(build_model(task, [CONFIG], seed=0), task, **options)
