"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Axis legend:
    patterns   per layer (head, query_pos, key_pos)   one text, every head of the layer
    mixed      (layer, query_pos, key_pos)            Ã_l = (mean_h A_l,h + I), rows renormalised
    rollout    (layer, query_pos, key_pos)            R_l = Ã_l Ã_{l-1} … Ã_0
    flow       (layer, query_pos, key_pos)            F_l[i, j] = max-flow from input token j to
                                                      position i at the output of layer l

Both read a transformer as a layered graph: a node per (layer boundary, position), an edge from
position j below layer l to position i above it weighted by Ã_l[i, j] — the head-averaged attention
with the identity added for the residual stream, each row renormalised to sum to 1.

- Rollout multiplies the weights along every path and sums over paths: the product of the Ã_l.
  Row i of R_l is a distribution over the input tokens.
- Flow treats the weights as capacities and asks how much can pass from input token j to output
  position i at once: a max-flow problem per (i, j) and per depth l, solved exactly here (Dinic's
  algorithm, ``max_flow``). Its cost grows like length⁴ × layers, so ``attention_flow`` refuses texts
  longer than ``FLOW_MAX_LENGTH`` positions (measured: docs/analysis.md).

Layer 0 gives the same matrix for both: Ã_0 itself.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

if TYPE_CHECKING:
    from headlab.models import HeadedModel

__all__ = [
    "FLOW_MAX_LENGTH", "MaxFlow", "TextFlow", "attention_flow", "max_flow", "mixed_attention", "rollout", "text_flow",
]

# Positions above which attention_flow refuses a text. Measured on one core of the development
# machine (docs/analysis.md): a 6-layer model takes about 3 s for every depth at 24 positions;
# the cost grows like positions⁴.
FLOW_MAX_LENGTH = 24
_EPS = 1e-12  # residual capacity treated as zero: capacities are attention weights in [0, 1]


def mixed_attention(patterns: Sequence[Tensor]) -> Tensor:
    """The graph's edge weights: each layer's head-averaged pattern plus the identity, rows renormalised.

    Args:
        patterns: per layer, ``(head, n, n)`` attention of one text (every head of the layer; the
            head count may differ between layers).

    Returns:
        ``(layer, n, n)`` float64; a row that was all zero (a fully masked query) keeps only the residual.

    Raises:
        ValueError: no layer, a pattern that is not ``(head, n, n)`` with one n for all layers, or a
            negative or non-finite weight.
    """
    if len(patterns) == 0:
        raise ValueError("no layer given: pass one (head, n, n) pattern per layer")
    n = patterns[0].shape[-1]
    mixed = []
    for layer, p in enumerate(patterns):
        if p.dim() != 3 or p.shape[0] == 0 or p.shape[1:] != (n, n):
            raise ValueError(f"layer {layer}: pattern has shape {tuple(p.shape)}; expected (head, {n}, {n})")
        a = p.detach().to(dtype=torch.float64, device="cpu").mean(0)
        if not bool(torch.isfinite(a).all()) or float(a.min()) < 0:
            raise ValueError(f"layer {layer}: attention weights must be finite and >= 0")
        a = a + torch.eye(n, dtype=torch.float64)
        mixed.append(a / a.sum(-1, keepdim=True))
    return torch.stack(mixed)


def rollout(patterns: Sequence[Tensor]) -> Tensor:
    """Attention rollout through every depth (Abnar & Zuidema 2020, eq. 1).

    Args:
        patterns: per layer, ``(head, n, n)`` (see ``mixed_attention``).

    Returns:
        ``(layer, n, n)`` float64: ``R_l = Ã_l R_{l-1}``, ``R_0 = Ã_0``; every row sums to 1.
    """
    mixed = mixed_attention(patterns)
    out = torch.empty_like(mixed)
    out[0] = mixed[0]
    for layer in range(1, len(mixed)):
        out[layer] = mixed[layer] @ out[layer - 1]
    return out


@dataclass(frozen=True)
class MaxFlow:
    """A maximum flow.

    Attributes:
        value: the flow's value (what leaves the source).
        flows: the flow on each edge, in the order the edges were given.
    """

    value: float
    flows: list[float]


