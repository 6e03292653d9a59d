"""The attention viewer on a few example sentences, embedded in the report.

The sentences were written for this project to show what heads do: a relative clause and a
long subject (syntax), pronouns and their antecedents (coreference), punctuation, a repeated
phrase (previous-token, duplicate-token and induction heads in causal models) and long rare
words (several pieces per word, for the piece/word switch). Roles and statistics come from the
sentences themselves; when the analysis section ran first, each head's corpus-wide roles and
statistics are shown beside them.

When a section that scores edges ran first (``headlab.circuits.edge_attribution`` and the like, on the
report's model) and shared its ``EdgeScores`` as ``ctx.memo(EDGES, ...)`` (and, optionally, its clean and
corrupted texts as ``ctx.memo(EDGE_TEXTS, ...)``), the viewer gets a circuit panel: clicking a head lists
its strongest incoming and outgoing edges (``headlab.report.viewer.view_data(edges=...)``).
"""

from __future__ import annotations

from headlab.report.html import Html, escape
from headlab.report.section import ReportContext, Section

__all__ = ["EDGES", "EDGE_TEXTS", "EXAMPLES", "SECTION", "render"]

EDGES = "edges"  # the memo key of the report's EdgeScores, if a section computed them
EDGE_TEXTS = "edge_texts"  # ... and of their (clean, corrupted) texts

EXAMPLES = (
    "The keys that the old man left on the kitchen table belong to his daughter.",
    "When Maria met Tom at the station, she gave him the umbrella he had forgotten.",
    "Heads are cheap; attention, which is not, scales with the square of the length.",
    "Uncharacteristically, the overcomplicated tokenizer fragmented antidisestablishmentarianism.",
    "the red fox jumped over the lazy dog and the red fox jumped over the lazy dog again",
)


def render(ctx: ReportContext) -> str:
    from headlab.report.provenance import model_name
    from headlab.report.viewer import view_data, viewer_fragment, write_assets

    loaded = ctx.load_model()
    analysis = ctx.memoized("analysis")
    edges = ctx.memoized(EDGES)
    data = view_data(loaded, list(EXAMPLES), corpus_rows=None if analysis is None else analysis.rows(),
                     edges=edges, edge_texts=ctx.memoized(EDGE_TEXTS) if edges is not None else None)
    write_assets(ctx.assets_dir)
    corpus = ("Each head's roles and statistics on the corpus (from the analysis above) sit beside those "
              "measured on these sentences." if analysis is not None else
              "Roles and statistics are measured on these sentences only.")
    intro = (f"<p>Every head of {escape(model_name(loaded.source))} on {len(EXAMPLES)} sentences written for this "
             "report (pick one above the thumbnails). Click a thumbnail to open a head; hover over a token to see "
             "what it attends to (blue) and what attends to it (orange underline); click a token to pin it. "
             f"Switch between word pieces and words. {escape(corpus)} "
             + ("The circuit panel lists the open head's strongest edges (the report's edge scores); click a "
                "head in it to move there. " if edges is not None else "") +
             "<code>headlab view \"your text\"</code> opens the same viewer on any text.</p>")
    return Html(intro + '<link rel="stylesheet" href="assets/viewer.css">'
                + viewer_fragment(data, element_id="attention-viewer")
                + '<script src="assets/viewer.js"></script>')


SECTION = Section(id="viewer", title="Attention viewer: every head on example sentences", render=render)
