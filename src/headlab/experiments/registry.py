"""The experiments by name: what ``headlab experiment NAME`` and the report run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from headlab.experiments.heads_count import plot_heads_count, run_heads_count
from headlab.experiments.heads_vs_one import plot_heads_vs_one, run_heads_vs_one
from headlab.experiments.induction import plot_induction, run_induction
from headlab.experiments.symmetry import plot_symmetry, run_symmetry
from headlab.experiments.variants import plot_variants, run_variants

__all__ = ["EXPERIMENTS", "Experiment", "ExperimentResult", "get_experiment"]


class ExperimentResult(Protocol):
    """What every experiment's result offers."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (docs/experiments.md)."""

    def table(self) -> tuple[list[str], list[list[str]]]:
        """The claims as (headers, rows) of text."""

    def sentences(self) -> list[str]:
        """The measured answer, in sentences generated from the numbers."""


@dataclass(frozen=True)
class Experiment:
    """One experiment.

    Attributes:
        name: its name on the command line.
        question: the question it settles, in words.
        run: ``run(*, seed, steps, quick, progress) -> result``.
        plot: ``plot(result) -> PNG bytes``.
    """

    name: str
    question: str
    run: Callable[..., ExperimentResult]
    plot: Callable[[Any], bytes]


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("symmetry", "What makes each head learn something different?", run_symmetry, plot_symmetry),
    Experiment("heads-vs-one", "Is 8-head attention 1-head attention with the same weights? Does the number of "
               "heads change the output?", run_heads_vs_one, plot_heads_vs_one),
    Experiment("variants", "Narrow, wide, shared, bilinear, collaborative, grouped-query, multi-query, single "
               "head: which learn what, at equal width and at equal parameters?",
               run_variants, plot_variants),
    Experiment("heads-count", "Accuracy against the number of heads, at fixed d_model and at fixed d_head "
               "(Vaswani et al. 2017, Table 3 A; Bhojanapalli et al. 2020)", run_heads_count, plot_heads_count),
    Experiment("induction", "Do heads specialise? Do a previous-token head and an induction head form in a "
               "2-layer model, in which order, and with the drop of the loss? (Olsson et al. 2022)",
               run_induction, plot_induction),
)}


def get_experiment(name: str) -> Experiment:
    """The experiment called ``name``.

    Raises:
        ValueError: no experiment has that name (the message lists the names).
    """
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; expected one of: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]
