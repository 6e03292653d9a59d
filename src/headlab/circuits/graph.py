"""The edges between heads, and a score for each: what edge attribution, edge patching and path
patching return, and what a circuit is made of.

A model's graph (Elhage et al. 2021; Syed et al. 2023; Hanna et al. 2024), heads as nodes:

- senders: the input (the stream where it enters, before the first layer: embeddings and positions, or a
  vision model's patches) and every head;
  a head sends its ``result`` (its z through its slice of the output projection) into the stream;
- receivers: every head's query input (``q``), every key/value head's key and value inputs (``k``,
  ``v``), and the output (the stream the output reads: the logits' input);
- an edge sender → receiver for every sender in an earlier layer than the receiver (the input
  before every layer; every head before the output).

With grouped-query attention a key/value head is one receiver of its ``k`` edges and one of its
``v`` edges: the query heads that read it share them. ``Edge.receiver`` then names the key/value head
(``(layer, kv_head, "k")``), as the model computes one key per key/value head.

An encoder-decoder's heads write two streams (``AttentionSite.stack``), and the graph is both: each stack's
input is a sender (``INPUT`` the encoder's, ``"decoder input"`` the target's embeddings), a head sends into its
own stack's stream, and a receiver reads one stream (``read_stack``): its own, but for a cross-attention
head's k and v, which read the encoder's final stream (before the encoder's final norm, which the receiver's
input goes through). So every encoder head and the encoder's input send to every cross-attention head's k and
v; a cross-attention head's q, the decoder's self-attention and the output read the decoder's stream; no
decoder head sends to an encoder head. Which layer reads which is ``reads``, the one rule composition scores
and path patching follow too. A model of several towers that do not meet in a cross-attention (CLIP) is
refused (``check_one_stream``).
"""

from __future__ import annotations

import csv
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from headlab import display
from headlab.heads import head_label
from headlab.models import AttentionSite, HeadedModel

INPUT = "input"  # the sender that is the stream before the first layer
OUTPUT = "output"  # the receiver that is the stream the output reads
ROLES = ("q", "k", "v")

Sender = str | tuple[int, int]  # INPUT, or (layer, head)
Receiver = str | tuple[int, int, str]  # OUTPUT, or (layer, head, role): a key/value head for k and v


@dataclass(frozen=True)
class Edge:
    """One edge of the graph (see the module docstring).

    Attributes:
        sender: ``INPUT`` or ``(layer, head)``.
        receiver: ``OUTPUT`` or ``(layer, head, role)``, role in ``ROLES`` (head: a key/value head for k, v).
    """

    sender: Sender
    receiver: Receiver

    @property
    def label(self) -> str:
        """``"L0H3 → L1H2.k"``, ``"input → L0H1.q"``, ``"L1H0 → output"``."""
        return f"{node_label(self.sender)} → {node_label(self.receiver)}"

    @property
    def role(self) -> str | None:
        """The receiver's input (q, k, v), or None for the output."""
        return None if isinstance(self.receiver, str) else self.receiver[2]

    def to_dict(self) -> dict[str, Any]:
        sender = self.sender if isinstance(self.sender, str) else {"layer": self.sender[0], "head": self.sender[1]}
        receiver: Any = self.receiver
        if not isinstance(receiver, str):
            receiver = {"layer": receiver[0], "head": receiver[1], "role": receiver[2]}
        return {"sender": sender, "receiver": receiver, "label": self.label}


def receiving(receiver: Receiver) -> tuple[int, int, str]:
    """``(layer, head, role)`` of a receiver that is a head's input.

    Raises:
        ValueError: the receiver is the output.
    """
    if isinstance(receiver, str):
        raise ValueError(f"{receiver!r} is not a head's input")
    return receiver


def sending(sender: Sender) -> tuple[int, int]:
    """``(layer, head)`` of a sender that is a head.

    Raises:
        ValueError: the sender is the input.
    """
    if isinstance(sender, str):
        raise ValueError(f"{sender!r} is not a head")
    return sender


