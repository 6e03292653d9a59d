"""The figures of ``headlab.circuits.circuit``: a circuit as a graph of heads, and a faithfulness curve.

The graph: one row per layer (the input below the first, the output above the last), every head a faint
dot and the heads the circuit touches labelled; an edge runs from its sender to its receiver, ending at
the receiver's q (left), k (middle) or v (right), its width ∝ |score|, its colour its role and its
line solid for a positive score, dashed for a negative one. With grouped-query attention a key/value
head (``L1 KV0``) is drawn at the middle of the query heads that read it (consecutive groups, as
transformers' ``repeat_kv`` makes them).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from headlab.circuits.graph import Edge, node_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure


class Drawn(Protocol):
    """What the graph figure reads of a ``headlab.circuits.circuit.Circuit``."""

    method: str
    edges: list[Edge]
    scores: np.ndarray
    scored: int
    heads: list[tuple[int, int]] | None
    faithfulness: float | None

    def __len__(self) -> int: ...


class Curve(Protocol):
    """What the curve's figure reads of a ``headlab.circuits.circuit.FaithfulnessCurve``."""

    method: str
    sizes: list[int]
    faithfulness: np.ndarray
    scored: int

COLOURS = {"q": "#2166ac", "k": "#e08214", "v": "#1b7837", "output": "#762a83"}  # by the receiver's role
_SHIFT = {"q": -0.2, "k": 0.0, "v": 0.2, "output": 0.0}  # where on the receiver an edge ends
SUFFIXES = (".png", ".svg")

__all__ = ["COLOURS", "plot_circuit", "plot_faithfulness"]


def plot_circuit(circuit: Drawn, path: str | Path) -> Path:
    """Draw ``circuit`` as a graph of heads (see the module docstring), as a PNG or SVG by ``path``'s suffix.

    Returns:
        ``path``.

    Raises:
        ValueError: a suffix other than .png and .svg.
    """
    path = _checked(path)
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch

    heads = circuit.heads or []
    layers, widest = len(heads), max((q for q, _ in heads), default=1)
    fig = _figure(min(16.0, max(6.0, 0.9 * widest + 2.5)), min(14.0, max(4.0, 0.8 * (layers + 2) + 1.2)))
    ax = fig.add_subplot()

    def place(node: Any, role: str | None = None) -> tuple[float, float]:
        """Where a node sits: ``INPUT``/``OUTPUT`` centred below/above the layers (an encoder-decoder's decoder input
        below, to the right), a head in its row."""
        if isinstance(node, str):
            return (0.0, float(layers)) if node == "output" else (0.0 if node == "input" else widest / 2 + 1, -1.0)
        layer, head = node[0], node[1]
        n_query, n_kv = heads[layer] if layer < layers else (head + 1, head + 1)
        if role in ("k", "v") and n_kv < n_query:
            head = (head + 0.5) * n_query / n_kv - 0.5  # the middle of the group reading this key/value head
        return head - (n_query - 1) / 2, float(layer)

    for layer, (n_query, _) in enumerate(heads):
        ax.scatter(np.arange(n_query) - (n_query - 1) / 2, np.full(n_query, layer), s=18, color="#d0d0d0", zorder=1)
    largest = float(np.abs(circuit.scores).max()) if len(circuit) else 1.0
    for i in np.argsort(np.abs(circuit.scores), kind="stable"):  # the largest drawn last, on top
        edge, score = circuit.edges[i], float(circuit.scores[i])
        role = edge.role or "output"
        x0, y0 = place(edge.sender)
        x1, y1 = place(edge.receiver, role)
        ax.add_patch(FancyArrowPatch(
            (x0, y0 + 0.15), (x1 + _SHIFT[role], y1 - 0.15), arrowstyle="-|>", mutation_scale=9,
            connectionstyle="arc3,rad=0.12", color=COLOURS[role], alpha=0.85, zorder=2,
            linewidth=0.6 + 4.4 * abs(score) / (largest or 1.0), linestyle="-" if score >= 0 else "--"))
    labels: dict[tuple[float, float], str] = {}  # every node an edge touches, where it is drawn
    for edge in circuit.edges:
        labels[place(edge.sender)] = node_label(edge.sender)
        if isinstance(edge.receiver, str):
            labels[place(edge.receiver)] = edge.receiver
            continue
        layer, head, role = edge.receiver
        grouped = role != "q" and heads[layer][1] < heads[layer][0]
        labels[place(edge.receiver[:2], role)] = f"L{layer} KV{head}" if grouped else node_label((layer, head))
    for (x, y), label in labels.items():
        ax.text(x, y, label, ha="center", va="center", fontsize=7, zorder=3,
                bbox=dict(boxstyle="round,pad=0.25", facecolor="#eeeeee" if label in ("input", "output") else "white",
                          edgecolor="#333333", linewidth=0.8))
    ax.set_xlim(-widest / 2 - 0.8, widest / 2 + 0.8)
    ax.set_ylim(-1.6, layers + 0.6)
    ax.set_yticks(range(-1, layers + 1), ["input", *(f"layer {layer}" for layer in range(layers)), "output"])
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [Line2D([], [], color=c, linewidth=2.5, label=f"→ {r}" if r != "output" else "→ output")
               for r, c in COLOURS.items()]
    handles += [Line2D([], [], color="black", linestyle="-", label="positive"),
                Line2D([], [], color="black", linestyle="--", label="negative")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    measured = "" if circuit.faithfulness is None else f", faithfulness {circuit.faithfulness:.3g}"
    scored = f" of {circuit.scored:,}" if circuit.scored else ""
    ax.set_title(f"{len(circuit)} edges{scored}" + (f" by {circuit.method}" if circuit.method else "") + measured,
                 fontsize=10)
    return _save(fig, path)


def plot_faithfulness(curve: Curve, path: str | Path) -> Path:
    """The faithfulness of each circuit against its size (a symmetric-log axis, so the empty circuit shows),
    as a PNG or SVG by ``path``'s suffix.

    Raises:
        ValueError: a suffix other than .png and .svg.
    """
    path = _checked(path)
    fig = _figure(6.0, 3.8)
    ax = fig.add_subplot()
    ax.axhline(1.0, color="#888888", linestyle="--", linewidth=0.8, label="the model (every edge)")
    ax.axhline(0.0, color="#888888", linestyle=":", linewidth=0.8, label="corrupted")
    ax.plot(curve.sizes, curve.faithfulness, marker="o", markersize=4, color=COLOURS["q"], label=curve.method)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(left=0)
    ax.set_xlabel(f"edges in the circuit (top |score|, of {curve.scored:,})")
    ax.set_ylabel("faithfulness")
    ax.legend(fontsize=8, frameon=False)
    return _save(fig, path)


def _checked(path: str | Path) -> Path:
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(f"{str(path)!r}: expected a file name ending in {' or '.join(SUFFIXES)}")
    return path


def _figure(width: float, height: float) -> Figure:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".svg":
        fig.savefig(path, metadata={"Date": None})  # the same circuit writes the same file
    else:
        fig.savefig(path, dpi=120)
    return path
