"""The viewer inline in a notebook: ``headlab.show(model, text)`` or ``headlab.show(cache)``.

    viewer = headlab.show(loaded, "The cat sat on the mat.")   # the last value of a cell: drawn below it
    viewer.save("view.html")                                    # the same as a standalone page
    headlab.show(loaded, clean, edges=edge_attribution(loaded, clean, corrupted, metric))  # with a circuit panel

The output is one piece of HTML with everything in it, so it works offline and needs no server: the
mount point and its payload (``page.viewer_fragment``), the viewer's style and its script, inlined
(``page.asset_text``: the same files ``headlab view`` and the report use). Jupyter (classic and Lab)
and VS Code render ``text/html`` outputs and run their scripts when the notebook is trusted; the
script mounts every viewer on the page that has not been mounted yet, and each output gets ids of
its own, so several viewers live side by side. Where no script runs (an untrusted notebook, a static
rendering), the mount point says so instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from headlab.analysis.flow import FLOW_MAX_LENGTH
from headlab.capture.cache import Cache
from headlab.circuits.graph import EdgeScores
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel
from headlab.report.viewer.cached import cache_view_data
from headlab.report.viewer.circuit import TOP_EDGES
from headlab.report.viewer.data import view_data
from headlab.report.viewer.page import asset_text, viewer_document, viewer_fragment
from headlab.report.viewer.payload import ViewerData

__all__ = ["InlineViewer", "show"]

FALLBACK = ("The attention viewer did not start: this output's script has not run. Trust the notebook "
            "(Jupyter: File \u25b8 Trust Notebook) and run the cell again, or save it as a page with .save(path).")


@dataclass(frozen=True)
class InlineViewer:
    """A viewer that a notebook draws inline (``_repr_html_``).

    Attributes:
        data: what it shows (``ViewerData``).
    """

    data: ViewerData

    def html(self) -> str:
        """The output's HTML: style, mount point, payload and script; fresh element ids on every call, so the
        same viewer can be shown twice on one page."""
        element_id = f"hv-{uuid.uuid4().hex[:16]}"
        return (f'<div class="hv-inline"><style>{asset_text("viewer.css")}</style>'
                f"{viewer_fragment(self.data, element_id=element_id, fallback=FALLBACK)}"
                f"<script>{asset_text('viewer.js')}</script></div>")

    def _repr_html_(self) -> str:
        return self.html()

    def save(self, path: str | Path) -> Path:
        """Write the viewer as a standalone page (``headlab view``'s) and return its path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(viewer_document(self.data), encoding="utf-8")
        return path

    def __repr__(self) -> str:
        return (f"InlineViewer: {len(self.data.heads)} heads of {self.data.name} on {self.data.contents}; a notebook "
                "draws it, .save(path) writes it as a page")


def show(what: HeadedModel | nn.Module | Cache | ViewerData, texts: str | Sequence[str] | None = None, *,
         heads: HeadSelection = None, flow_max_length: int = FLOW_MAX_LENGTH, edges: EdgeScores | None = None,
         edge_texts: tuple[str, str] | None = None, top_edges: int = TOP_EDGES) -> InlineViewer:
    """The interactive attention viewer, inline in a notebook.

    Args:
        what: a model (a ``HeadedModel``, or an attached model whose handle has a tokenizer) to run on
            ``texts``; a cache (``run_with_cache``
            with ``"pattern"`` kept) to show as it is, without running anything; or a ``ViewerData``.
        texts: the text or texts to run the model on (a model only).
        heads: the heads to show (``headlab.heads.selection``); None for all (for a cache: all it kept).
        flow_max_length: compute attention flow for texts of at most this many word pieces; 0 for none.
        edges: edge scores of the model (``headlab.circuits.edge_attribution`` and the like): clicking a head
            lists its strongest incoming and outgoing edges in a circuit panel (a model only: the panel needs its
            key/value heads).
        edge_texts: ``(clean, corrupted)``, the texts the edges were scored on, shown beside them.
        top_edges: most edges each way per head.

    Returns:
        An ``InlineViewer``: the last value of a cell draws it; ``.save(path)`` writes a standalone page.

    Raises:
        TypeError: a model without texts, or texts or edges given with a cache or ``ViewerData``.
        ValueError: as ``view_data`` (bad texts, selection or sizes) or ``cache_view_data`` (no pattern kept).
    """
    if isinstance(what, (Cache, ViewerData)):
        if texts is not None:
            raise TypeError(f"show({type(what).__name__}) shows what it holds; texts are for a model: "
                            "show(model, text)")
        if edges is not None:
            raise TypeError(f"show({type(what).__name__}, edges=...): the circuit panel needs the model's key/value "
                            "heads; show(model, text, edges=edges), or view_data(model, text, edges=edges)")
        if isinstance(what, ViewerData):
            return InlineViewer(what)
        return InlineViewer(cache_view_data(what, heads=heads, flow_max_length=flow_max_length))
    if texts is None:
        raise TypeError("show(model, text): give the text (or texts) to run the model on, or pass a cache "
                        "from run_with_cache")
    return InlineViewer(view_data(what, texts, heads=heads, flow_max_length=flow_max_length, edges=edges,
                                  edge_texts=edge_texts, top_edges=top_edges))