class _Graph:
    """A residual graph for Dinic's algorithm: edge e and its reverse e ^ 1 side by side."""

    def __init__(self, n_nodes: int) -> None:
        self.n = n_nodes
        self.adj: list[list[int]] = [[] for _ in range(n_nodes)]
        self.to: list[int] = []
        self.cap: list[float] = []

    def add(self, u: int, v: int, cap: float) -> int:
        e = len(self.to)
        self.to += [v, u]
        self.cap += [cap, 0.0]
        self.adj[u].append(e)
        self.adj[v].append(e + 1)
        return e

    def solve(self, source: int, sink: int) -> float:
        """Push a maximum flow from ``source`` to ``sink`` (changes ``cap`` to the residual); returns its value."""
        to, cap, adj, total = self.to, self.cap, self.adj, 0.0
        while True:
            level = [-1] * self.n
            level[source] = 0
            queue = deque([source])
            while queue:  # BFS: the level graph of shortest residual paths
                u = queue.popleft()
                for e in adj[u]:
                    if cap[e] > _EPS and level[to[e]] < 0:
                        level[to[e]] = level[u] + 1
                        queue.append(to[e])
            if level[sink] < 0:
                return total
            # the level graph's edges only, so that the search below tests nothing else
            ahead = [[e for e in adj[u] if cap[e] > _EPS and level[to[e]] == level[u] + 1] if level[u] >= 0 else []
                     for u in range(self.n)]
            total += self._blocking_flow(source, sink, ahead)

    def _blocking_flow(self, source: int, sink: int, ahead: list[list[int]]) -> float:
        """Augment along level-graph paths until none is left (a DFS that retires dead ends and, after each
        augmentation, resumes from the tail of the first edge it saturated); returns what it pushed."""
        to, cap = self.to, self.cap
        cursor = [0] * self.n
        path: list[int] = []
        u, pushed = source, 0.0
        while True:
            if u == sink:
                amount = min(cap[e] for e in path)
                pushed += amount
                cut = len(path)
                for k, e in enumerate(path):
                    cap[e] -= amount
                    cap[e ^ 1] += amount
                    if cap[e] <= _EPS and k < cut:
                        cut = k
                del path[cut:]
                u = to[path[-1]] if path else source
                continue
            edges, c = ahead[u], cursor[u]
            while c < len(edges) and cap[edges[c]] <= _EPS:
                c += 1
            cursor[u] = c
            if c == len(edges):  # a dead end for this phase: step back
                if not path:
                    return pushed
                u = to[path.pop() ^ 1]
                cursor[u] += 1
                continue
            path.append(edges[c])
            u = to[edges[c]]


def max_flow(n_nodes: int, edges: Sequence[tuple[int, int, float]], source: int, sink: int) -> MaxFlow:
    """The exact maximum flow of a directed graph (Dinic's algorithm).

    Args:
        n_nodes: nodes, numbered 0 … n_nodes − 1.
        edges: ``(u, v, capacity)``; parallel edges add up; capacities finite and ≥ 0.
        source, sink: two different nodes.

    Returns:
        The value and the flow on each edge (capacities are respected and flow is conserved at every
        other node, to within 1e-12 per augmentation).

    Raises:
        ValueError: a node out of range, source equal to sink, or a negative or non-finite capacity.
    """
    for name, node in (("source", source), ("sink", sink)):
        if not 0 <= node < n_nodes:
            raise ValueError(f"{name}={node} is not a node; expected 0 <= {name} < n_nodes={n_nodes}")
    if source == sink:
        raise ValueError(f"source and sink are both node {source}; expected two different nodes")
    graph = _Graph(n_nodes)
    ids = []
    for u, v, c in edges:
        if not (0 <= u < n_nodes and 0 <= v < n_nodes):
            raise ValueError(f"edge ({u}, {v}) leaves the nodes 0..{n_nodes - 1}")
        if not (math.isfinite(c) and c >= 0):
            raise ValueError(f"edge ({u}, {v}) has capacity {c}; expected a finite number >= 0")
        ids.append(graph.add(u, v, float(c)))
    value = graph.solve(source, sink)
    return MaxFlow(value=value, flows=[graph.cap[e ^ 1] for e in ids])


