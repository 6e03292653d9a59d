"""The training loop: reproducible from the seed, evaluations recorded, bad budgets refused."""

from __future__ import annotations

import pytest

from headlab.experiments.budget import check_seed, resolve_steps
from headlab.experiments.model import build_model
from headlab.experiments.seeds import Spread, seeds_from
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


def test_budget_and_seed_checks():
    assert resolve_steps(None, default=10, quick_default=3, quick=False) == 10
    assert resolve_steps(None, default=10, quick_default=3, quick=True) == 3
    assert resolve_steps(7, default=10, quick_default=3, quick=True) == 7
    for bad in (0, -2, True, 2.0):
        with pytest.raises(ValueError, match="must be a positive int"):
            resolve_steps(bad, default=10, quick_default=3, quick=False)
    assert check_seed(0) == 0
    for bad in (-1, 2**63, "1", False):
        with pytest.raises(ValueError, match="seed="):
            check_seed(bad)


def test_spread():
    s = Spread.of([1.0, 2.0, 3.0])
    assert (s.mean, s.std, str(s)) == (2.0, 1.0, "2.000 ± 1.000")
    assert Spread.of([0.5]).std == 0.0
    assert s.to_dict() == {"mean": 2.0, "std": 1.0, "values": [1.0, 2.0, 3.0]}
    assert seeds_from(5, 3) == [5, 6, 7]
    with pytest.raises(ValueError, match="at least one value"):
        Spread.of([])