def role_heads(site: AttentionSite, role: str) -> int:
    """How many receivers a role has in ``site``: every query head's q, every key/value head's k and v."""
    return site.n_heads if role == "q" else site.n_kv_heads


class Stacked(Protocol):
    """What ``reads`` needs of a layer: its stack, and whether it is a cross-attention (an ``AttentionSite``)."""

    @property
    def stack(self) -> str: ...

    @property
    def cross(self) -> bool: ...


class Layer(NamedTuple):
    """A layer as the graph sees it: its heads, key/value heads, stack and kind (what the edges' cache keys on)."""

    n_heads: int
    n_kv_heads: int
    stack: str
    cross: bool


def read_stack(sites: Sequence[Stacked], layer: int, role: str) -> str:
    """The stack whose stream layer ``layer``'s ``role`` input reads: its own, or for a cross-attention's k and v
    the other stack that ran last before it (an encoder-decoder's encoder)."""
    read = sites[layer]
    if read.cross and role in ("k", "v"):
        return next(site.stack for site in reversed(sites[:layer]) if site.stack != read.stack)
    return read.stack


def reads(sites: Sequence[Stacked], sender: int, receiver: int, role: str) -> bool:
    """Whether layer ``receiver``'s heads read what layer ``sender``'s heads write through their ``role`` input.

    In a model of one stream: a later layer reads every earlier one. In a model of several stacks each writes its
    own stream (``AttentionSite.stack``): a layer reads the earlier layers of the stream it reads (``read_stack``),
    so a cross-attention's keys and values read every encoder head (run before it), through the encoder's output,
    and its q the decoder's stream.
    """
    return sender < receiver and sites[sender].stack == read_stack(sites, receiver, role)


def input_of(sites: Sequence[Stacked], stack: str) -> str:
    """The input sender of ``stack``'s stream: ``INPUT`` for the first stack's (the model's input), ``"<stack>
    input"`` for a later one's (an encoder-decoder's ``"decoder input"``: the target's embeddings)."""
    return INPUT if stack == sites[0].stack else f"{stack} input"


def input_layers(sites: Sequence[AttentionSite]) -> dict[str, int]:
    """``{input sender: the first layer of its stack}``: an input sends the stream that layer's heads read, in the
    order of the stacks' first layers."""
    firsts: dict[str, int] = {}
    for site in sites:
        firsts.setdefault(input_of(sites, site.stack), site.layer)
    return firsts


def output_stack(sites: Sequence[Stacked]) -> str:
    """The stack whose stream the output reads: the stack of the cross-attention (an encoder-decoder's decoder), else
    the only one."""
    return next((site.stack for site in sites if site.cross), sites[0].stack)


def check_one_stream(model: HeadedModel) -> None:
    """Refuse a model whose heads write streams the graph cannot join: several towers that meet in no
    cross-attention (CLIP), or more than two stacks. One stream, or an encoder-decoder's two, are served.

    Raises:
        ValueError: naming the model's stacks and what is expected.
    """
    stacks = sorted({site.stack for site in model.sites})
    crossed = any(site.cross for site in model.sites)
    if len(stacks) < 2 or (len(stacks) == 2 and crossed):
        return
    raise ValueError(f"{model.architecture} has several towers (stacks {stacks}), each its own residual stream, "
                     "joined by no cross-attention: the graph of edge attribution, edge patching and circuits is one "
                     "stream's or an encoder-decoder's two; attach one tower alone (CLIP's CLIPVisionModel or "
                     "CLIPTextModel, a multimodal model's language model)")


def output_writers(sites: Sequence[AttentionSite]) -> list[AttentionSite]:
    """The sites whose heads write the stream the output reads (``output_stack``): an encoder-decoder's decoder (its
    self- and cross-attention layers), else every site."""
    stack = output_stack(sites)
    return [site for site in sites if site.stack == stack]