def attention_flow(patterns: Sequence[Tensor], *, max_length: int = FLOW_MAX_LENGTH) -> Tensor:
    """Attention flow through every depth (Abnar & Zuidema 2020, §3), exact.

    The graph below depth l has the input tokens, the positions between layers 0 … l and the
    outputs of layer l; an edge from j below layer m to i above it has capacity Ã_m[i, j]
    (``mixed_attention``). F_l[i, j] is the max-flow from input token j to position i above layer l.

    Args:
        patterns: per layer, ``(head, n, n)`` (see ``mixed_attention``).
        max_length: refuse texts longer than this (the cost grows like n⁴ × layers²).

    Returns:
        ``(layer, n, n)`` float64, in [0, 1]; ``F_0 = Ã_0``.

    Raises:
        ValueError: the text is longer than ``max_length``, or the patterns are bad (``mixed_attention``).
    """
    mixed = mixed_attention(patterns).numpy()
    n_layers, n = mixed.shape[0], mixed.shape[-1]
    if n > max_length:
        raise ValueError(f"attention flow is limited to {max_length} positions (an exact max-flow per pair of "
                         f"positions and per layer); this text has {n}. Use rollout, or a shorter text")
    out = np.empty((n_layers, n, n))
    out[0] = mixed[0]
    for depth in range(1, n_layers):
        out[depth] = _flow_at_depth(mixed[: depth + 1])
    return torch.from_numpy(out)


def _flow_at_depth(mixed: np.ndarray) -> np.ndarray:
    """``(n, n)``: F[i, j] through the layers of ``mixed`` (at least 2). The graph between the first and the
    last layer is built once; each (i, j) sets the source's and the sink's edges and starts from zero flow."""
    n_layers, n = mixed.shape[0], mixed.shape[-1]
    # Nodes: the positions above layers 0 … n_layers − 2 (the inner boundaries), then source and sink.
    # The other input tokens only send and the other outputs only receive: no path passes through them.
    source, sink = (n_layers - 1) * n, (n_layers - 1) * n + 1
    graph = _Graph(sink + 1)
    out_edges = [graph.add(source, k, float(mixed[0][k, 0])) for k in range(n)]  # capacities set per j
    for layer in range(1, n_layers - 1):
        below, above = (layer - 1) * n, layer * n
        for i in range(n):
            for j in range(n):
                if mixed[layer][i, j] > 0:
                    graph.add(below + j, above + i, float(mixed[layer][i, j]))
    last = (n_layers - 2) * n
    in_edges = [graph.add(last + k, sink, 0.0) for k in range(n)]  # capacities set per i
    fresh = list(graph.cap)
    out = np.empty((n, n))
    for j in range(n):
        for k, e in enumerate(out_edges):
            fresh[e] = float(mixed[0][k, j])
        for i in range(n):
            for k, e in enumerate(in_edges):
                fresh[e] = float(mixed[-1][i, k])
            graph.cap = list(fresh)
            out[i, j] = graph.solve(source, sink)
    return out


@dataclass(frozen=True)
class TextFlow:
    """Rollout and flow of one text.

    Attributes:
        text: the text.
        tokens: its pieces (special tokens included).
        rollout: ``(layer, n, n)`` float64.
        flow: ``(layer, n, n)`` float64, or None when the text is longer than ``max_length``.
        max_length: the flow's length limit that applied.
    """

    text: str
    tokens: list[str]
    rollout: Tensor
    flow: Tensor | None
    max_length: int

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "tokens": list(self.tokens), "rollout": self.rollout.tolist(),
                "flow": None if self.flow is None else self.flow.tolist(), "flow_max_length": self.max_length}


def text_flow(model: HeadedModel | nn.Module, text: str, *, flow: bool = True,
              max_length: int = FLOW_MAX_LENGTH) -> TextFlow:
    """Run ``model`` on one text and compute its rollout and, within ``max_length`` pieces, its flow.

    Args:
        model: a ``HeadedModel`` (every head of every layer is captured).
        text: the text.
        flow: compute the flow too (skipped, None, beyond ``max_length``).
        max_length: the flow's length limit.

    Raises:
        ValueError: an empty text.
    """
    from headlab.capture import capture

    if not text.strip():
        raise ValueError("text is empty or whitespace only; rollout needs at least one token")
    kept: dict[str, Any] = {}

    def keep(batch: Any) -> None:
        n = int(batch.lengths[0])
        kept["tokens"] = list(batch.tokens[0])
        kept["patterns"] = [batch.layers[layer].pattern[0, :, :n, :n].double().cpu() for layer in sorted(batch.layers)]

    class _Keep:
        update = staticmethod(keep)

    capture(model, corpus=[text], take=("pattern",), consumers=[_Keep()], progress=False)
    patterns = kept["patterns"]
    within = len(kept["tokens"]) <= max_length
    return TextFlow(text=text, tokens=kept["tokens"], rollout=rollout(patterns),
                    flow=attention_flow(patterns, max_length=max_length) if flow and within else None,
                    max_length=max_length)
