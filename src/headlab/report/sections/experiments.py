"""The experiments of ``headlab experiment``, one section each: measured answers to questions about heads.

Each section runs its experiment with the report's seed (the small version when the report is
quick), writes the result as JSON and the plot as PNG, and states the answer in sentences
generated from the numbers (the result's own ``sentences()``), above its table of claims.
The report owner adds :data:`SECTIONS` to the page.
"""

from __future__ import annotations

import json

from headlab.report.html import Html, code, escape, link, table
from headlab.report.section import ReportContext, Section

__all__ = ["HEADS_COUNT", "HEADS_VS_ONE", "INDUCTION", "SECTIONS", "SYMMETRY", "VARIANTS", "render_experiment"]


def render_experiment(name: str, ctx: ReportContext) -> Html:
    """Run experiment ``name`` for the report and return its fragment.

    Writes ``experiments/<name>.json`` and ``assets/experiments/<name>.png`` through ``ctx``.

    Raises:
        ValueError: an unknown experiment name.
    """
    from headlab.experiments import get_experiment  # heavy (torch); only when the section renders

    experiment = get_experiment(name)
    # kept for the sections that read the same run (the circuits of the induction experiment's model)
    result = ctx.memo(f"experiment:{name}", lambda: experiment.run(seed=ctx.seed, quick=ctx.quick))
    json_href = ctx.write_file(f"experiments/{name}.json",
                               json.dumps(result.to_dict(), indent=2, allow_nan=False) + "\n")
    plot_href = ctx.write_file(f"assets/experiments/{name}.png", experiment.plot(result))
    headers, rows = result.table()
    command = f"headlab experiment {name} --seed {ctx.seed}" + (" --quick" if ctx.quick else "")
    parts = [f"<p><strong>{escape(experiment.question)}</strong></p>"]
    parts += [f"<p>{escape(sentence)}</p>" for sentence in result.sentences()]
    parts.append(f'<p><img src="{escape(plot_href)}" alt="{escape(name)} experiment: plot of the measured '
                 f'quantities" style="max-width:100%"></p>')
    parts.append(table(headers, rows))
    parts.append(f'<p class="note">Measured by this run ({"quick version" if ctx.quick else "full version"}, '
                 f"seed {escape(ctx.seed)}); the same numbers: {code(command)}. Everything as JSON: "
                 f"{link(json_href, json_href)} (schema: docs/experiments.md).</p>")
    return Html("".join(parts))


def _section(name: str, title: str) -> Section:
    return Section(id=f"experiment-{name}", title=title, render=lambda ctx: render_experiment(name, ctx))


SYMMETRY = _section("symmetry", "Experiment: heads trained from identical, nearly identical and random starts")
HEADS_VS_ONE = _section("heads-vs-one", "Experiment: the same weights read as 8 heads and as 1 head")
VARIANTS = _section("variants", "Experiment: layer variants trained side by side")
HEADS_COUNT = _section("heads-count", "Experiment: accuracy against the number of heads")
INDUCTION = _section("induction", "Experiment: a 2-layer model learns to repeat spans; its heads read as it trains")
SECTIONS: tuple[Section, ...] = (SYMMETRY, HEADS_VS_ONE, VARIANTS, HEADS_COUNT, INDUCTION)
