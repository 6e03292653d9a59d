"""Where attention lands and what it carries: raw vs value-weighted attention on the sink tokens
(Kobayashi et al. 2020) and the sink share by query position (Xiao et al. 2023), on the report's model
over its corpus.

One capture pass (patterns and v) feeds ``headlab.analysis.norms.ValueWeighted`` and
``headlab.analysis.sinks.SinkShare``; the sentences, tables and plots all read their results.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headlab.report.html import Html, escape
from headlab.report.section import ReportContext, Section
from headlab.report.tables import TOP_HEADS, sinks_table, to_html

if TYPE_CHECKING:
    from torch import nn

    from headlab.models import HeadedModel

__all__ = ["PLOTS", "SECTION", "SinkReport", "measure", "render", "render_sinks"]

PLOTS = {"value_weighted": "assets/sinks/value-weighted.png", "by_position": "assets/sinks/by-position.png"}
QUICK_ITEMS = 60  # corpus items with ctx.quick
TABLE_HEADS = TOP_HEADS  # heads in the table, by raw share on the sink tokens (headlab.report.tables)


@dataclass(frozen=True)
class SinkReport:
    """What the section measured.

    Attributes:
        weighted: ``ValueWeighted.result()``.
        sinks: ``SinkShare.result()``.
        items, tokens: the corpus run.
        causal: the model's attention is causal.
    """

    weighted: Any
    sinks: Any
    items: int
    tokens: int
    causal: bool


def measure(model: HeadedModel | nn.Module, texts: Sequence[str]) -> SinkReport:
    """One capture of every head's pattern and v over ``texts`` into both accumulators."""
    from headlab.analysis.norms import ValueWeighted
    from headlab.analysis.sinks import SinkShare
    from headlab.analysis.surface import is_causal
    from headlab.capture import capture

    weighted, sinks = ValueWeighted.from_model(model), SinkShare.from_model(model)
    run = capture(model, corpus=texts, take=("pattern", "v"), consumers=[weighted, sinks], progress=False)
    return SinkReport(weighted=weighted.result(), sinks=sinks.result(), items=run.items, tokens=run.tokens,
                      causal=is_causal(model))


def render_sinks(report: SinkReport, *, description: str, hrefs: Mapping[str, str] | None = None) -> Html:
    """The section's fragment: sentences (``headlab.analysis.sinks.sink_sentences``), the plots (when
    written), and the heads with most attention on sinks (``headlab.report.tables.sinks_table``)."""
    from headlab.analysis.sinks import sink_sentences

    vw, sinks = report.weighted, report.sinks
    parts = [f"<p>{escape(description)}. Definitions: docs/analysis.md.</p>"]
    parts += [f"<p>{escape(s)}</p>" for s in sink_sentences(vw, sinks, causal=report.causal)]
    hrefs = hrefs or {}
    if "value_weighted" in hrefs:
        parts.append(f'<p><img src="{escape(hrefs["value_weighted"])}" alt="each head\'s raw share of attention on '
                     'the sink tokens against its value-weighted share" style="max-width:44%"> ')
    if "by_position" in hrefs:
        parts.append(f'<img src="{escape(hrefs["by_position"])}" alt="share of attention on the sink positions '
                     'against query position" style="max-width:54%"></p>')
    parts.append(to_html(sinks_table(vw, sinks)))
    return Html("".join(parts))


def render(ctx: ReportContext) -> str:
    from headlab.analysis.norms import plot_value_weighted
    from headlab.analysis.sinks import plot_sink_share
    from headlab.capture import load_corpus
    from headlab.report.provenance import model_name

    loaded = ctx.load_model()
    corpus = load_corpus(ctx.text)
    texts = corpus.texts[:QUICK_ITEMS] if ctx.quick else corpus.texts
    report = measure(loaded, texts)
    folder = ctx.assets_dir / "sinks"
    folder.mkdir(parents=True, exist_ok=True)
    plot_value_weighted(report.weighted, folder / "value-weighted.png")
    plot_sink_share(report.sinks, folder / "by-position.png")
    source = "the bundled corpus" if ctx.text is None else corpus.source
    description = (f"{loaded.architecture} model {model_name(loaded.source)} on {report.items} items of {source} "
                   f"({report.tokens} tokens){', quick budgets' if ctx.quick else ''}")
    return render_sinks(report, description=description, hrefs=PLOTS)


SECTION = Section(id="sinks", title="Attention sinks: where attention lands, and what it carries", render=render)
