"""Heads that specialise: induction heads forming in a 2-layer attention-only model.

Axis legend:
    pattern  (batch, head, query_pos, key_pos)
    scores   (n_layers, n_heads)

A 2-layer ``TinyTransformer`` (rotary positions, N_HEADS heads per layer) learns ``RepeatTask``:
predict the second copy of a random span whose offset changes from sequence to sequence. The
known solution (Elhage et al. 2021; Olsson et al. 2022) is a circuit of two heads in two layers:
a previous-token head in layer 0 writes each token's predecessor into its position, and an
induction head in layer 1 matches the current token against those predecessors and attends
to the token after the earlier occurrence. At every evaluation the heads are read with
headlab's own detectors (``headlab.analysis.roles``) on the probe ``[BOS] + r + r``:
``previous_token_score`` (attention to i − 1), ``duplicate_token_score`` and ``induction_score``,
with the thresholds ``PREVIOUS_TOKEN`` and ``INDUCTION`` of the analysis of real models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from headlab.analysis.roles import (
    INDUCTION,
    PREVIOUS_TOKEN,
    duplicate_token_score,
    induction_score,
    previous_token_score,
    repeated_tokens,
)
from headlab.experiments.budget import check_seed, resolve_steps, single_thread
from headlab.experiments.figures import png
from headlab.experiments.model import TinyTransformer, build_model
from headlab.experiments.progress import StepBar
from headlab.experiments.tasks import RepeatTask
from headlab.experiments.train import History, train
from headlab.heads import head_label
from headlab.layer import AttentionConfig
from headlab.models.handle import evaluating

__all__ = ["InductionPair", "InductionResult", "head_scores", "induction_pair", "plot_induction", "run_induction"]

D_MODEL, N_HEADS, N_LAYERS, LR = 32, 4, 2, 1e-2
STEPS, QUICK_STEPS, EVAL_EVERY = 500, 200, 10
PROBE_SEQS, PROBE_LENGTH = 32, 10


def head_scores(model: TinyTransformer, probe: torch.Tensor, length: int) -> dict[str, list[list[float]]]:
    """Every head's detector scores on the probe ``[BOS] + r + r``.

    Args:
        model: a one-field ``TinyTransformer``.
        probe: ``(n_seqs, 1 + 2 × length)`` token ids.
        length: tokens in r.

    Returns:
        ``{"previous_token" | "duplicate_token" | "induction": scores}``, scores ``[layer][head]``.
    """
    with evaluating(model, grad=False):
        patterns = model(probe[..., None], return_pattern=True).pattern
    return {
        "previous_token": [previous_token_score(p).tolist() for p in patterns],
        "duplicate_token": [duplicate_token_score(p, length).tolist() for p in patterns],
        "induction": [induction_score(p, length).tolist() for p in patterns],
    }


def _best(scores: list[list[float]], layer: int) -> dict[str, Any]:
    head = max(range(len(scores[layer])), key=lambda h: scores[layer][h])
    return {"layer": layer, "head": head, "score": scores[layer][head]}


def _above(scores: list[list[float]], threshold: float) -> list[list[int]]:
    return [[layer, head] for layer, row in enumerate(scores) for head, s in enumerate(row) if s > threshold]


def _first_step(steps: list[int], values: list[float], test: Callable[[float], bool]) -> int | None:
    return next((s for s, v in zip(steps, values) if test(v)), None)


@dataclass
class InductionResult:
    """The induction experiment's claims and the scores over training (``--json``: docs/experiments.md).

    Attributes:
        initial_loss, final_loss: loss on the predictable positions (the second copy) at step 0
            and at the end; loss_drop is their difference.
        loss_halved_step: the first evaluated step with loss below half the initial loss.
        final_accuracy: accuracy on the predictable positions at the end.
        previous_token_heads, induction_heads: ``[layer, head]`` whose final score is above the
            detector's threshold (``PREVIOUS_TOKEN``, ``INDUCTION``), in any layer.
        best_previous_token: the layer-0 head with the highest final previous-token score.
        best_induction: the layer-1 head with the highest final induction score.
        previous_token_step, induction_step: the first evaluated step at which some layer-0 head's
            previous-token score (some layer-1 head's induction score) is above the threshold.
        scores: per evaluation, ``{"previous_token" | "duplicate_token" | "induction": [layer][head]}``.
        model: the trained model (not in ``to_dict``): its circuit is read by ``headlab.circuits``.
    """

    seed: int
    steps: int
    task: dict[str, Any]
    d_model: int
    n_heads: int
    probe_length: int
    thresholds: dict[str, float]
    initial_loss: float
    final_loss: float
    loss_drop: float
    loss_halved_step: int | None
    final_accuracy: float
    previous_token_heads: list[list[int]]
    induction_heads: list[list[int]]
    best_previous_token: dict[str, Any]
    best_induction: dict[str, Any]
    previous_token_step: int | None
    induction_step: int | None
    history: History
    scores: list[dict[str, list[list[float]]]] = field(default_factory=list)
    model: TinyTransformer | None = field(default=None, repr=False, compare=False)

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The claims as (headers, rows) of text."""
        def heads(pairs: list[list[int]]) -> str:
            return " ".join(head_label(layer, head) for layer, head in pairs) or "none"

        def step(s: int | None) -> str:
            return "never" if s is None else str(s)

        bp, bi = self.best_previous_token, self.best_induction
        return ["claim", "value"], [
            ["loss on the second copy: start → end", f"{self.initial_loss:.3f} → {self.final_loss:.4f}"],
            ["loss halved at step", step(self.loss_halved_step)],
            ["final accuracy on the second copy", f"{self.final_accuracy:.3f}"],
            [f"previous-token heads (score > {self.thresholds['previous_token']})", heads(self.previous_token_heads)],
            [f"induction heads (score > {self.thresholds['induction']})", heads(self.induction_heads)],
            ["best previous-token head in layer 0", f"{head_label(0, bp['head'])} ({bp['score']:.3f})"],
            ["best induction head in layer 1", f"{head_label(1, bi['head'])} ({bi['score']:.3f})"],
            ["first step with a previous-token head in layer 0", step(self.previous_token_step)],
            ["first step with an induction head in layer 1", step(self.induction_step)],
        ]

    def sentences(self) -> list[str]:
        """What the run shows, in sentences generated from the numbers."""
        def listed(pairs: list[list[int]]) -> str:
            return ", ".join(head_label(layer, head) for layer, head in pairs) or "none"

        def layers(pairs: list[list[int]]) -> str:
            found = sorted({layer for layer, _ in pairs})
            return "no layer" if not found else "layer " + " and ".join(map(str, found))

        bp, bi = self.best_previous_token, self.best_induction
        halved = ("" if self.loss_halved_step is None
                  else f", falling below half its start by step {self.loss_halved_step}")
        when = []
        if self.previous_token_step is not None:
            when.append(f"the first previous-token head appeared in layer 0 at step {self.previous_token_step}")
        if self.induction_step is not None:
            when.append(f"the first induction head in layer 1 at step {self.induction_step}")
        return [
            f"Loss on the predictable second copy fell from {self.initial_loss:.2f} to {self.final_loss:.3f} nats "
            f"in {self.steps} steps{halved}; final accuracy {self.final_accuracy:.0%}.",
            f"headlab's detectors on [BOS] + r + r (|r| = {self.probe_length}) find previous-token heads "
            f"{listed(self.previous_token_heads)} ({layers(self.previous_token_heads)}; best "
            f"{head_label(0, bp['head'])} at {bp['score']:.2f}) and induction heads {listed(self.induction_heads)} "
            f"({layers(self.induction_heads)}; best {head_label(1, bi['head'])} at {bi['score']:.2f})"
            + (": " + "; ".join(when) + "." if when else "."),
        ]

    def to_dict(self) -> dict[str, Any]:
        fields = asdict(replace(self, model=None))
        del fields["model"]
        return {"experiment": "induction"} | fields


@single_thread()
def run_induction(*, seed: int = 0, steps: int | None = None, quick: bool = False,
                  progress: bool = False) -> InductionResult:
    """Train the 2-layer attention-only model on repeated spans and watch its heads specialise.

    Args:
        seed: seeds the weights, the data and the probe.
        steps: optimiser steps (default 500; 200 with ``quick``).
        quick: the small version.
        progress: show a progress bar on stderr.

    Returns:
        An ``InductionResult``.

    Raises:
        ValueError: a bad seed or number of steps.
    """
    seed = check_seed(seed)
    steps = resolve_steps(steps, default=STEPS, quick_default=QUICK_STEPS, quick=quick)
    task = RepeatTask()
    config = AttentionConfig(d_model=D_MODEL, n_heads=N_HEADS, rotary=True)
    model = build_model(task, [config] * N_LAYERS, seed=seed)
    probe = repeated_tokens(n_seqs=PROBE_SEQS, length=PROBE_LENGTH, vocab_size=task.vocab, bos_id=task.bos,
                            seed=seed)
    scores: list[dict[str, list[list[float]]]] = []
    with StepBar(enabled=progress, total=steps, description="induction") as bar:
        history = train(model, task, steps=steps, seed=seed, lr=LR, eval_every=EVAL_EVERY, bar=bar, run="2 layers",
                        on_eval=lambda step, m: scores.append(head_scores(m, probe, PROBE_LENGTH)))
    final = scores[-1]
    layer0_prev = [max(s["previous_token"][0]) for s in scores]
    layer1_induction = [max(s["induction"][1]) for s in scores]
    initial_loss, final_loss = history.loss[0], history.final_loss
    return InductionResult(
        seed=seed, steps=steps, task={"name": task.name, **asdict(task)}, d_model=D_MODEL, n_heads=N_HEADS,
        probe_length=PROBE_LENGTH, thresholds={"previous_token": PREVIOUS_TOKEN, "induction": INDUCTION},
        initial_loss=initial_loss, final_loss=final_loss, loss_drop=initial_loss - final_loss,
        loss_halved_step=_first_step(history.steps, history.loss, lambda v: v < initial_loss / 2),
        final_accuracy=history.final_accuracy,
        previous_token_heads=_above(final["previous_token"], PREVIOUS_TOKEN),
        induction_heads=_above(final["induction"], INDUCTION),
        best_previous_token=_best(final["previous_token"], 0), best_induction=_best(final["induction"], 1),
        previous_token_step=_first_step(history.steps, layer0_prev, lambda v: v > PREVIOUS_TOKEN),
        induction_step=_first_step(history.steps, layer1_induction, lambda v: v > INDUCTION),
        history=history, scores=scores, model=model,
    )


@dataclass(frozen=True)
class InductionPair:
    """A clean and a corrupted input for the trained model's circuit, and the metric that tells them apart.

    Attributes:
        clean: ``(n_seqs, 1 + 2 × length)`` int64: ``[BOS] + r + r``.
        corrupted: the same with the first copy of r replaced by other tokens.
        metric: on the second copy's positions, mean of ``logit(next token of r) − logit(the token the
            corrupted first copy puts after it)``: what copying from the first copy predicts, against what
            it predicts in the corrupted run (differentiable).
    """

    clean: torch.Tensor
    corrupted: torch.Tensor
    metric: Callable[[Any], torch.Tensor]


def induction_pair(result: InductionResult, *, n_seqs: int = 16, length: int = 8, seed: int = 1) -> InductionPair:
    """The pair on which the trained model's previous-token → induction circuit shows (``headlab.circuits``).

    Raises:
        ValueError: a length the task's vocabulary cannot draw distinct tokens for.
    """
    vocab = result.task["vocab"]
    clean = repeated_tokens(n_seqs=n_seqs, length=length, vocab_size=vocab, bos_id=vocab, seed=seed)
    other = repeated_tokens(n_seqs=n_seqs, length=length, vocab_size=vocab, bos_id=vocab, seed=seed + 1)
    corrupted = clean.clone()
    corrupted[:, 1: 1 + length] = other[:, 1: 1 + length]
    positions = torch.arange(1 + length, 2 * length)  # the second copy, each position predicting the next token
    right, wrong = clean[:, positions + 1], corrupted[:, positions + 1 - length]

    def metric(output: Any) -> torch.Tensor:
        logits = output.logits[:, positions]  # (n_seqs, length − 1, classes)
        return (logits.gather(-1, right[..., None]) - logits.gather(-1, wrong[..., None])).mean()

    return InductionPair(clean, corrupted, metric)


def plot_induction(result: InductionResult) -> bytes:
    """Loss, the heads' detector scores over training, and the final scores by head, as PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 4), layout="constrained")
    loss_ax, score_ax, final_ax = fig.subplots(1, 3)
    steps = result.history.steps
    loss_ax.plot(steps, result.history.loss, color="black", label="loss (second copy)")
    loss_ax.set(xlabel="step", ylabel="cross-entropy")
    acc_ax = loss_ax.twinx()
    acc_ax.plot(steps, result.history.accuracy, color="tab:green", label="accuracy")
    acc_ax.set(ylabel="accuracy", ylim=(0, 1.05))
    loss_ax.legend(loc="center right", fontsize="small")
    acc_ax.legend(loc="upper right", fontsize="small")
    for head in range(result.n_heads):
        score_ax.plot(steps, [s["previous_token"][0][head] for s in result.scores], color="tab:blue",
                      alpha=0.8, label="layer 0, previous-token" if head == 0 else None)
        score_ax.plot(steps, [s["induction"][1][head] for s in result.scores], color="tab:red", alpha=0.8,
                      label="layer 1, induction" if head == 0 else None)
    for name, colour in (("previous_token", "tab:blue"), ("induction", "tab:red")):
        score_ax.axhline(result.thresholds[name], color=colour, linestyle=":", linewidth=0.8)
    score_ax.set(xlabel="step", ylabel="detector score (one line per head)", ylim=(0, 1.05),
                 title="thresholds dotted", )
    score_ax.legend(fontsize="small")
    final = result.scores[-1]
    names = ("previous_token", "duplicate_token", "induction")
    grid = [[final[name][layer][head] for name in names for head in range(result.n_heads)]
            for layer in range(len(final["induction"]))]
    image = final_ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    final_ax.set_yticks(range(len(grid)), [f"layer {i}" for i in range(len(grid))])
    final_ax.set_xticks(range(len(names) * result.n_heads),
                        [f"{n.split('_')[0][:4]} h{h}" for n in names for h in range(result.n_heads)],
                        rotation=60, fontsize="x-small")
    final_ax.set_title("final scores by head")
    fig.colorbar(image, ax=final_ax, shrink=0.8)
    fig.suptitle(f"Induction heads: 2 layers × {result.n_heads} heads, d_model {result.d_model}, seed {result.seed}")
    return png(fig)
