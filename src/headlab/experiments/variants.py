"""Layer variants side by side: which layouts learn what, at equal width and at equal parameters?

Every preset of ``headlab.layer.presets`` (standard, slice-per-head, one projection shared by all
heads, one full W_QK per head, collaborative, grouped- and multi-query), plus a single head,
is trained as the one layer of a ``TinyTransformer`` on the synthetic tasks, over several
seeds, under two budgets:
    d_model     every variant at the same width (D_MODEL, N_HEADS heads; single-head: 1 head).
    parameters  each variant at the width (a multiple of N_HEADS) whose attention layer's
                parameter count is closest to the wide layer's at D_MODEL.
``RecallTask`` needs one relation (match a key, copy its value); ``MixTask`` needs two at the
same position at once (match a key, and read the previous position). Reported per variant,
budget and task: the layer's parameters and FLOPs (``headlab.layer.accounting``), the final
accuracy (mean ± std over seeds) and the steps to 90% accuracy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from headlab.experiments.budget import check_seed, resolve_steps, single_thread
from headlab.experiments.figures import png
from headlab.experiments.progress import StepBar
from headlab.experiments.seeds import Spread, describe_reached, mean_reached, range_bars, rank_key, seeds_from
from headlab.experiments.tasks import MixTask, RecallTask
from headlab.experiments.train import ConfigRun, train_config
from headlab.layer import AttentionConfig
from headlab.layer.accounting import account
from headlab.layer.presets import preset_config

__all__ = ["BUDGETS", "NAMES", "VariantSummary", "VariantsResult", "config_for", "plot_variants", "run_variants",
           "variant_at"]

NAMES = ("wide", "narrow", "shared", "bilinear", "collaborative", "grouped-query", "multi-query", "single-head")
BUDGETS = ("d_model", "parameters")
D_MODEL, N_HEADS, LR, N_SEEDS, TARGET_ACCURACY = 32, 8, 1e-2, 3, 0.9
STEPS, QUICK_STEPS, EVAL_EVERY = 300, 120, 20
WIDTHS = range(N_HEADS, 4 * D_MODEL + 1, N_HEADS)  # widths searched when matching the parameter count


def variant_at(name: str, *, d_model: int) -> AttentionConfig:
    """Variant ``name`` at width ``d_model`` with N_HEADS heads (single-head: 1 head of the wide layer).

    Raises:
        ValueError: an unknown variant, or one that cannot be built at this width.
    """
    if name not in NAMES:
        raise ValueError(f"unknown variant {name!r}; expected one of {', '.join(NAMES)}")
    if name == "single-head":
        return preset_config("wide", d_model=d_model, n_heads=1)
    return preset_config(name, d_model=d_model, n_heads=N_HEADS)


def config_for(name: str, budget: str) -> AttentionConfig:
    """The layer config of variant ``name`` under ``budget``.

    Raises:
        ValueError: an unknown variant or budget (the valid ones are listed).
    """
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; expected one of {', '.join(BUDGETS)}")
    if budget == "d_model":
        return variant_at(name, d_model=D_MODEL)
    target = account(variant_at("wide", d_model=D_MODEL)).total_parameters
    # The closest count; on a tie the narrower layer.
    return min((variant_at(name, d_model=d) for d in WIDTHS),
               key=lambda c: (abs(account(c).total_parameters - target), c.d_model))


@dataclass
class VariantSummary:
    """One variant under one budget on one task, over seeds.

    Attributes:
        parameters, flops: the attention layer's (FLOPs over one sequence of the task).
        accuracy: final accuracy over seeds.
        steps_to_90: per seed, the first evaluated step with accuracy ≥ 0.9, or None if never.
        mean_steps_to_90: mean over the seeds that got there, or None if none did.
    """

    variant: str
    budget: str
    task: str
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    parameters: int
    flops: int
    accuracy: Spread
    steps_to_90: list[int | None]
    mean_steps_to_90: float | None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["accuracy"] = self.accuracy.to_dict()
        return out


@dataclass
class VariantsResult:
    """The variants experiment (``--json`` schema: docs/experiments.md).

    Attributes:
        target_parameters: the wide layer's parameter count at D_MODEL (the matched budget).
        summaries: one per (task, budget, variant).
        ranking: ``"<task>/<budget>"`` → variants best first: by mean final accuracy (to 0.1%), then by
            seeds reaching 90%, then by mean steps to 90%.
        runs: every training run (a config that both budgets share is trained once).
    """

    seed: int
    steps: int
    seeds: list[int]
    tasks: list[dict[str, Any]]
    target_parameters: int
    summaries: list[VariantSummary]
    ranking: dict[str, list[str]]
    runs: list[ConfigRun]

    def summary(self, task: str, budget: str, variant: str) -> VariantSummary:
        return next(s for s in self.summaries if (s.task, s.budget, s.variant) == (task, budget, variant))

    def table(self) -> tuple[list[str], list[list[str]]]:
        """One row per (task, budget, variant), as (headers, rows) of text."""
        headers = ["task", "matched", "variant", "d_model", "heads (kv)", "d_head", "parameters", "FLOPs",
                   "accuracy", "steps to 90%"]
        rows = [[s.task, s.budget, s.variant, str(s.d_model), f"{s.n_heads} ({s.n_kv_heads})", str(s.d_head),
                 f"{s.parameters:,}", f"{s.flops:,}", str(s.accuracy), describe_reached(s.steps_to_90)]
                for s in self.summaries]
        return headers, rows

    def sentences(self) -> list[str]:
        """What the runs show, in sentences generated from the numbers."""
        out, n = [], len(self.seeds)
        for key, order in self.ranking.items():
            task, budget = key.split("/")
            rows = [self.summary(task, budget, name) for name in order]
            low, high = min(r.accuracy.mean for r in rows), max(r.accuracy.mean for r in rows)
            if f"{low:.1%}" == f"{high:.1%}":
                text = f"every variant ended at {low:.1%} accuracy"
            elif high - low < 0.01:
                text = f"every variant ended between {low:.1%} and {high:.1%} accuracy"
            else:
                text = (f"{rows[0].variant} ended highest ({rows[0].accuracy}) and {rows[-1].variant} lowest "
                        f"({rows[-1].accuracy}, {rows[-1].parameters:,} parameters)")
            every = [r for r in rows if None not in r.steps_to_90]
            text += "; " + _speed(every)
            some = [f"{r.variant} ({sum(s is not None for s in r.steps_to_90)}/{n})" for r in rows
                    if r not in every and r.mean_steps_to_90 is not None]
            never = [r.variant for r in rows if r.mean_steps_to_90 is None]
            if some:
                text += f"; {TARGET_ACCURACY:.0%} reached by some seeds only: {', '.join(some)}"
            if never:
                text += f"; never reaching {TARGET_ACCURACY:.0%}: {', '.join(never)}"
            out.append(f"On {task}, at matched {budget} ({n} seeds, {self.steps} steps), {text}.")
        for task in (t["name"] for t in self.tasks):
            wide, single = self.summary(task, "d_model", "wide"), self.summary(task, "d_model", "single-head")
            gap = wide.accuracy.mean - single.accuracy.mean
            spread = wide.accuracy.std + single.accuracy.std
            verdict = ("above" if gap > spread else "below" if -gap > spread else "within the seeds' spread of")
            out.append(f"On {task}, {N_HEADS} wide heads ({wide.accuracy}) ended {verdict} single-head, one head "
                       f"of the same width and parameter count ({single.accuracy}).")
        return out

    def to_dict(self) -> dict[str, Any]:
        out = {"experiment": "variants"} | {k: v for k, v in asdict(self).items() if k not in ("summaries", "runs")}
        out["summaries"] = [s.to_dict() for s in self.summaries]
        out["runs"] = [r.to_dict() for r in self.runs]
        return out


def _speed(every: list[VariantSummary]) -> str:
    """Who reached the target accuracy first, among the variants for which every seed reached it."""
    target = f"{TARGET_ACCURACY:.0%} with every seed"
    steps = {r.variant: f"{r.mean_steps_to_90 or 0.0:.0f}" for r in every}  # a number: every seed got there
    if not steps:
        return f"no variant reached {target}"
    if len(steps) == 1:
        (variant, step), = steps.items()
        return f"only {variant} reached {target} (step {step} on average)"
    low, high = min(steps.values(), key=int), max(steps.values(), key=int)
    if low == high:
        return f"{_names(list(steps))} reached {target}, all at step {low} on average"
    first, last = ([v for v, s in steps.items() if s == at] for at in (low, high))
    return (f"of the {len(steps)} reaching {target}, {_names(first)} got there first (step {low} on average) and "
            f"{_names(last)} last ({high})")


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _summarise(name: str, budget: str, config: AttentionConfig, runs: list[ConfigRun]) -> VariantSummary:
    reached = [r.history.steps_to(TARGET_ACCURACY) for r in runs]
    return VariantSummary(
        variant=name, budget=budget, task=runs[0].task, d_model=config.d_model, n_heads=config.n_heads,
        n_kv_heads=config.n_kv_heads, d_head=config.d_head, parameters=runs[0].parameters, flops=runs[0].flops,
        accuracy=Spread.of([r.final_accuracy for r in runs]), steps_to_90=reached,
        mean_steps_to_90=mean_reached(reached),
    )


@single_thread()
def run_variants(*, seed: int = 0, steps: int | None = None, quick: bool = False,
                 progress: bool = False) -> VariantsResult:
    """Train every variant under both budgets on the tasks, over 3 seeds.

    Args:
        seed: the first of the 3 consecutive seeds (each seeds the weights and the data).
        steps: optimiser steps per run (default 300; 120 with ``quick``).
        quick: the small version: the mix task only.
        progress: show a progress bar on stderr.

    Returns:
        A ``VariantsResult``.

    Raises:
        ValueError: a bad seed or number of steps.
    """
    seed = check_seed(seed)
    steps = resolve_steps(steps, default=STEPS, quick_default=QUICK_STEPS, quick=quick)
    seeds = seeds_from(seed, N_SEEDS)
    tasks: list[MixTask | RecallTask] = [MixTask()] if quick else [RecallTask(), MixTask()]
    configs = {(budget, name): config_for(name, budget) for budget in BUDGETS for name in NAMES}
    unique: dict[AttentionConfig, str] = {}  # a config two budgets share (e.g. wide) is trained once
    for (_, name), config in configs.items():
        unique.setdefault(config, name)
    summaries, runs = [], []
    with StepBar(enabled=progress, total=len(tasks) * len(unique) * len(seeds) * steps, description="variants") as bar:
        for task in tasks:
            trained = {config: [train_config(task, config, label=name, seed=s, steps=steps, lr=LR,
                                             eval_every=EVAL_EVERY, bar=bar) for s in seeds]
                       for config, name in unique.items()}
            runs += [run for group in trained.values() for run in group]
            summaries += [_summarise(name, budget, config, trained[config])
                          for (budget, name), config in configs.items()]
    ranking = {}
    for task in tasks:
        for budget in BUDGETS:
            rows = [s for s in summaries if (s.task, s.budget) == (task.name, budget)]
            ranking[f"{task.name}/{budget}"] = [
                s.variant for s in sorted(rows, key=lambda s: rank_key(s.accuracy, s.steps_to_90))]
    return VariantsResult(
        seed=seed, steps=steps, seeds=seeds, tasks=[{"name": t.name, **asdict(t)} for t in tasks],
        target_parameters=account(variant_at("wide", d_model=D_MODEL)).total_parameters, summaries=summaries,
        ranking=ranking, runs=runs,
    )


def plot_variants(result: VariantsResult) -> bytes:
    """Final accuracy (mean, and the range over seeds) and steps to 90% by variant, one column per task, both
    budgets, as PNG bytes."""
    from matplotlib.figure import Figure

    tasks = [t["name"] for t in result.tasks]
    fig = Figure(figsize=(max(7.0, 5.5 * len(tasks)), 7.5), layout="constrained")
    axes = fig.subplots(2, len(tasks), squeeze=False)
    width = 0.4
    for column, task in enumerate(tasks):
        acc_ax, steps_ax = axes[0][column], axes[1][column]
        for i, budget in enumerate(BUDGETS):
            rows = [result.summary(task, budget, name) for name in NAMES]
            xs = [j + (i - 0.5) * width for j in range(len(NAMES))]
            acc_ax.bar(xs, [r.accuracy.mean for r in rows], width, yerr=range_bars([r.accuracy for r in rows]),
                       capsize=3, label=f"matched {budget}")
            steps = [r.mean_steps_to_90 or 0.0 for r in rows]
            bars = steps_ax.bar(xs, steps, width, label=f"matched {budget}")
            for bar, r in zip(bars, rows):
                got = sum(s is not None for s in r.steps_to_90)
                if got < len(r.steps_to_90):  # never, or not with every seed: say how many got there
                    steps_ax.annotate(f"{got}/{len(r.steps_to_90)}", (bar.get_x() + bar.get_width() / 2,
                                      bar.get_height()), ha="center", fontsize="x-small", xytext=(0, 2),
                                      textcoords="offset points")
        acc_ax.set(ylim=(0, 1.25), yticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0],
                   title=f"task: {task} (bars: lowest to highest seed)",
                   ylabel=f"final accuracy, mean of {len(result.seeds)} seeds")
        acc_ax.axhline(TARGET_ACCURACY, color="grey", linewidth=0.8, linestyle=":")
        steps_ax.set_ylim(0, 1.25 * max([s.mean_steps_to_90 or 0.0 for s in result.summaries] + [1.0]))
        steps_ax.set(ylabel="step reaching 90% (mean over seeds that did)",
                     title=f"speed (k/{len(result.seeds)}: seeds that reached 90%, if not all)")
        for ax in (acc_ax, steps_ax):
            ax.set_xticks(range(len(NAMES)), NAMES, rotation=35, ha="right")
            ax.grid(True, axis="y", alpha=0.3)
            ax.legend(fontsize="small", loc="upper right", ncols=2)
    fig.suptitle(f"Variants after {result.steps} steps, seeds {result.seeds[0]}–{result.seeds[-1]}\n"
                 f"(matched: d_model {D_MODEL}, or {result.target_parameters:,} attention parameters)")
    return png(fig)
