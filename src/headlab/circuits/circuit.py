"""A circuit: the edges that carry a behaviour, chosen by their scores; its faithfulness, measured by forwards.

A **circuit** is a set of edges of the model's graph (``headlab.circuits.graph``), here the edges with
the largest |score| (``top_edges``). Its **faithfulness** (Hanna et al. 2024, "Have faith in
faithfulness", the measure EAP-IG's circuits are judged by) is how much of the behaviour it keeps when
every edge outside it carries the corrupted run's value:

    faithfulness(C) = (m(C) − m(corrupted)) / (m(clean) − m(corrupted))

``m(C)`` is the metric of ONE forward on the clean input in which each receiver r (a head's q, a
key/value head's k or v, the output) reads its own stream

    x_r − Σ_{s : (s → r) ∉ C} (a_s(now) − a_s(corrupted))

with ``x_r`` the stream r reads in this forward, ``a_s(now)`` what sender s adds to it in this forward
(a head's result, tapped as the forward runs: sites run in layer order, so every sender of a receiver
has run when the receiver reads) and ``a_s(corrupted)`` what it adds in the corrupted run; the input
sender's ``a`` is the stream before the first layer, the same in this forward as in the clean run.
In an encoder-decoder each receiver reads its own stream (``headlab.circuits.graph``): a cross-attention
head's k and v the encoder's final stream, before the encoder's final norm, less its missing senders' differences.
A receiver whose incoming edges are all in C reads the stream as it is; receivers of a layer whose
missing senders are the same share one stream (``own_inputs`` runs one extra call per distinct
stream). Every edge in C: the clean run, faithfulness 1.

Heads are the only nodes: the MLPs, norms and biases stay clean, and an edge is a head's result as
the stream carries it directly. So the empty circuit is the corrupted run only where heads are all a
model adds to the stream (an attention-only model, e.g. ``headlab.experiments.model.TinyTransformer``);
in a GPT-2 the MLPs still compute from the clean tokens and the empty circuit keeps some of the
behaviour (faithfulness ≠ 0). In a post-norm model (BERT) a head's result is normalised before later
layers read it; the edges here add it unnormalised, as in ``edges.py``.

Axis legend:
    stream, result of one head  (batch, pos, d_model)
"""

from __future__ import annotations

import csv
import json
import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from headlab import display
from headlab.circuits._figure import plot_circuit, plot_faithfulness
from headlab.circuits.edges import METHODS, edge_attribution, edge_patching
from headlab.circuits.graph import (
    OUTPUT,
    Edge,
    EdgeScores,
    Receiver,
    Sender,
    check_edges,
    graph_edges,
    graph_layers,
    input_of,
    node_label,
    output_stack,
    read_stack,
    receiving,
    stream_senders,
)
from headlab.circuits.inputs import own_inputs
from headlab.circuits.paths import path_patching
from headlab.circuits.runs import Metric, Run, difference, prepare
from headlab.heads.scoped import intervening
from headlab.layer.taps import Tap, TapOutput
from headlab.models import HeadedModel, headed
from headlab.models.handle import Inputs
from headlab.models.stream import Stream

SCORING = ("eap", "eap-ig", "path", "exact")  # how score_edges scores the graph

__all__ = ["SCORING", "Circuit", "FaithfulnessCurve", "faithfulness", "faithfulness_curve", "plot_circuit",
           "plot_faithfulness", "score_edges", "top_edges"]


