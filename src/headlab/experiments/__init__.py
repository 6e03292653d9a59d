"""Small, seeded, CPU-sized experiments that settle questions about heads with measured numbers.

    tasks.py         synthetic tasks: multi-query associative recall, match-key + copy-previous, repeated spans
    model.py         TinyTransformer: attention-only, headlab layers; build_model from a seed
    train.py         the seeded Adam loop, History, train_config (one config, one task, one seed)
    symmetry.py      what makes heads differ: identical heads stay identical; random and noisy ones diverge
    heads_vs_one.py  the same weights as 8 heads and as 1 head, over the logit scale
    variants.py      every layer variant trained side by side at matched d_model and parameters
    heads_count.py   accuracy against the number of heads at fixed d_model and fixed d_head
    induction.py     a previous-token head and an induction head forming in a 2-layer model, over seeds
    seeds.py         repeats over seeds: spreads, steps reaching a target, order beyond noise
    registry.py      EXPERIMENTS: name → run and plot

Each ``run_<name>(*, seed, steps, quick, progress)`` returns a result dataclass with ``to_dict()``,
``table()`` and ``sentences()``; each ``plot_<name>(result)`` returns PNG bytes.
"""

from headlab.experiments.heads_count import HeadsCountResult, plot_heads_count, run_heads_count
from headlab.experiments.heads_vs_one import HeadsVsOneResult, plot_heads_vs_one, run_heads_vs_one
from headlab.experiments.induction import InductionResult, plot_induction, run_induction
from headlab.experiments.registry import EXPERIMENTS, Experiment, get_experiment
from headlab.experiments.symmetry import SymmetryResult, plot_symmetry, run_symmetry
from headlab.experiments.variants import VariantsResult, plot_variants, run_variants

__all__ = [
    "EXPERIMENTS", "Experiment", "HeadsCountResult", "HeadsVsOneResult", "InductionResult", "SymmetryResult",
    "VariantsResult", "get_experiment", "plot_heads_count", "plot_heads_vs_one", "plot_induction",
    "plot_symmetry", "plot_variants", "run_heads_count", "run_heads_vs_one", "run_induction", "run_symmetry",
    "run_variants",
]
