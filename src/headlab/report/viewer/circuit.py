"""The viewer's circuit panel: for each shown head, its strongest incoming and outgoing edges of an
``EdgeScores`` (``headlab.circuits``: edge attribution, edge or path patching).

A head's **incoming** edges end at its query (``L1 H2.q``) or at the key/value head it reads
(``L1 H1.k``, ``L1 H1.v``): with grouped-query attention the query heads that share a key/value head
share its k and v edges, so each of them lists them. Its **outgoing** edges start at it and end at a
later head's q, k or v, or at the output. Each list keeps the ``top`` edges of largest |score|, so
the payload holds at most ``2 · top`` edges per head, and only heads with a scored edge appear.
Edges that scored exactly zero (or not a number) say nothing and are left out.

An edge's effect is its score as a share of the clean − corrupted gap of the metric
(``EdgeScores.effects``); the payload carries the method and both metric values so the page can
say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from headlab.circuits.graph import OUTPUT, Edge, EdgeScores, node_label

__all__ = ["TOP_EDGES", "CircuitView", "EdgeView", "HeadEdges", "circuit_view"]

TOP_EDGES = 5  # edges each way per head that the page carries


@dataclass(frozen=True)
class EdgeView:
    """One edge as the panel lists it.

    Attributes:
        sender, receiver: node labels (``"input"``, ``"L0 H3"``; ``"L1 H2.k"``, ``"output"``).
        role: the receiver's input, ``"q"``, ``"k"`` or ``"v"``, or ``"output"``.
        score: the edge's score (None if not finite).
        effect: the score as a share of the clean − corrupted gap (None when the gap is zero).
        heads: the heads at the edge's far end from the listing head, ``(layer, head)``: the sender
            of an incoming edge (none for the input); the query heads that read the receiver of an
            outgoing edge (every query head of a key/value head's group; none for the output).
    """

    sender: str
    receiver: str
    role: str
    score: float | None
    effect: float | None
    heads: tuple[tuple[int, int], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"sender": self.sender, "receiver": self.receiver, "label": f"{self.sender} → {self.receiver}",
                "role": self.role, "score": self.score, "effect": self.effect, "heads": [list(h) for h in self.heads]}


@dataclass(frozen=True)
class HeadEdges:
    """One head's strongest edges.

    Attributes:
        incoming, outgoing: at most ``top`` edges each, largest |score| first.
        n_incoming, n_outgoing: how many edges with a non-zero score it has each way.
        kv_head: the key/value head its k and v come from, when its layer groups query heads; else None.
        kv_group: the query heads that read ``kv_head`` (itself included); empty when ``kv_head`` is None.
    """

    incoming: list[EdgeView]
    outgoing: list[EdgeView]
    n_incoming: int
    n_outgoing: int
    kv_head: int | None = None
    kv_group: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"in": [e.to_dict() for e in self.incoming], "out": [e.to_dict() for e in self.outgoing],
                "nIn": self.n_incoming, "nOut": self.n_outgoing, "kvHead": self.kv_head,
                "kvGroup": list(self.kv_group)}


@dataclass(frozen=True)
class CircuitView:
    """What the circuit panel shows.

    Attributes:
        method: the scoring method (``EdgeScores.method``).
        clean_metric, corrupted_metric: the metric on the two unpatched runs.
        n_edges: edges scored in all.
        top: most edges per head each way.
        heads: ``{(layer, head): HeadEdges}`` for the shown heads that have a scored edge.
        clean, corrupted: the two inputs' texts, when given.
    """

    method: str
    clean_metric: float | None
    corrupted_metric: float | None
    n_edges: int
    top: int
    heads: dict[tuple[int, int], HeadEdges]
    clean: str | None = None
    corrupted: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Returns: the payload's ``circuit`` (``heads`` keyed ``"layer.head"``)."""
        return {"method": self.method, "cleanMetric": self.clean_metric, "corruptedMetric": self.corrupted_metric,
                "clean": self.clean, "corrupted": self.corrupted, "edges": self.n_edges, "top": self.top,
                "heads": {f"{layer}.{head}": h.to_dict() for (layer, head), h in self.heads.items()}}


def circuit_view(scores: EdgeScores, kv_head_of: Sequence[Sequence[int]], *,
                 heads: Iterable[tuple[int, int]] | None = None, top: int = TOP_EDGES,
                 texts: tuple[str, str] | None = None) -> CircuitView:
    """Each head's strongest incoming and outgoing edges (see the module docstring).

    Args:
        scores: edge scores of the viewed model (``edge_attribution``, ``edge_patching``, ``path_patching``).
        kv_head_of: per layer, the key/value head each query head reads (``[s.kv_head_of for s in model.sites]``).
        heads: the ``(layer, head)`` pairs the viewer shows; None for every head.
        top: most edges each way per head.
        texts: ``(clean, corrupted)``, the inputs the scores came from, to show beside them.

    Returns:
        The panel's data.

    Raises:
        ValueError: ``top`` is not a positive int, ``texts`` is not two strings, a head of ``heads`` or one that
            an edge names (a query or key/value head) is not the model's (scores of another model).
    """
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise ValueError(f"top={top!r}; expected a positive int (edges each way per head)")
    if texts is not None and (len(texts) != 2 or not all(isinstance(t, str) for t in texts)):
        raise ValueError(f"texts={texts!r}; expected (clean, corrupted), two strings")
    n_heads = [len(kv) for kv in kv_head_of]
    groups = [_groups(kv) for kv in kv_head_of]
    _check(scores.edges, n_heads, [len(g) for g in groups])
    values = np.asarray(scores.scores, dtype=np.float64)
    effects = np.asarray(scores.effects, dtype=np.float64)
    scored = np.isfinite(values) & (values != 0)
    order = np.argsort(-np.abs(np.where(scored, values, 0.0)), kind="stable")  # largest |score| first, then graph order
    # edge indices by the node they end at (a query head's q; a key/value head's k and v) and by the head they start
    # from, each list strongest first
    into: dict[tuple[int, int, bool], list[int]] = {}  # (layer, head, True) a query head; (layer, kv head, False)
    out: dict[tuple[int, int], list[int]] = {}
    for i in order[scored[order]].tolist():
        edge = scores.edges[i]
        if not isinstance(edge.receiver, str):
            layer, head, role = edge.receiver
            into.setdefault((layer, head, role == "q"), []).append(i)
        if not isinstance(edge.sender, str):
            out.setdefault(edge.sender, []).append(i)
    rank = np.empty(len(values), dtype=np.int64)
    rank[order] = np.arange(len(values))
    wanted = [(layer, h) for layer, n in enumerate(n_heads) for h in range(n)] if heads is None else list(heads)
    unknown = [(layer, h) for layer, h in wanted if not (0 <= layer < len(n_heads) and 0 <= h < n_heads[layer])]
    if unknown:
        raise ValueError(f"heads {unknown[:3]} are not heads of this model (heads per layer {n_heads})")
    by_head = {}
    for layer, head in wanted:
        kv = kv_head_of[layer][head]
        query, shared = into.get((layer, head, True), []), into.get((layer, kv, False), [])
        sent = out.get((layer, head), [])
        if not query and not shared and not sent:
            continue
        strongest_in = sorted(query[:top] + shared[:top], key=lambda i: rank[i])[:top]
        grouped = len(groups[layer]) < n_heads[layer]
        by_head[(layer, head)] = HeadEdges(
            incoming=[_view(scores, i, values, effects, groups, incoming=True) for i in strongest_in],
            outgoing=[_view(scores, i, values, effects, groups, incoming=False) for i in sent[:top]],
            n_incoming=len(query) + len(shared), n_outgoing=len(sent), kv_head=kv if grouped else None,
            kv_group=tuple(groups[layer][kv]) if grouped else ())
    clean, corrupted = texts if texts is not None else (None, None)
    return CircuitView(method=scores.method, clean_metric=_finite(scores.clean_metric),
                       corrupted_metric=_finite(scores.corrupted_metric), n_edges=len(scores.edges), top=top,
                       heads=by_head, clean=clean, corrupted=corrupted)


def _groups(kv_head_of: Sequence[int]) -> list[list[int]]:
    """Per key/value head, the query heads that read it."""
    groups: list[list[int]] = [[] for _ in range(max(kv_head_of, default=-1) + 1)]
    for head, kv in enumerate(kv_head_of):
        groups[kv].append(head)
    return groups


def _check(edges: Sequence[Edge], n_heads: list[int], n_kv_heads: list[int]) -> None:
    """Refuse an edge whose heads the viewed model does not have."""
    n_layers = len(n_heads)
    for edge in edges:
        sender, receiver = edge.sender, edge.receiver
        fits = isinstance(sender, str) or (0 <= sender[0] < n_layers and 0 <= sender[1] < n_heads[sender[0]])
        if fits and not isinstance(receiver, str):
            layer, head, role = receiver
            fits = 0 <= layer < n_layers and 0 <= head < (n_heads if role == "q" else n_kv_heads)[layer]
        if not fits:
            raise ValueError(f"edge {edge.label} names a head this model does not have (heads per layer {n_heads}, "
                             f"key/value heads {n_kv_heads}); were the scores computed on another model?")


def _view(scores: EdgeScores, i: int, values: np.ndarray, effects: np.ndarray, groups: list[list[list[int]]], *,
          incoming: bool) -> EdgeView:
    edge = scores.edges[i]
    far: tuple[tuple[int, int], ...] = ()
    if incoming and not isinstance(edge.sender, str):
        far = (edge.sender,)
    elif not incoming and not isinstance(edge.receiver, str):
        layer, head, role = edge.receiver
        far = tuple((layer, h) for h in ([head] if role == "q" else groups[layer][head]))
    return EdgeView(sender=node_label(edge.sender), receiver=node_label(edge.receiver), role=edge.role or OUTPUT,
                    score=_finite(values[i]), effect=_finite(effects[i]), heads=far)


def _finite(x: float) -> float | None:
    """A JSON-safe number: None for NaN and infinities."""
    return float(x) if np.isfinite(x) else None
