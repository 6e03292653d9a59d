"""How many heads? Vaswani et al. 2017, Table 3 (A), in miniature, and Bhojanapalli et al. 2020.

The one wide layer of a ``TinyTransformer`` is trained on ``MixTask`` (two relations at once)
with 1 to 16 heads, over several seeds, two ways:
    d_model  d_model fixed at D_MODEL, d_head = d_model / n_heads: the heads split one budget,
             so more heads means narrower heads (Vaswani et al.: too few and too many both hurt).
    d_head   d_head fixed at D_HEAD whatever the number of heads: the layer grows with the heads,
             and no head is squeezed below D_HEAD (Bhojanapalli et al.'s fix for the low-rank
             bottleneck of narrow heads).
Reported per setting and number of heads: the layer's parameters and FLOPs, the final accuracy
(mean ± std over seeds) and the steps to 90% accuracy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from headlab.experiments.budget import check_seed, resolve_steps, single_thread
from headlab.experiments.figures import png
from headlab.experiments.progress import StepBar
from headlab.experiments.seeds import Spread, describe_reached, mean_reached, range_bars, rank_key, seeds_from
from headlab.experiments.tasks import MixTask
from headlab.experiments.train import ConfigRun, train_config
from headlab.layer import AttentionConfig

__all__ = ["HEADS", "SETTINGS", "HeadsCountResult", "HeadsCountRow", "config_for", "plot_heads_count",
           "run_heads_count"]

HEADS = (1, 2, 4, 8, 16)
SETTINGS = ("d_model", "d_head")
D_MODEL, D_HEAD, LR, N_SEEDS, TARGET_ACCURACY = 32, 8, 1e-2, 3, 0.9
STEPS, QUICK_STEPS, EVAL_EVERY = 300, 100, 20


def config_for(setting: str, n_heads: int) -> AttentionConfig:
    """The layer with ``n_heads`` heads under ``setting`` (``"d_model"`` or ``"d_head"`` fixed).

    Raises:
        ValueError: an unknown setting, or n_heads that does not divide D_MODEL in the d_model setting.
    """
    if setting == "d_model":
        return AttentionConfig(d_model=D_MODEL, n_heads=n_heads)
    if setting == "d_head":
        return AttentionConfig(d_model=D_MODEL, n_heads=n_heads, d_head=D_HEAD)
    raise ValueError(f"unknown setting {setting!r}; expected one of {', '.join(SETTINGS)}")


@dataclass
class HeadsCountRow:
    """One number of heads under one setting, over seeds.

    Attributes:
        parameters, flops: the attention layer's (``headlab.layer.accounting``; FLOPs over one sequence).
        accuracy: final accuracy over seeds.
        steps_to_90: per seed, the first evaluated step with accuracy ≥ 0.9, or None if never.
    """

    setting: str
    n_heads: int
    d_head: int
    parameters: int
    flops: int
    accuracy: Spread
    steps_to_90: list[int | None]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accuracy"] = self.accuracy.to_dict()
        return out


@dataclass
class HeadsCountResult:
    """The heads-count experiment (``--json`` schema: docs/experiments.md).

    Attributes:
        rows: one per (setting, n_heads), heads ascending within a setting.
        best_heads: setting → the best number of heads: by mean final accuracy (to 0.1%), then by seeds
            reaching 90%, then by mean steps to 90%.
        runs: every training run.
    """

    seed: int
    steps: int
    seeds: list[int]
    task: dict[str, Any]
    d_model: int
    d_head: int
    rows: list[HeadsCountRow]
    best_heads: dict[str, int]
    runs: list[ConfigRun]

    def row(self, setting: str, n_heads: int) -> HeadsCountRow:
        return next(r for r in self.rows if (r.setting, r.n_heads) == (setting, n_heads))

    def table(self) -> tuple[list[str], list[list[str]]]:
        """One row per (setting, n_heads), as (headers, rows) of text."""
        headers = ["fixed", "heads", "d_head", "parameters", "FLOPs", "accuracy", "steps to 90%"]
        return headers, [[r.setting, str(r.n_heads), str(r.d_head), f"{r.parameters:,}", f"{r.flops:,}",
                          str(r.accuracy), describe_reached(r.steps_to_90)] for r in self.rows]

    def sentences(self) -> list[str]:
        """What the runs show, in sentences generated from the numbers."""
        out = []
        for setting in SETTINGS:
            rows = [self.row(setting, h) for h in HEADS]
            best = self.row(setting, self.best_heads[setting])
            listed = "; ".join(f"{r.n_heads}: {r.accuracy.mean:.0%}, " + (
                "never 90%" if r.steps_to_90.count(None) == len(r.steps_to_90)
                else f"90% at step {describe_reached(r.steps_to_90)}") for r in rows)
            size = (f"d_model = {self.d_model} (d_head from {rows[0].d_head} down to {rows[-1].d_head})"
                    if setting == "d_model" else
                    f"d_head = {self.d_head} (parameters from {rows[0].parameters:,} to {rows[-1].parameters:,})")
            out.append(f"With {size}, by number of heads, mean final accuracy and the step reaching 90% (mean "
                       f"over the seeds that did, and how many) were: {listed}. Best, by accuracy and then speed: "
                       f"{best.n_heads} heads "
                       f"({best.accuracy}, {len(self.seeds)} seeds, {self.steps} steps).")
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {"experiment": "heads-count"} | {k: v for k, v in asdict(self).items() if k not in ("rows", "runs")}
        out["rows"] = [r.to_dict() for r in self.rows]
        out["runs"] = [r.to_dict() for r in self.runs]
        return out


@single_thread()
def run_heads_count(*, seed: int = 0, steps: int | None = None, quick: bool = False,
                    progress: bool = False) -> HeadsCountResult:
    """Train the layer with 1, 2, 4, 8 and 16 heads at fixed d_model and at fixed d_head, over 3 seeds.

    Args:
        seed: the first of the 3 consecutive seeds (each seeds the weights and the data).
        steps: optimiser steps per run (default 300; 100 with ``quick``).
        quick: the small version.
        progress: show a progress bar on stderr.

    Returns:
        A ``HeadsCountResult``.

    Raises:
        ValueError: a bad seed or number of steps.
    """
    seed = check_seed(seed)
    steps = resolve_steps(steps, default=STEPS, quick_default=QUICK_STEPS, quick=quick)
    seeds, task = seeds_from(seed, N_SEEDS), MixTask()
    rows, runs = [], []
    with StepBar(enabled=progress, total=len(SETTINGS) * len(HEADS) * len(seeds) * steps,
                 description="heads-count") as bar:
        for setting in SETTINGS:
            for n_heads in HEADS:
                config = config_for(setting, n_heads)
                group = [train_config(task, config, label=f"{n_heads} heads (fixed {setting})", seed=s, steps=steps,
                                      lr=LR, eval_every=EVAL_EVERY, bar=bar) for s in seeds]
                runs += group
                rows.append(HeadsCountRow(
                    setting=setting, n_heads=n_heads, d_head=config.d_head, parameters=group[0].parameters,
                    flops=group[0].flops, accuracy=Spread.of([r.final_accuracy for r in group]),
                    steps_to_90=[r.history.steps_to(TARGET_ACCURACY) for r in group]))
    best = {s: min((r for r in rows if r.setting == s), key=lambda r: rank_key(r.accuracy, r.steps_to_90)).n_heads
            for s in SETTINGS}
    return HeadsCountResult(seed=seed, steps=steps, seeds=seeds, task={"name": task.name, **asdict(task)},
                            d_model=D_MODEL, d_head=D_HEAD, rows=rows, best_heads=best, runs=runs)


def plot_heads_count(result: HeadsCountResult) -> bytes:
    """Final accuracy (mean, and the range over seeds) and steps to 90% against the number of heads, one line
    per setting, as PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    acc_ax, steps_ax = fig.subplots(1, 2)
    labels = {"d_model": f"d_model = {result.d_model} fixed (d_head = d_model / h)",
              "d_head": f"d_head = {result.d_head} fixed (width h · d_head)"}
    never: dict[str, list[str]] = {}  # setting → the numbers of heads with which no seed reached the target
    for setting in SETTINGS:
        rows = [result.row(setting, h) for h in HEADS]
        line = acc_ax.errorbar(HEADS, [r.accuracy.mean for r in rows], yerr=range_bars([r.accuracy for r in rows]),
                               marker="o", capsize=3, label=labels[setting])
        reached = [(r.n_heads, mean_reached(r.steps_to_90), r) for r in rows if mean_reached(r.steps_to_90)]
        missed = [str(r.n_heads) for r in rows if mean_reached(r.steps_to_90) is None]
        if missed:
            never[setting] = missed
        if reached:
            steps_ax.plot([h for h, _, _ in reached], [m for _, m, _ in reached], marker="o",
                          color=line.lines[0].get_color(), label=labels[setting])
        for h, m, r in reached:
            got = sum(s is not None for s in r.steps_to_90)
            if got < len(r.steps_to_90):  # some seeds never got there: say how many did
                steps_ax.annotate(f"{got}/{len(r.steps_to_90)}", (h, m), fontsize="x-small",
                                  xytext=(3, 3), textcoords="offset points")
    acc_ax.set(ylabel=f"final accuracy, mean of {len(result.seeds)} seeds", ylim=(0, 1.05),
               title="final accuracy (bars: lowest to highest seed)")
    acc_ax.axhline(TARGET_ACCURACY, color="grey", linewidth=0.8, linestyle=":")
    steps_ax.set_ylim(0, 1.15 * max([mean_reached(r.steps_to_90) or 0.0 for r in result.rows] + [1.0]))
    steps_ax.set(ylabel="step reaching 90% (mean over seeds that did)",
                 title=f"speed: the step reaching {TARGET_ACCURACY:.0%} accuracy")
    if sum(map(len, never.values())) == len(result.rows):
        steps_ax.text(0.5, 0.5, f"no seed reached {TARGET_ACCURACY:.0%} accuracy\nwithin {result.steps} steps, "
                      "with any number of heads", transform=steps_ax.transAxes, ha="center", va="center")
    elif never:
        steps_ax.text(0.02, 0.02, f"no seed reached {TARGET_ACCURACY:.0%} with these numbers of heads:\n"
                      + "\n".join(f"fixed {setting}: {', '.join(heads)}" for setting, heads in never.items()),
                      transform=steps_ax.transAxes, fontsize="x-small")
    for ax in (acc_ax, steps_ax):
        ax.set_xscale("log", base=2)
        ax.set_xlim(HEADS[0] / 1.3, HEADS[-1] * 1.3)  # also when no seed reached 90% (an empty panel)
        ax.set_xticks(HEADS, [str(h) for h in HEADS])
        ax.set_xlabel("number of heads")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(f"task {result.task['name']}, {result.steps} steps, seeds {result.seeds[0]}–{result.seeds[-1]}")
    return png(fig)
