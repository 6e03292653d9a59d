"""What the model's heads do: ``headlab.analysis.analyze`` of the report's model on its corpus
(the packaged MiniLM and the bundled corpus unless ``headlab report MODEL --text FILE`` says otherwise).

Sentences, tables and plots all come from the run; the per-head rows are linked as JSON and CSV.
The result is kept on the context (``"analysis"``) for the viewer section.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headlab.report.html import Html, escape, link
from headlab.report.section import ReportContext, Section
from headlab.report.tables import classes_table, relations_table, roles_table, to_html

__all__ = ["SECTION", "render_analysis"]


def render_analysis(result: Any, *, description: str, hrefs: Mapping[str, str]) -> Html:
    """The section's fragment for one analysis.

    Args:
        result: an ``AnalysisResult``.
        description: what ran on what, e.g. "bert model all-MiniLM-L6-v2 on 378 items of the bundled
            corpus (10,580 tokens)"; shown first, escaped.
        hrefs: file name → link target of the files ``result.write`` wrote (heads.json, heads.csv,
            heatmaps.png, mds.png and, when importance ran, pruning.png).

    Returns:
        Sentences, the tables of roles, pattern classes and dependency relations (``headlab.report.tables``,
        as ``headlab analyze`` prints them: the ``TABLE_RELATIONS`` most frequent relations, the ones the
        sentences may name), plots and skips.
    """
    summary = result.summary()
    parts = [f"<p>{escape(description)}. Definitions and thresholds: docs/analysis.md. Per-head rows: "
             f"{link(hrefs['heads.json'], 'heads.json')}, {link(hrefs['heads.csv'], 'heads.csv')}.</p>"]
    parts += [f"<p>{escape(sentence)}</p>" for sentence in result.sentences()]
    parts += [to_html(roles_table(result.roles)), to_html(classes_table(summary["class_shares"]))]
    parts.append(f'<p><img src="{escape(hrefs["heatmaps.png"])}" alt="layer by head heatmaps of each statistic" '
                 'style="max-width:100%"></p>')
    parts.append(f'<p><img src="{escape(hrefs["mds.png"])}" alt="heads placed by Jensen-Shannon distance" '
                 f'style="max-width:48%"> ')
    if "pruning.png" in hrefs:
        parts.append(f'<img src="{escape(hrefs["pruning.png"])}" alt="task metrics as heads are pruned" '
                     'style="max-width:48%">')
    parts.append("</p>")
    if result.syntax is not None:
        parts.append(to_html(relations_table(result.syntax)))
    if result.importance_spearman is not None:
        parts.append(f"<p>Spearman correlation of gradient importance with exact ablation (magnitudes): "
                     f"{result.importance_spearman:.3f}.</p>")
    if result.skipped:
        parts.append("<p>Skipped: " + escape("; ".join(f"{k}: {v}" for k, v in result.skipped.items())) + "</p>")
    return Html("".join(parts))


def render(ctx: ReportContext) -> str:
    from headlab.analysis.analyze import analyze
    from headlab.capture import load_corpus
    from headlab.report.provenance import model_name

    loaded = ctx.load_model()
    # Retrieval and streaming heads have their own section (streaming.py): not run twice.
    result = ctx.memo("analysis", lambda: analyze(loaded, ctx.text, quick=ctx.quick, streaming=False, progress=False))
    paths = result.write(ctx.assets_dir / "analysis")
    summary = result.summary()
    corpus = "the bundled corpus" if ctx.text is None else load_corpus(ctx.text).source
    description = (f"{loaded.architecture} model {model_name(loaded.source)} on {summary['items']} items of {corpus} "
                   f"({summary['tokens']} tokens){', quick budgets' if ctx.quick else ''}")
    return render_analysis(result, description=description,
                           hrefs={p.name: f"assets/analysis/{p.name}" for p in paths})


SECTION = Section(id="analysis", title="What the model's heads do: roles, patterns, similarity, importance, syntax",
                  render=render)
