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
``previous_token_score`` (attention to i − 1), ``duplicate_token_score`` and ``induction_score``;
a head is of a kind at the end when its score is above the detector's threshold
(``PREVIOUS_TOKEN``, ``INDUCTION``, those of the analysis of real models).

When each head formed is timed by one rule for every curve, not by the two thresholds (which
differ, and would time the two heads by different yardsticks): the first evaluated step at
which the curve has covered FRACTION of its change from step 0 to the end. The same rule times
the drop of the loss on the repeated half, so the phase change of Olsson et al. 2022 (the loss
drop coinciding with the induction head's rise) is read from the same numbers. The model is
trained from N_SEEDS seeds, and one event is said to precede another only beyond the seeds'
noise (``headlab.experiments.seeds.Gap``).
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
from headlab.experiments.seeds import Gap, seeds_from
from headlab.experiments.tasks import RepeatTask
from headlab.experiments.train import History, train
from headlab.heads import head_label
from headlab.layer import AttentionConfig
from headlab.models.handle import evaluating

__all__ = ["FRACTION", "InductionPair", "InductionResult", "SeedRun", "change_step", "head_scores", "induction_pair",
           "plot_induction", "run_induction"]

D_MODEL, N_HEADS, N_LAYERS, LR = 32, 4, 2, 1e-2
STEPS, QUICK_STEPS, EVAL_EVERY, N_SEEDS = 500, 200, 10, 3
FRACTION = 0.5  # a curve changes at the first step covering this fraction of its change (one rule for all)
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


def change_step(steps: list[int], values: list[float], *, fraction: float = FRACTION) -> int | None:
    """The first evaluated step at which ``values`` have covered ``fraction`` of their change from the first
    value to the last; None when they end where they started.

    One rule for every curve (a rising score, a falling loss), so that two curves' steps compare.

    Raises:
        ValueError: a fraction outside (0, 1].
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction!r} must be in (0, 1]")
    start, change = values[0], values[-1] - values[0]
    if change == 0:
        return None
    return next(s for s, v in zip(steps, values) if (v - start) / change >= fraction)


@dataclass
class SeedRun:
    """One seed's training, reduced to the three curves that the one rule times.

    Attributes:
        seed: the seed of the weights, the data and the probe.
        steps: the evaluated steps.
        loss: loss on the repeated half (the second copy: the only positions scored) per evaluation.
        previous_token: the highest previous-token score among layer-0 heads, per evaluation.
        induction: the highest induction score among layer-1 heads, per evaluation.
        emergence: ``"previous_token" | "induction" | "loss"`` → ``change_step`` of that curve; None for a
            head score when no head of the kind is above its detector's threshold at the end, and for the
            loss when it did not fall.
    """

    seed: int
    steps: list[int]
    loss: list[float]
    previous_token: list[float]
    induction: list[float]
    emergence: dict[str, int | None]


def _seed_run(seed: int, history: History, scores: list[dict[str, list[list[float]]]]) -> SeedRun:
    previous = [max(s["previous_token"][0]) for s in scores]
    inducing = [max(s["induction"][1]) for s in scores]
    steps, loss = history.steps, history.loss
    return SeedRun(seed=seed, steps=steps, loss=loss, previous_token=previous, induction=inducing, emergence={
        "previous_token": change_step(steps, previous) if previous[-1] > PREVIOUS_TOKEN else None,
        "induction": change_step(steps, inducing) if inducing[-1] > INDUCTION else None,
        "loss": change_step(steps, loss) if loss[-1] < loss[0] else None,
    })


_CURVES = {"previous_token": "the best layer-0 previous-token score", "induction": "the best layer-1 induction score",
           "loss": "the loss on the repeated half"}


@dataclass
class InductionResult:
    """The induction experiment's claims and the scores over training (``--json``: docs/experiments.md).

    The loss, heads and scores are those of the first seed's run (``seed``); the emergence steps and
    their order are over every seed (``runs``).

    Attributes:
        initial_loss, final_loss: loss on the predictable positions (the second copy) at step 0
            and at the end; loss_drop is their difference.
        final_accuracy: accuracy on the predictable positions at the end.
        previous_token_heads, induction_heads: ``[layer, head]`` whose final score is above the
            detector's threshold (``PREVIOUS_TOKEN``, ``INDUCTION``), in any layer.
        best_previous_token: the layer-0 head with the highest final previous-token score.
        best_induction: the layer-1 head with the highest final induction score.
        fraction: the one rule of emergence: a curve changes at the first evaluated step covering this
            fraction of its change from step 0 to the end (``change_step``).
        runs: one ``SeedRun`` per seed, with its curves and emergence steps.
        induction_after_previous_token: per seed, the induction step − the previous-token step, and which
            came first beyond the seeds' noise (``Gap``).
        loss_after_induction: per seed, the loss's step − the induction step: the phase change of Olsson
            et al. 2022 is the loss drop coinciding with the induction head's rise.
        scores: per evaluation, ``{"previous_token" | "duplicate_token" | "induction": [layer][head]}``.
        model: the trained model (not in ``to_dict``): its circuit is read by ``headlab.circuits``.
    """

    seed: int
    seeds: list[int]
    steps: int
    eval_every: int
    task: dict[str, Any]
    d_model: int
    n_heads: int
    probe_length: int
    thresholds: dict[str, float]
    initial_loss: float
    final_loss: float
    loss_drop: float
    final_accuracy: float
    previous_token_heads: list[list[int]]
    induction_heads: list[list[int]]
    best_previous_token: dict[str, Any]
    best_induction: dict[str, Any]
    fraction: float
    runs: list[SeedRun]
    induction_after_previous_token: Gap
    loss_after_induction: Gap
    history: History
    scores: list[dict[str, list[list[float]]]] = field(default_factory=list)
    model: TinyTransformer | None = field(default=None, repr=False, compare=False)

    def emergence(self, curve: str) -> list[int | None]:
        """Per seed, the step at which ``curve`` (``previous_token``, ``induction`` or ``loss``) changed."""
        return [run.emergence[curve] for run in self.runs]

    def _steps(self, curve: str) -> str:
        return ", ".join("never" if s is None else str(s) for s in self.emergence(curve))

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The claims as (headers, rows) of text."""
        def heads(pairs: list[list[int]]) -> str:
            return " ".join(head_label(layer, head) for layer, head in pairs) or "none"

        def order(gap: Gap, a: str, b: str) -> str:
            first = {"a": f"{a} first", "b": f"{b} first", None: "not told apart"}[gap.first]
            return f"{gap}: {first}"

        bp, bi = self.best_previous_token, self.best_induction
        seeds, at = ", ".join(map(str, self.seeds)), f"seed {self.seed}:"
        return ["claim", "value"], [
            [f"{at} loss on the second copy, start → end", f"{self.initial_loss:.3f} → {self.final_loss:.4f}"],
            [f"{at} final accuracy on the second copy", f"{self.final_accuracy:.3f}"],
            [f"{at} previous-token heads (score > {self.thresholds['previous_token']})",
             heads(self.previous_token_heads)],
            [f"{at} induction heads (score > {self.thresholds['induction']})", heads(self.induction_heads)],
            [f"{at} best previous-token head in layer 0", f"{head_label(0, bp['head'])} ({bp['score']:.3f})"],
            [f"{at} best induction head in layer 1", f"{head_label(1, bi['head'])} ({bi['score']:.3f})"],
            *([f"step covering {self.fraction:.0%} of the change of {text} (seeds {seeds})", self._steps(curve)]
              for curve, text in _CURVES.items()),
            ["induction step − previous-token step (mean ± std over seeds)",
             order(self.induction_after_previous_token, "previous-token head", "induction head")],
            ["loss step − induction step (mean ± std over seeds)",
             order(self.loss_after_induction, "induction head", "loss drop")],
        ]

    def sentences(self) -> list[str]:
        """What the run shows, in sentences generated from the numbers."""
        def listed(pairs: list[list[int]]) -> str:
            return ", ".join(head_label(layer, head) for layer, head in pairs) or "none"

        def layers(pairs: list[list[int]]) -> str:
            found = sorted({layer for layer, _ in pairs})
            return "no layer" if not found else "layer " + " and ".join(map(str, found))

        bp, bi = self.best_previous_token, self.best_induction
        previous, induction, loss = (self._steps(curve) for curve in _CURVES)
        never = None in self.emergence("previous_token") + self.emergence("induction")
        return [
            f"With seed {self.seed}, loss on the predictable second copy fell from {self.initial_loss:.2f} to "
            f"{self.final_loss:.3f} nats in {self.steps} steps; final accuracy {self.final_accuracy:.0%}.",
            f"headlab's detectors on [BOS] + r + r (|r| = {self.probe_length}) find previous-token heads "
            f"{listed(self.previous_token_heads)} ({layers(self.previous_token_heads)}; best "
            f"{head_label(0, bp['head'])} at {bp['score']:.2f}) and induction heads {listed(self.induction_heads)} "
            f"({layers(self.induction_heads)}; best {head_label(1, bi['head'])} at {bi['score']:.2f}).",
            f"One rule times every curve, over seeds {', '.join(map(str, self.seeds))} (evaluated every "
            f"{self.eval_every} steps): the first step at which the curve has covered {self.fraction:.0%} of its "
            f"change from step 0 to the end. The best layer-0 previous-token score did so at steps {previous}, the "
            f"best layer-1 induction score at {induction} and the loss on the repeated half at {loss}"
            + (" (never: no head of that kind above its detector's threshold at the end)" if never else "")
            + ". One event is said to come before another only when the mean difference of their steps exceeds "
            f"both its standard deviation across the {len(self.seeds)} seeds and the evaluation interval.",
            self._order_sentence(),
            self._phase_sentence(),
        ]

    def _order_sentence(self) -> str:
        gap = self.induction_after_previous_token
        if gap.spread is None:
            return "Which head formed first cannot be told: not every seed formed both."
        if gap.first is None:
            return (f"By that rule the previous-token head and the induction head formed together, within the "
                    f"noise: the induction step minus the previous-token step is {gap} over the seeds.")
        earlier = "previous-token" if gap.first == "a" else "induction"
        return (f"The {earlier} head formed first, beyond the noise: the induction step minus the previous-token "
                f"step is {gap} over the seeds.")

    def _phase_sentence(self) -> str:
        gap = self.loss_after_induction
        if gap.spread is None:
            return ("The loss drop cannot be set against the induction head's rise: not every seed formed an "
                    "induction head and lowered the loss.")
        if gap.first is None:
            return (f"The loss on the repeated half dropped as the induction head rose, within the noise (the loss "
                    f"step minus the induction step is {gap}): the phase change of Olsson et al. 2022.")
        when = "after" if gap.first == "a" else "before"
        return (f"The loss on the repeated half dropped {when} the induction head rose, beyond the noise (the loss "
                f"step minus the induction step is {gap}), where Olsson et al. 2022 found the two together.")

    def to_dict(self) -> dict[str, Any]:
        fields = asdict(replace(self, model=None))
        del fields["model"]
        fields["induction_after_previous_token"] = self.induction_after_previous_token.to_dict()
        fields["loss_after_induction"] = self.loss_after_induction.to_dict()
        return {"experiment": "induction"} | fields


def _train_seed(seed: int, steps: int, bar: StepBar) -> tuple[TinyTransformer, History,
                                                                list[dict[str, list[list[float]]]]]:
    task = RepeatTask()
    config = AttentionConfig(d_model=D_MODEL, n_heads=N_HEADS, rotary=True)
    model = build_model(task, [config] * N_LAYERS, seed=seed)
    probe = repeated_tokens(n_seqs=PROBE_SEQS, length=PROBE_LENGTH, vocab_size=task.vocab, bos_id=task.bos,
                            seed=seed)
    scores: list[dict[str, list[list[float]]]] = []
    history = train(model, task, steps=steps, seed=seed, lr=LR, eval_every=EVAL_EVERY, bar=bar,
                    run=f"2 layers, seed {seed}", on_eval=lambda step, m: scores.append(head_scores(m, probe,
                                                                                                   PROBE_LENGTH)))
    return model, history, scores


@single_thread()
def run_induction(*, seed: int = 0, steps: int | None = None, quick: bool = False,
                  progress: bool = False) -> InductionResult:
    """Train the 2-layer attention-only model on repeated spans over 3 seeds and watch its heads specialise.

    Args:
        seed: the first of the 3 consecutive seeds (each seeds the weights, the data and the probe);
            its run gives the loss, the heads and the model.
        steps: optimiser steps per seed (default 500; 200 with ``quick``).
        quick: the small version.
        progress: show a progress bar on stderr.

    Returns:
        An ``InductionResult``.

    Raises:
        ValueError: a bad seed or number of steps.
    """
    seed = check_seed(seed)
    steps = resolve_steps(steps, default=STEPS, quick_default=QUICK_STEPS, quick=quick)
    seeds = seeds_from(seed, N_SEEDS)
    with StepBar(enabled=progress, total=steps * len(seeds), description="induction") as bar:
        trained = [_train_seed(s, steps, bar) for s in seeds]
    model, history, scores = trained[0]
    runs = [_seed_run(s, h, sc) for s, (_, h, sc) in zip(seeds, trained)]
    emergence = {curve: [run.emergence[curve] for run in runs] for curve in _CURVES}
    final, task = scores[-1], RepeatTask()
    initial_loss, final_loss = history.loss[0], history.final_loss
    return InductionResult(
        seed=seed, seeds=seeds, steps=steps, eval_every=EVAL_EVERY, task={"name": task.name, **asdict(task)},
        d_model=D_MODEL, n_heads=N_HEADS, probe_length=PROBE_LENGTH,
        thresholds={"previous_token": PREVIOUS_TOKEN, "induction": INDUCTION},
        initial_loss=initial_loss, final_loss=final_loss, loss_drop=initial_loss - final_loss,
        final_accuracy=history.final_accuracy,
        previous_token_heads=_above(final["previous_token"], PREVIOUS_TOKEN),
        induction_heads=_above(final["induction"], INDUCTION),
        best_previous_token=_best(final["previous_token"], 0), best_induction=_best(final["induction"], 1),
        fraction=FRACTION, runs=runs,
        induction_after_previous_token=Gap.of(emergence["previous_token"], emergence["induction"],
                                              resolution=EVAL_EVERY),
        loss_after_induction=Gap.of(emergence["induction"], emergence["loss"], resolution=EVAL_EVERY),
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
    """The first seed's loss and heads' detector scores over training and final scores by head, and every
    seed's curves on the scale of the one emergence rule, as PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 8), layout="constrained")
    (loss_ax, score_ax), (rule_ax, final_ax) = fig.subplots(2, 2)
    steps = result.history.steps
    loss_ax.plot(steps, result.history.loss, color="black", label="loss (second copy)")
    loss_ax.set(xlabel="step", ylabel="cross-entropy", title=f"seed {result.seed}: loss and accuracy")
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
                 title=f"seed {result.seed}: detector scores (heads' thresholds dotted)")
    score_ax.legend(fontsize="small")
    colours = {"previous_token": "tab:blue", "induction": "tab:red", "loss": "black"}
    styles = ("-", "--", ":", "-.")
    for i, run in enumerate(result.runs):
        for curve, colour in colours.items():
            values = getattr(run, curve)
            change = values[-1] - values[0]
            covered = [(v - values[0]) / change if change else 0.0 for v in values]
            rule_ax.plot(run.steps, covered, color=colour, linestyle=styles[i % len(styles)], alpha=0.8,
                         label=f"{_CURVES[curve].removeprefix('the ')}" if i == 0 else None)
    rule_ax.axhline(result.fraction, color="grey", linewidth=0.8)
    rule_ax.set(xlabel="step", ylabel="share of the curve's change from step 0",
                title=f"seeds {', '.join(map(str, result.seeds))} (line style): each curve crosses "
                      f"{result.fraction:.0%} at its step")
    rule_ax.legend(fontsize="small")
    final = result.scores[-1]
    names = ("previous_token", "duplicate_token", "induction")
    grid = [[final[name][layer][head] for name in names for head in range(result.n_heads)]
            for layer in range(len(final["induction"]))]
    image = final_ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    final_ax.set_yticks(range(len(grid)), [f"layer {i}" for i in range(len(grid))])
    final_ax.set_xticks(range(len(names) * result.n_heads),
                        [f"{n.split('_')[0][:4]} h{h}" for n in names for h in range(result.n_heads)],
                        rotation=60, fontsize="x-small")
    final_ax.set_title(f"seed {result.seed}: final scores by head")
    fig.colorbar(image, ax=final_ax, shrink=0.8)
    fig.suptitle(f"Induction heads: 2 layers × {result.n_heads} heads, d_model {result.d_model}, "
                 f"{result.steps} steps")
    return png(fig)