@dataclass(repr=False)
class Circuit(display.Shown):
    """A set of edges with their scores (see the module docstring).

    Attributes:
        method: what scored the edges ("eap", "eap-ig", "edge patching", "path patching"; "" when unknown).
        edges: the circuit's edges, largest |score| first when chosen by ``top_edges``.
        scores: ``(len(edges),)``: their scores.
        scored: how many edges the circuit was chosen from (0 when unknown).
        heads: ``[(query heads, key/value heads)]`` per layer, for the figure; None: read off the edges.
        faithfulness: measured by ``faithfulness`` (which sets it), or None.
        details: what else to keep with it (a command puts the model, texts and metric here).
    """

    method: str
    edges: list[Edge]
    scores: np.ndarray
    scored: int = 0
    heads: list[tuple[int, int]] | None = None
    faithfulness: float | None = None
    details: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, dtype=float).reshape(-1)
        if len(self.scores) != len(self.edges):
            raise ValueError(f"{len(self.scores)} scores for {len(self.edges)} edges")
        if len(set(self.edges)) != len(self.edges):
            raise ValueError("a circuit holds each edge once; these edges repeat: "
                             f"{sorted({e.label for e in self.edges if self.edges.count(e) > 1})}")
        if self.heads is None:
            self.heads = _heads_of(self.edges)

    def __len__(self) -> int:
        return len(self.edges)

    def __contains__(self, edge: object) -> bool:
        return edge in set(self.edges)

    @property
    def nodes(self) -> list[Sender | Receiver]:
        """The input, heads ``(layer, head)`` and output the edges touch, in the order they first appear (a k or v
        receiver as ``(layer, key/value head)``)."""
        found: dict[Any, None] = {}
        for edge in self.edges:
            found[edge.sender] = None
            found[edge.receiver if isinstance(edge.receiver, str) else edge.receiver[:2]] = None
        return list(found)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "size": len(self.edges), "scored": self.scored,
                "faithfulness": self.faithfulness, "heads": [list(h) for h in self.heads or []],
                "details": self.details or {},
                "edges": [{**edge.to_dict(), "score": float(score)} for edge, score in zip(self.edges, self.scores)]}

    def write(self, folder: str | Path) -> list[Path]:
        """Write ``circuit.json`` (``to_dict``), ``circuit.csv`` (one row per edge) and the figure as
        ``circuit.png`` and ``circuit.svg`` into ``folder`` (created if missing).

        Returns:
            The paths written.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        json_path, csv_path = folder / "circuit.json", folder / "circuit.csv"
        json_path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        with csv_path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sender", "receiver", "role", "score"])
            for edge, score in zip(self.edges, self.scores):
                writer.writerow([node_label(edge.sender), node_label(edge.receiver), edge.role or "output",
                                 f"{score:.6g}"])
        figures = [plot_circuit(self, folder / f"circuit{suffix}") for suffix in (".png", ".svg")]
        return [json_path, csv_path, *figures]

    # --- how it shows (display.Shown) ---
    def _title(self) -> str:
        of = f" of {self.scored:,}" if self.scored else ""
        return f"Circuit: {len(self.edges):,} edges{of}" + (f" ({self.method})" if self.method else "")

    def _facts(self) -> list[tuple[str, object]]:
        heads = [n for n in self.nodes if not isinstance(n, str)]
        largest = ", ".join(f"{e.label} {display.short(float(s))}" for e, s in zip(self.edges[:3], self.scores[:3]))
        return [("faithfulness", "not measured" if self.faithfulness is None else display.short(self.faithfulness)),
                ("largest |score|", largest or "none"), ("heads", len(heads))]

    def _parts(self) -> list[str]:
        order = np.argsort(-np.abs(self.scores), kind="stable")[:10]
        rows = [[self.edges[i].label, display.short(float(self.scores[i]))] for i in order]
        return [display.table(["edge", "score"], rows)]


def top_edges(scores: EdgeScores, *, k: int | None = None, threshold: float | None = None) -> Circuit:
    """The circuit of the edges with the largest |score|: the top ``k``, or every edge with
    |score| ≥ ``threshold``; largest first (ties in the scores' order).

    Args:
        scores: ``EdgeScores`` of any method.
        k: how many edges (0: the empty circuit; more than were scored: every edge).
        threshold: the smallest |score| kept (≥ 0).

    Returns:
        A ``Circuit`` (faithfulness not measured).

    Raises:
        ValueError: neither or both of ``k`` and ``threshold``, a negative or non-int ``k``, a negative
            or non-finite ``threshold``.
    """
    if (k is None) == (threshold is None):
        raise ValueError(f"give exactly one of k and threshold; got k={k!r}, threshold={threshold!r}")
    magnitude = np.abs(scores.scores)
    order = np.argsort(-magnitude, kind="stable")
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"k={k!r}; expected an int ≥ 0 (the circuit's edges)")
        chosen = order[:int(k)]
    else:
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real) or not math.isfinite(threshold) \
                or threshold < 0:
            raise ValueError(f"threshold={threshold!r}; expected a finite number ≥ 0 (the smallest |score| kept)")
        chosen = order[magnitude[order] >= threshold]
    return Circuit(scores.method, [scores.edges[i] for i in chosen], scores.scores[chosen], scored=len(scores),
                   heads=_heads_of(scores.edges))


def faithfulness(model: HeadedModel, clean: Inputs, corrupted: Inputs, metric: Metric, circuit: Circuit) -> float:
    """How much of the behaviour ``circuit`` keeps with every other edge corrupted (see the module docstring):
    ``(m(circuit) − m(corrupted)) / (m(clean) − m(corrupted))``; three forwards (the clean and corrupted runs,
    and the circuit's).

    Every edge of the model's whole graph (``graph_edges(model)``) that is not in the circuit is corrupted,
    whichever edges were scored. The value is also stored in ``circuit.faithfulness``.

    Args:
        model: a ``HeadedModel`` or an attached model.
        clean, corrupted: inputs of the same shape (``HeadedModel.inputs``).
        metric: ``metric(output) -> scalar``; higher means more of the behaviour.
        circuit: edges of the model's graph.

    Returns:
        The faithfulness: 1 for every edge, 0 for a circuit that keeps none of the behaviour.

    Raises:
        ValueError: inputs of different shapes, runs that score the same, or an edge the model does not have.
    """
    handle = headed(model)
    stream, clean_run, corrupted_run = prepare(handle, clean, corrupted, metric)
    check_edges(handle, circuit.edges)
    value = _relative(_circuit_metric(handle, stream, clean_run, corrupted_run, metric, set(circuit.edges)),
                      clean_run, corrupted_run)
    circuit.faithfulness = value
    return value


@dataclass(repr=False)
class FaithfulnessCurve(display.Shown):
    """The faithfulness of the top-k circuits of one ``EdgeScores``, for several k.

    Attributes:
        method: what scored the edges.
        sizes: the circuits' sizes k, increasing.
        faithfulness: ``(len(sizes),)``.
        metrics: ``(len(sizes),)``: each circuit's metric ``m(C)``.
        clean_metric, corrupted_metric: the metric of the two unpatched runs.
        scored: the edges the circuits were chosen from.
        forwards: the forwards run (two for the runs, one per circuit).
        seconds: wall time.
    """

    method: str
    sizes: list[int]
    faithfulness: np.ndarray
    metrics: np.ndarray
    clean_metric: float
    corrupted_metric: float
    scored: int
    forwards: int
    seconds: float

    def smallest(self, level: float) -> int | None:
        """The smallest size whose faithfulness reaches ``level`` (e.g. 0.8), or None."""
        reached = [k for k, f in zip(self.sizes, self.faithfulness) if f >= level]
        return reached[0] if reached else None

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "scored": self.scored, "clean_metric": self.clean_metric,
                "corrupted_metric": self.corrupted_metric, "forwards": self.forwards, "seconds": self.seconds,
                "points": [{"size": k, "faithfulness": float(f), "metric": float(m)}
                           for k, f, m in zip(self.sizes, self.faithfulness, self.metrics)]}

    def _title(self) -> str:
        return f"FaithfulnessCurve: {self.method}, {len(self.sizes)} circuits of up to {self.sizes[-1]:,} edges"

    def _facts(self) -> list[tuple[str, object]]:
        first = self.smallest(0.8)
        points = ", ".join(f"{k}: {display.short(float(f))}" for k, f in zip(self.sizes, self.faithfulness))
        return [("faithfulness by size", display.abbreviate(points.split(", "), head=6, tail=2, sep=", ")),
                ("smallest ≥ 0.8", "none" if first is None else first),
                ("passes", f"{self.forwards} forwards, {self.seconds:.2f} s")]


def faithfulness_curve(model: HeadedModel, clean: Inputs, corrupted: Inputs, metric: Metric, scores: EdgeScores, *,
                       sizes: Sequence[int] | None = None,
                       progress: Callable[[int, int], None] | None = None) -> FaithfulnessCurve:
    """The faithfulness of ``top_edges(scores, k=k)`` for each k in ``sizes``: one forward per circuit.

    Args:
        model, clean, corrupted, metric: as ``faithfulness`` takes them.
        scores: the edge scores the circuits are chosen by.
        sizes: the circuits' sizes (ints from 0 to ``len(scores)``); None for 0 (the empty circuit) and 16
            log-spaced sizes from 1 to every scored edge.
        progress: called as ``progress(done, total)`` after each circuit.

    Returns:
        A ``FaithfulnessCurve`` (``plot_faithfulness`` draws it).

    Raises:
        ValueError: a size out of range or not an int, no sizes, or the errors of ``faithfulness``.
    """
    n = len(scores)
    if sizes is None:
        sizes = [0, *sorted({round(float(k)) for k in np.geomspace(1, max(n, 1), num=min(max(n, 1), 16))})]
    bad = [k for k in sizes if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k <= n]
    if bad or not sizes:
        raise ValueError(f"sizes={list(sizes)!r}; expected one or more ints from 0 to {n} (the scored edges)")
    chosen = sorted({int(k) for k in sizes})
    start = time.perf_counter()
    handle = headed(model)
    stream, clean_run, corrupted_run = prepare(handle, clean, corrupted, metric)
    check_edges(handle, scores.edges)
    values = []
    for done, k in enumerate(chosen, 1):
        circuit = top_edges(scores, k=k)
        values.append(_circuit_metric(handle, stream, clean_run, corrupted_run, metric, set(circuit.edges)))
        if progress is not None:
            progress(done, len(chosen))
    relative = np.asarray([_relative(m, clean_run, corrupted_run) for m in values])
    return FaithfulnessCurve(scores.method, chosen, relative, np.asarray(values), clean_run.metric,
                             corrupted_run.metric, n, forwards=2 + len(chosen),
                             seconds=time.perf_counter() - start)


def score_edges(model: HeadedModel, clean: Inputs, corrupted: Inputs, metric: Metric, *, method: str = "eap-ig",
                steps: int = 5, progress: Callable[[int, int], None] | None = None) -> EdgeScores:
    """Score every edge of the graph by one of ``SCORING`` (what ``headlab circuit --method`` runs).

    - "eap", "eap-ig": ``edge_attribution`` (2 + steps forwards and ``steps`` backwards for EAP-IG);
    - "exact": ``edge_patching`` of every edge (one forward per edge);
    - "path": ``path_patching`` of every head → receiver pair (each head's q, k, v after it, and the
      output; one forward per sender and one per head → head pair); path patching's senders are heads, so
      the input's edges are scored by edge patching (one forward each) and ``details["input edges"]`` says so.

    Args:
        model, clean, corrupted, metric: as ``edge_attribution`` takes them.
        method: one of ``SCORING``.
        steps: EAP-IG's steps (ignored by the others).
        progress: called as ``progress(done, total)`` after each forward of "exact" and "path".

    Returns:
        ``EdgeScores`` of every edge of the graph, in ``graph_edges`` order.

    Raises:
        ValueError: an unknown method, steps < 1, or the errors of the method.
    """
    if method not in SCORING:
        raise ValueError(f"method={method!r}; expected one of {SCORING}")
    if method in METHODS:
        return edge_attribution(model, clean, corrupted, metric, method=method, steps=steps)
    if method == "exact":
        return edge_patching(model, clean, corrupted, metric, progress=progress)
    handle = headed(model)
    edges = graph_edges(handle)
    inputs = [e for e in edges if isinstance(e.sender, str)]  # the input (each stream's)
    receivers = list(dict.fromkeys(e.receiver for e in edges))
    heads = sum(handle.n_heads)
    paths = heads + sum(not isinstance(e.sender, str) and e.receiver != OUTPUT for e in edges)  # path patching's
    total = paths + len(inputs)

    def shifted(offset: int) -> Callable[[int, int], None] | None:
        return None if progress is None else (lambda done, _: progress(offset + done, total))

    by_path = path_patching(handle, clean, corrupted, metric, receivers=receivers, progress=shifted(0))
    by_edge = edge_patching(handle, clean, corrupted, metric, edges=inputs, progress=shifted(paths))
    found = {e: s for part in (by_path, by_edge) for e, s in zip(part.edges, part.scores)}
    return EdgeScores("path patching", edges, np.asarray([found[e] for e in edges]), by_path.clean_metric,
                      by_path.corrupted_metric, forwards=by_path.forwards + by_edge.forwards, backwards=0,
                      seconds=by_path.seconds + by_edge.seconds,
                      details={**(by_path.details or {}), "input edges": "edge patching"})


# --- the circuit's forward --------------------------------------------------------------------------------------------

def _circuit_metric(model: HeadedModel, stream: Stream, clean: Run, corrupted: Run, metric: Metric,
                    kept: set[Edge]) -> float:
    """``m(C)``: the clean forward with every edge outside ``kept`` carrying its corrupted value."""
    sites, layers = model.sites, graph_layers(model)
    stacks = list(dict.fromkeys(layer.stack for layer in layers))
    row = {stack: {s: i for i, s in enumerate(stream_senders(layers, stack))} for stack in stacks}
    # per (layer, whether it is the memory a cross-attention's k and v read): {missing senders' rows of the stream
    # read: [(role, head)]}; receivers missing none read the stream as it is
    missing: dict[tuple[int, bool], dict[tuple[int, ...], list[tuple[str, int]]]] = {}
    into: dict[Receiver, list[int]] = {}
    for edge in graph_edges(model):
        if edge not in kept:
            read = output_stack(layers) if edge.receiver == OUTPUT else read_stack(layers, *_layer_role(edge))
            into.setdefault(edge.receiver, []).append(row[read][edge.sender])
    for receiver, rows in into.items():
        if not isinstance(receiver, str):
            layer, head, role = receiver
            memory = read_stack(layers, layer, role) != layers[layer].stack
            missing.setdefault((layer, memory), {}).setdefault(tuple(rows), []).append((role, head))
    now: dict[int, Tensor] = {}  # layer -> every head's result in this forward (batch, head, pos, d_model)
    sent_inputs = {stack: difference(clean, corrupted, input_of(sites, stack)) for stack in stacks}

    def differences(stack: str, before: int) -> Tensor:
        """(senders into ``stack``'s stream before layer ``before``, batch, pos, d_model): a_s(now) − a_s(corrupted)."""
        parts = [sent_inputs[stack][None]]
        for site in sites[:before]:
            if site.stack != stack:
                continue
            if site.layer not in now:
                raise ValueError(f"layer {site.layer}'s heads did not run before the layers after it read the stream")
            parts.append((now[site.layer] - corrupted.results[site.layer]).transpose(0, 1))
        return torch.cat(parts)

    def own(layer: int, x: Tensor, memory: Tensor | None) -> dict[tuple[str, int], Tensor]:
        out = {}
        for read_memory, base in ((False, x), (True, memory)):
            groups = missing.get((layer, read_memory))
            if not groups:
                continue
            assert base is not None
            sent = differences(read_stack(layers, layer, "k" if read_memory else "q"), layer)
            for rows, receivers in groups.items():
                mine = base - sent[list(rows)].sum(0)
                out.update(dict.fromkeys(receivers, mine))
        return out

    def final(x: Tensor) -> Tensor:
        rows = into.get(OUTPUT)
        return x if not rows else x - differences(output_stack(layers), len(sites))[rows].sum(0)

    def sink(layer: int, out: TapOutput) -> None:
        assert out.result is not None
        now[layer] = out.result

    with intervening(model):
        for site in sites:
            site.tap = Tap(sink, result=list(range(site.n_heads)))
        with model.running(grad=False) as net, own_inputs(model, stream, own), stream.hooked(final=final):
            return float(metric(net(**clean.inputs)))


def _layer_role(edge: Edge) -> tuple[int, str]:
    """The layer and role of an edge into a head's input."""
    layer, _, role = receiving(edge.receiver)
    return layer, role


def _relative(value: float, clean: Run, corrupted: Run) -> float:
    return (value - corrupted.metric) / (clean.metric - corrupted.metric)


def _heads_of(edges: Sequence[Edge]) -> list[tuple[int, int]]:
    """``[(query heads, key/value heads)]`` per layer, as far as ``edges`` show them."""
    query: dict[int, int] = {}
    kv: dict[int, int] = {}
    for edge in edges:
        if not isinstance(edge.sender, str):
            query[edge.sender[0]] = max(query.get(edge.sender[0], 0), edge.sender[1] + 1)
        if not isinstance(edge.receiver, str):
            layer, head, role = edge.receiver
            seen = query if role == "q" else kv
            seen[layer] = max(seen.get(layer, 0), head + 1)
    layers = max([*query, *kv], default=-1) + 1
    return [(query.get(layer, kv.get(layer, 1)), kv.get(layer, query.get(layer, 1))) for layer in range(layers)]