def node_label(node: Sender | Receiver) -> str:
    """``"input"``, ``"L0H3"``, ``"L1H2.k"``, ``"output"``."""
    if isinstance(node, str):
        return node
    label = head_label(node[0], node[1])
    return label if len(node) == 2 else f"{label}.{node[2]}"


def graph_edges(model: HeadedModel, *, roles: Sequence[str] = ROLES, output: bool = True) -> list[Edge]:
    """Every edge of ``model``'s graph, in a fixed order: by receiver (layer, role, head; the output last),
    then by sender (the input of the stream it reads, then that stream's heads by layer and head).

    Args:
        model: a ``HeadedModel``.
        roles: the receivers' inputs to include.
        output: include the edges into the output.

    Raises:
        ValueError: an unknown role, or a model whose streams the graph does not join (``check_one_stream``).
    """
    check_one_stream(model)
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise ValueError(f"roles={tuple(roles)!r}; expected one or more of {ROLES}")
    return list(_edges(graph_layers(model), tuple(r for r in ROLES if r in roles), output))


def graph_layers(model: HeadedModel) -> tuple[Layer, ...]:
    """Every layer of ``model`` as the graph sees it (``Layer``)."""
    return tuple(Layer(site.n_heads, site.n_kv_heads, site.stack, site.cross) for site in model.sites)


def stream_senders(layers: Sequence[Layer], stack: str, *, before: int | None = None) -> list[Sender]:
    """The senders into ``stack``'s stream: its input, then its layers' heads by layer and head (those of layers before
    ``before`` alone, where given): the edges' order, and the rows edge attribution and a circuit's forward stack."""
    last = len(layers) if before is None else before
    return [input_of(layers, stack), *((layer, h) for layer in range(last) if layers[layer].stack == stack
                                       for h in range(layers[layer].n_heads))]


def receiver_senders(layers: Sequence[Layer], receiver: Receiver) -> list[Sender]:
    """The senders of every edge into ``receiver``, in the edges' order."""
    if receiver == OUTPUT:
        return stream_senders(layers, output_stack(layers))
    layer, _, role = receiving(receiver)
    return stream_senders(layers, read_stack(layers, layer, role), before=layer)


@functools.lru_cache(maxsize=32)
def _edges(layers: tuple[Layer, ...], roles: tuple[str, ...], output: bool) -> tuple[Edge, ...]:
    """The edges of a graph of ``layers`` (kept: a model's graph is asked for often)."""
    edges: list[Edge] = []
    for layer, site in enumerate(layers):
        for role in roles:
            senders = receiver_senders(layers, (layer, 0, role))
            count = site.n_heads if role == "q" else site.n_kv_heads
            edges += [Edge(sender, (layer, head, role)) for head in range(count) for sender in senders]
    if output:
        edges += [Edge(sender, OUTPUT) for sender in receiver_senders(layers, OUTPUT)]
    return tuple(edges)


def check_edges(model: HeadedModel, edges: Sequence[Edge]) -> None:
    """Raise unless every edge is an edge of ``model``'s graph.

    Raises:
        ValueError: the first few edges that are not, and why an edge may not be.
    """
    known = set(graph_edges(model))
    unknown = [edge.label for edge in edges if edge not in known]
    if unknown:
        raise ValueError(f"edges {unknown[:3]} are not edges of this model's graph (a sender must be in an earlier "
                         "layer than its receiver; k and v receivers are key/value heads)")


