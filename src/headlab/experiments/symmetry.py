"""What makes each head learn something different? Symmetry, and what breaks it.

Axis legend:
    head parameters  (n_heads, n_params_per_head)   W_Q[h], W_K[h], W_V[h], W_O[h], b_Q[h], b_K[h], b_V[h]
    pattern          (batch, head, query_pos, key_pos)

One small model (one wide layer) is trained three times on ``MixTask``, with the same data:
    identical  every head starts as a copy of head 0. The loss is symmetric under permuting
               heads, so each head gets the same gradient, and Adam (element-wise) makes the
               same update: the heads stay copies for ever, and the layer is one head repeated.
    random     the standard random initialisation: the heads start apart and stay apart.
    noisy      identical, plus Gaussian noise of std ``noise`` on every head's weights: the
               symmetric point is unstable, and the small differences grow.
Recorded at every evaluation: the largest element-wise difference between any head's
parameters and head 0's, the smallest relative distance between two heads' parameters, the
mean distance (total variation) between two heads' patterns, and the accuracy.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
from torch import Tensor

from headlab.experiments.budget import check_seed, resolve_steps, single_thread
from headlab.experiments.figures import png
from headlab.experiments.model import TinyTransformer, build_model
from headlab.experiments.progress import StepBar
from headlab.experiments.tasks import MixTask
from headlab.experiments.train import EVAL_SEED_OFFSET, History, train
from headlab.layer import AttentionConfig, MultiHeadAttention

__all__ = ["INITS", "SymmetryResult", "SymmetryRun", "head_parameters", "plot_symmetry", "run_symmetry",
           "tie_heads"]

INITS = ("identical", "random", "noisy")
D_MODEL, N_HEADS, NOISE, LR = 32, 4, 1e-3, 1e-2
STEPS, QUICK_STEPS, EVAL_EVERY, QUICK_EVAL_EVERY = 400, 150, 20, 10


def _views(layer: MultiHeadAttention) -> list[Tensor]:
    """Per-head views of every parameter a head owns, head axis first (biases where present)."""
    views = [layer.W_Q, layer.W_K, layer.W_V, layer.W_O]
    return views + [b for b in (layer.b_Q, layer.b_K, layer.b_V) if b is not None]


def head_parameters(layer: MultiHeadAttention) -> Tensor:
    """``(n_heads, n_params_per_head)``: each head's own parameters, flattened (a copy).

    Raises:
        ValueError: the layer shares key/value heads (each head must own its weights).
    """
    if layer.config.n_kv_heads != layer.config.n_heads or layer.config.projection != "wide":
        raise ValueError(f"head_parameters needs a wide layer with one key/value head per head; got {layer.config}")
    return torch.cat([v.detach().reshape(layer.config.n_heads, -1) for v in _views(layer)], dim=1)


@torch.no_grad()
def tie_heads(layer: MultiHeadAttention, *, noise: float = 0.0, generator: torch.Generator | None = None) -> None:
    """Make every head a copy of head 0 (in place), then add Gaussian noise of std ``noise`` to each.

    Raises:
        ValueError: as ``head_parameters``, or a negative noise.
    """
    head_parameters(layer)  # refuses layers whose heads do not own their weights
    if not noise >= 0:
        raise ValueError(f"noise={noise!r} must be ≥ 0")
    for view in _views(layer):
        view[1:] = view[0]
        if noise:
            view.add_(torch.randn(view.shape, generator=generator, dtype=view.dtype) * noise)


def _pattern_distance(patterns: Tensor) -> Tensor:
    """``(n_heads, n_heads)`` mean total variation distance between heads' patterns, in [0, 1]."""
    n = patterns.shape[1]
    out = torch.zeros(n, n, dtype=torch.float64)
    for i, j in itertools.combinations(range(n), 2):
        d = 0.5 * (patterns[:, i] - patterns[:, j]).abs().sum(-1).double().mean()
        out[i, j] = out[j, i] = d
    return out


