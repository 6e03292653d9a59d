"""The seeded training loop of the experiments: Adam on a synthetic task, evaluated as it goes.

Everything random comes from seeds: the training batches from one ``torch.Generator``, the
evaluation batch from another, fixed for the run (the initial weights from
``headlab.experiments.model.build_model``). On the CPU the same seeds give the same losses and
accuracies, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from headlab.experiments.budget import check_seed
from headlab.experiments.model import TinyTransformer, build_model
from headlab.experiments.progress import StepBar
from headlab.experiments.tasks import Batch, Task
from headlab.layer import AttentionConfig, MultiHeadAttention
from headlab.layer.accounting import account
from headlab.models.handle import evaluating

__all__ = ["EVAL_SEED_OFFSET", "ConfigRun", "History", "evaluate", "loss_and_accuracy", "train", "train_config"]

EVAL_SEED_OFFSET = 1_000_003  # the evaluation batch's generator: seed + this, apart from training's


@dataclass
class History:
    """Evaluations made during one training run.

    Attributes:
        steps: optimiser steps taken before each evaluation (0 = at initialisation).
        loss: cross-entropy on the evaluation batch's scored positions.
        accuracy: share of scored positions predicted exactly.
    """

    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)

    @property
    def final_accuracy(self) -> float:
        return self.accuracy[-1]

    @property
    def final_loss(self) -> float:
        return self.loss[-1]

    def steps_to(self, accuracy: float) -> int | None:
        """The first evaluated step whose accuracy is at least ``accuracy``, or None if none is."""
        return next((s for s, a in zip(self.steps, self.accuracy) if a >= accuracy), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def loss_and_accuracy(logits: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
    """Cross-entropy and accuracy over the scored positions.

    Args:
        logits: ``(batch, pos, n_classes)``.
        batch: the batch the logits are for.

    Returns:
        Scalar loss (differentiable) and scalar accuracy.
    """
    chosen = logits[batch.scored]  # (n_scored, n_classes)
    targets = batch.targets[batch.scored]
    return F.cross_entropy(chosen, targets), (chosen.argmax(-1) == targets).float().mean()


@torch.no_grad()
def evaluate(model: TinyTransformer, batch: Batch) -> tuple[float, float]:
    """Loss and accuracy of ``model`` on ``batch`` (in eval mode, restored after)."""
    with evaluating(model):
        loss, accuracy = loss_and_accuracy(model(batch.inputs).logits, batch)
    return float(loss), float(accuracy)


def train(
    model: TinyTransformer,
    task: Task,
    *,
    steps: int,
    seed: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    eval_every: int = 25,
    eval_size: int = 256,
    on_eval: Callable[[int, TinyTransformer], None] | None = None,
    bar: StepBar | None = None,
    run: str | None = None,
) -> History:
    """Train ``model`` on ``task`` with Adam and evaluate it every ``eval_every`` steps.

    Args:
        model: the model, trained in place.
        task: the task; batches come from a generator seeded with ``seed``.
        steps: optimiser steps.
        seed: seed of the training batches (the evaluation batch uses seed + EVAL_SEED_OFFSET).
        batch_size: sequences per step.
        lr: Adam's learning rate.
        eval_every: steps between evaluations (also at step 0 and at the last step).
        eval_size: sequences in the fixed evaluation batch.
        on_eval: called as ``on_eval(step, model)`` after each evaluation (e.g. to read heads).
        bar: progress bar to advance by one per step.
        run: this run's name on the progress bar.

    Returns:
        The ``History`` of evaluations.

    Raises:
        ValueError: a non-positive steps, batch_size, eval_every or eval_size, or lr ≤ 0.
    """
    for name, value in (("steps", steps), ("batch_size", batch_size), ("eval_every", eval_every),
                        ("eval_size", eval_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    if not lr > 0:
        raise ValueError(f"lr={lr!r} must be > 0")
    batches = torch.Generator().manual_seed(check_seed(seed))
    eval_batch = task.sample(eval_size, generator=torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET))
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    history = History()

    def record(step: int) -> None:
        loss, accuracy = evaluate(model, eval_batch)
        history.steps.append(step)
        history.loss.append(loss)
        history.accuracy.append(accuracy)
        if on_eval is not None:
            on_eval(step, model)

    model.train()
    record(0)
    for step in range(1, steps + 1):
        batch = task.sample(batch_size, generator=batches)
        loss, _ = loss_and_accuracy(model(batch.inputs).logits, batch)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        if step % eval_every == 0 or step == steps:
            record(step)
        if bar is not None:
            bar.advance(run=run)
    return history



@dataclass
class ConfigRun:
    """One attention config trained on one task from one seed.

    Attributes:
        label: the run's name in its experiment (e.g. a variant).
        task: the task's name.
        seed: seed of the initial weights and of the data.
        config: the attention layer's resolved config (``AttentionConfig.to_dict()``).
        parameters: the attention layer's parameters (``headlab.layer.accounting.account``).
        flops: the attention layer's forward FLOPs over one sequence of the task.
        history: evaluations during training.
    """

    label: str
    task: str
    seed: int
    config: dict[str, Any]
    parameters: int
    flops: int
    history: History

    @property
    def final_accuracy(self) -> float:
        return self.history.final_accuracy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def train_config(task: Task, config: AttentionConfig, *, label: str, seed: int, steps: int, lr: float,
                 eval_every: int, bar: StepBar | None = None) -> ConfigRun:
    """Build a one-layer ``TinyTransformer`` with ``config`` from ``seed`` and train it on ``task``.

    Args:
        task: the task.
        config: the attention layer (made causal by the model).
        label: the run's name (shown on the bar and kept in the result).
        seed: seeds the initial weights and the training and evaluation batches.
        steps, lr, eval_every: as ``train``.
        bar: progress bar.

    Returns:
        A ``ConfigRun`` with the layer's parameters and FLOPs from ``account``.
    """
    model = build_model(task, [config], seed=seed)
    history = train(model, task, steps=steps, seed=seed, lr=lr, eval_every=eval_every, bar=bar,
                    run=f"{label} on {task.name}, seed {seed}")
    accounting = account(cast(MultiHeadAttention, model.attention[0]).config, seq_len=task.seq_len)
    return ConfigRun(label=label, task=task.name, seed=seed, config=accounting.config.to_dict(),
                     parameters=accounting.total_parameters, flops=accounting.total_flops, history=history)