@dataclass(repr=False)
class EdgeScores(display.Shown):
    """A score for each edge: the metric's change when the edge carries the clean run's value into the
    corrupted run (denoising; or the corrupted value into the clean run: noising).

    Attributes:
        method: "eap", "eap-ig", "edge patching" or "path patching".
        edges: the scored edges.
        scores: ``(len(edges),)``: the metric's change (exact or estimated), unnormalised.
        clean_metric, corrupted_metric: the metric on the two unpatched runs.
        forwards, backwards: the passes run.
        seconds: wall time.
        details: what else the method reports (e.g. its integration steps).
    """

    method: str
    edges: list[Edge]
    scores: np.ndarray
    clean_metric: float
    corrupted_metric: float
    forwards: int
    backwards: int
    seconds: float
    details: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if len(self.scores) != len(self.edges):
            raise ValueError(f"{len(self.scores)} scores for {len(self.edges)} edges")

    @functools.cached_property
    def _index(self) -> dict[Edge, int]:
        """Each edge's position (made when an edge is first looked up)."""
        return {edge: i for i, edge in enumerate(self.edges)}

    def __len__(self) -> int:
        return len(self.edges)

    def __getitem__(self, edge: Edge) -> float:
        """The score of ``edge``.

        Raises:
            KeyError: an edge that was not scored.
        """
        if edge not in self._index:
            raise KeyError(f"{edge.label} was not scored ({self.method} scored {len(self.edges)} edges)")
        return float(self.scores[self._index[edge]])

    @property
    def effects(self) -> np.ndarray:
        """The scores as shares of the clean − corrupted gap."""
        gap = self.clean_metric - self.corrupted_metric
        return self.scores / gap if gap else np.full_like(self.scores, np.nan)

    def top(self, k: int, *, absolute: bool = True) -> list[Edge]:
        """The ``k`` edges with the largest scores (by magnitude unless ``absolute=False``), largest first.

        Raises:
            ValueError: k is not a positive int.
        """
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k={k!r}; expected a positive int")
        keys = np.abs(self.scores) if absolute else self.scores
        order = np.argsort(-keys, kind="stable")[:k]
        return [self.edges[i] for i in order]

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "clean_metric": self.clean_metric, "corrupted_metric": self.corrupted_metric,
                "forwards": self.forwards, "backwards": self.backwards, "seconds": self.seconds,
                "details": self.details or {},
                "edges": [{**edge.to_dict(), "score": float(score), "effect": float(effect)}
                          for edge, score, effect in zip(self.edges, self.scores, self.effects)]}

    def write(self, folder: str | Path, *, name: str | None = None) -> list[Path]:
        """Write ``<name>.json`` (``to_dict``) and ``<name>.csv`` (one row per edge) into ``folder``.

        Returns:
            The paths written.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        stem = name or self.method.replace(" ", "_")
        json_path, csv_path = folder / f"{stem}.json", folder / f"{stem}.csv"
        json_path.write_text(json.dumps(self.to_dict(), indent=1))
        with csv_path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sender", "receiver", "role", "score", "effect"])
            for edge, score, effect in zip(self.edges, self.scores, self.effects):
                writer.writerow([node_label(edge.sender), node_label(edge.receiver), edge.role or "",
                                 f"{score:.6g}", f"{effect:.6g}"])
        return [json_path, csv_path]

    # --- how it shows (display.Shown) ---
    def _title(self) -> str:
        return f"EdgeScores: {self.method}, {len(self.edges)} edges"

    def _facts(self) -> list[tuple[str, object]]:
        top = [f"{edge.label} {display.short(self[edge])}" for edge in self.top(min(3, len(self.edges)))]
        clean, corrupted = display.short(self.clean_metric), display.short(self.corrupted_metric)
        return [("largest |score|", ", ".join(top) or "none"), ("metric", f"clean {clean}, corrupted {corrupted}"),
                ("passes", f"{self.forwards} forwards, {self.backwards} backwards, {self.seconds:.2f} s")]

    def _parts(self) -> list[str]:
        rows = [[edge.label, display.short(self[edge]), display.short(float(self.effects[self._index[edge]]))]
                for edge in self.top(min(10, len(self.edges)))]
        return [display.table(["edge", "score", "effect"], rows)]