@dataclass
class SymmetryRun:
    """One initialisation's training run.

    Attributes:
        init: ``"identical"``, ``"random"`` or ``"noisy"``.
        history: loss and accuracy at each evaluated step.
        head_difference: max |θ_h − θ_0| over heads and parameters, at each evaluated step.
        pattern_difference: max |pattern_h − pattern_0| over heads and positions of the probe batch.
        min_pairwise_distance: min over head pairs of ‖θ_i − θ_j‖ / rms_h ‖θ_h‖, at each step.
        mean_pattern_distance: mean over head pairs of their patterns' mean total variation distance.
    """

    init: str
    history: History
    head_difference: list[float] = field(default_factory=list)
    pattern_difference: list[float] = field(default_factory=list)
    min_pairwise_distance: list[float] = field(default_factory=list)
    mean_pattern_distance: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SymmetryResult:
    """The symmetry experiment's claims and runs (``--json`` schema: docs/experiments.md).

    Attributes:
        identical_max_head_difference: the largest head difference over the whole identical run
            (0, or float rounding: gradient descent cannot break the symmetry).
        identical_max_pattern_difference: the largest element-wise difference between any two
            heads' patterns on the evaluation batch over the identical run.
        random_min_pairwise_distance: at the end of the random run, the closest two heads' distance.
        noise_initial_difference, noise_final_difference: the noisy run's head difference at
            step 0 and at the end; noise_growth is their ratio.
        final_accuracy: init → accuracy at the end.
    """

    seed: int
    steps: int
    d_model: int
    n_heads: int
    noise: float
    task: dict[str, Any]
    identical_max_head_difference: float
    identical_max_pattern_difference: float
    random_min_pairwise_distance: float
    noise_initial_difference: float
    noise_final_difference: float
    noise_growth: float
    final_accuracy: dict[str, float]
    runs: list[SymmetryRun]

    def run(self, init: str) -> SymmetryRun:
        return next(r for r in self.runs if r.init == init)

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The claims as (headers, rows) of text."""
        acc = self.final_accuracy
        return ["claim", "value"], [
            ["identical init: max |head h − head 0| over the run", f"{self.identical_max_head_difference:.3g}"],
            ["identical init: max pattern difference between heads", f"{self.identical_max_pattern_difference:.3g}"],
            ["random init: closest two heads at the end (relative distance)",
             f"{self.random_min_pairwise_distance:.3f}"],
            [f"noise {self.noise:g}: head difference start → end",
             f"{self.noise_initial_difference:.2e} → {self.noise_final_difference:.3g} (×{self.noise_growth:.3g})"],
            ["final accuracy: identical / random / noisy",
             f"{acc['identical']:.3f} / {acc['random']:.3f} / {acc['noisy']:.3f}"],
        ]

    def sentences(self) -> list[str]:
        """The measured answer (what makes each head learn something different?), in sentences generated from
        the numbers."""
        acc, diff, random = self.final_accuracy, self.identical_max_head_difference, self.run("random")
        if diff == 0:
            stayed = "exactly equal"
        elif diff <= 1e-6:
            stayed = f"equal up to {diff:.1e} (float rounding)"
        else:
            stayed = f"up to {diff:.1e} apart: the symmetry did not hold to float rounding"
        grew = (f"grew from {self.noise_initial_difference:.1e} to {self.noise_final_difference:.2g} "
                f"(×{self.noise_growth:.0f})" if self.noise_growth > 1 else
                f"did not grow ({self.noise_initial_difference:.1e} to {self.noise_final_difference:.1e})")
        first = (f"Initialised as copies of head 0, the {self.n_heads} heads were still {stayed} after {self.steps} "
                 f"steps, and their patterns differed by at most {self.identical_max_pattern_difference:.1e}")
        if diff <= 1e-6:
            first += (": permuting heads leaves the loss unchanged, so identical heads get identical gradients and "
                      f"identical Adam updates. The layer stayed one head repeated {self.n_heads} times")
        return [
            first + f", and reached {acc['identical']:.0%} accuracy on the {self.task['name']} task.",
            f"From the standard random initialisation the closest two heads were at a relative distance of "
            f"{random.min_pairwise_distance[0]:.2f} at the start and {self.random_min_pairwise_distance:.2f} at the "
            f"end, and the model reached {acc['random']:.0%}.",
            f"Noise of std {self.noise:g} on the identical heads "
            + ("breaks the symmetry: " if self.noise_growth > 1 else "did not break the symmetry here: ")
            + f"the largest head difference {grew}, and the model reached {acc['noisy']:.0%}.",
        ]

    def to_dict(self) -> dict[str, Any]:
        return {"experiment": "symmetry"} | asdict(self)


@single_thread()
def run_symmetry(*, seed: int = 0, steps: int | None = None, quick: bool = False,
                 progress: bool = False) -> SymmetryResult:
    """Train the same model from identical, random and slightly perturbed identical heads.

    Args:
        seed: seeds the initial weights, the noise, the training and the evaluation batches.
        steps: optimiser steps per run (default 400; 150 with ``quick``).
        quick: the small version.
        progress: show a progress bar on stderr.

    Returns:
        A ``SymmetryResult``.

    Raises:
        ValueError: a bad seed or number of steps.
    """
    seed = check_seed(seed)
    steps = resolve_steps(steps, default=STEPS, quick_default=QUICK_STEPS, quick=quick)
    task = MixTask()
    config = AttentionConfig(d_model=D_MODEL, n_heads=N_HEADS)
    probe = task.sample(64, generator=torch.Generator().manual_seed(seed + EVAL_SEED_OFFSET))
    runs = []
    with StepBar(enabled=progress, total=steps * len(INITS), description="symmetry") as bar:
        for init in INITS:
            model = build_model(task, [config], seed=seed)
            if init != "random":
                tie_heads(cast(MultiHeadAttention, model.attention[0]), noise=NOISE if init == "noisy" else 0.0,
                          generator=torch.Generator().manual_seed(seed))
            record = SymmetryRun(init=init, history=History())

            def measure(step: int, m: TinyTransformer, record: SymmetryRun = record) -> None:
                theta = head_parameters(cast(MultiHeadAttention, m.attention[0])).double()
                record.head_difference.append(float((theta - theta[0]).abs().max()))
                scale = theta.norm(dim=1).pow(2).mean().sqrt()
                distance = torch.cdist(theta, theta) / scale
                record.min_pairwise_distance.append(float(distance[~torch.eye(len(theta), dtype=torch.bool)].min()))
                with torch.no_grad():
                    patterns = m(probe.inputs, return_pattern=True).pattern[0]
                tv = _pattern_distance(patterns)
                record.mean_pattern_distance.append(float(tv[~torch.eye(len(tv), dtype=torch.bool)].mean()))
                record.pattern_difference.append(float((patterns - patterns[:, :1]).abs().max()))

            record.history = train(model, task, steps=steps, seed=seed, lr=LR,
                                   eval_every=QUICK_EVAL_EVERY if quick else EVAL_EVERY,
                                   on_eval=measure, bar=bar, run=init)
            runs.append(record)
    identical, random, noisy = runs
    initial, final = noisy.head_difference[0], noisy.head_difference[-1]
    return SymmetryResult(
        seed=seed, steps=steps, d_model=D_MODEL, n_heads=N_HEADS, noise=NOISE,
        task={"name": task.name, **asdict(task)},
        identical_max_head_difference=max(identical.head_difference),
        identical_max_pattern_difference=max(identical.pattern_difference),
        random_min_pairwise_distance=random.min_pairwise_distance[-1],
        noise_initial_difference=initial, noise_final_difference=final,
        noise_growth=final / initial if initial > 0 else math.inf,
        final_accuracy={r.init: r.history.final_accuracy for r in runs}, runs=runs,
    )


def plot_symmetry(result: SymmetryResult) -> bytes:
    """Head difference, pattern distance between heads and accuracy over training, as PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 3.8), layout="constrained")
    axes = fig.subplots(1, 3)
    floor = 1e-12  # a log axis cannot show an exact 0: draw it on the floor and say so
    for run in result.runs:
        steps = run.history.steps
        axes[0].plot(steps, [max(d, floor) for d in run.head_difference], label=run.init)
        axes[1].plot(steps, run.mean_pattern_distance, label=run.init)
        axes[2].plot(steps, run.history.accuracy, label=run.init)
    axes[0].set_yscale("log")
    axes[0].axhline(floor, color="grey", linewidth=0.8, linestyle=":")
    axes[0].set_title(f"max |head h − head 0| (exact 0 drawn at {floor:g})", fontsize="medium")
    axes[1].set_title("pattern distance between heads (mean TV)", fontsize="medium")
    axes[2].set_title("accuracy", fontsize="medium")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"{result.n_heads} heads, d_model {result.d_model}, task {result.task['name']}, "
                 f"noise std {result.noise:g}, seed {result.seed}")
    return png(fig)
