"""Q-, K- and V-composition scores between heads, from their weights (Elhage et al. 2021, "A Mathematical
Framework for Transformer Circuits").

Axis legend:
    scores    (sender layer, sender head, receiver layer, receiver head)   NaN where no edge
    baseline  (sender layer, receiver layer)                               mean or std of random scores
    W_OV      (d_model, d_model) per head: x ↦ x W_V W_O, what a head writes when it reads x (row vectors)
    W_QK      (d_model, d_model) per head: a query x_q and key x_k score x_q W_Q W_Kᵀ x_kᵀ

A head in an earlier layer (the sender) writes ``x W_OV`` into the residual stream; a later head (the
receiver) reads the stream for its query, its key or its value. How much of what the sender can write
the receiver reads is measured by the Frobenius norm of the product, relative to the two norms:

    score = ‖W_OV(sender) M‖_F / (‖W_OV(sender)‖_F ‖M‖_F)
    M = W_QK(receiver) (Q-composition: the sender's output is the receiver's query input)
        W_QK(receiver)ᵀ (K-composition: ... its key input)
        W_OV(receiver) (V-composition: ... its value input)

as TransformerLens' ``all_composition_scores`` computes it (its ``OV @ QK``, ``OV @ QK.T``, ``OV @ OV``).
A score is at most 1; unrelated matrices of low rank score low but not zero, so each score is read against
a baseline: the same score for pairs of random Gaussian matrices of the same shapes and ranks (seeded).

The score is of the weights alone. It ignores the norms between the two heads and their scales (the
receiver's input norm, its weight and centring), rotary positions and other position terms, every bias,
the MLPs and the heads between the sender and the receiver, and what the heads attend to on any input.
A high score says the receiver *can* read the sender's output; whether it does is a question for path
patching.

Cost: per head a thin QR of each factor (d_model × d_head), then per pair of heads in different layers
an (r × d_model) · (d_model × r) product and two r × r products (r = d_head): for L layers of H heads about
(L H)² / 2 · 2 r² d_model multiply-adds per kind, on the weights' device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from headlab import display
from headlab.circuits.graph import reads
from headlab.heads import head_label
from headlab.layer import FactoredMatrix
from headlab.models import HeadedModel
from headlab.models.handle import headed

__all__ = ["KINDS", "CompositionScores", "Composition", "composition_scores", "plot_composition"]

KINDS = ("q", "k", "v")
_CHUNK = 8  # random pairs drawn at once for the baseline
Basis = tuple[Tensor, Tensor]  # (L, C) of M = L C Rᵀ: orthonormal columns (head, d, r) and the core (head, r, r)


@dataclass(frozen=True)
class Composition:
    """One sender → receiver score.

    Attributes:
        kind: "q", "k" or "v".
        sender, receiver: ``(layer, head)``.
        score: the composition score.
        z: ``(score − baseline mean) / baseline std``: how far above chance.
        ratio: ``score / baseline mean``.
    """

    kind: str
    sender: tuple[int, int]
    receiver: tuple[int, int]
    score: float
    z: float
    ratio: float

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "sender": list(self.sender), "receiver": list(self.receiver),
                "score": _json(self.score), "z": _json(self.z), "ratio": _json(self.ratio)}


@dataclass(repr=False)
class CompositionScores(display.Shown):
    """Composition scores of every pair of heads in different layers, per kind, with their random baseline.

    Attributes:
        kinds: the kinds computed, of ``KINDS``.
        scores: kind → ``(n_layers, max heads, n_layers, max heads)`` float64: sender layer, sender head,
            receiver layer, receiver head; NaN where the receiver's layer is not later, a head does not exist
            (a pruned layer) or a matrix is zero.
        baseline_mean, baseline_std: kind → ``(n_layers, n_layers)``: the random pairs' score per sender and
            receiver layer (NaN where no edge).
        n_heads: heads per layer.
        samples: random pairs per baseline.
        seed: the baseline's seed.
    """

    kinds: tuple[str, ...]
    scores: dict[str, np.ndarray]
    baseline_mean: dict[str, np.ndarray]
    baseline_std: dict[str, np.ndarray]
    n_heads: list[int]
    samples: int
    seed: int

    def zscores(self, kind: str) -> np.ndarray:
        """``(score − baseline mean) / baseline std``, shaped as ``scores[kind]``."""
        kind = self._kind(kind)
        return (self.scores[kind] - self.baseline_mean[kind][:, None, :, None]) \
            / self.baseline_std[kind][:, None, :, None]

    def edges(self, kind: str) -> list[Composition]:
        """Every edge of ``kind`` with a score, senders and receivers in layer order."""
        kind = self._kind(kind)
        return [self._edge(kind, index) for index in zip(*np.nonzero(~np.isnan(self.scores[kind])))]

    def top(self, kind: str, k: int = 10, *, sender: tuple[int, int] | None = None,
            receiver: tuple[int, int] | None = None) -> list[Composition]:
        """The ``k`` highest-scoring edges of ``kind``, of one sender or one receiver when given.

        Raises:
            ValueError: a kind not computed, or a sender or receiver the model does not have.
        """
        kind = self._kind(kind)
        scores = self.scores[kind]
        keep = ~np.isnan(scores)
        for name, head, first_axis in (("sender", sender, 0), ("receiver", receiver, 2)):
            if head is None:
                continue
            layer, h = head
            if not (0 <= layer < len(self.n_heads) and 0 <= h < self.n_heads[layer]):
                raise ValueError(f"{name}={head!r}: the model has layers 0–{len(self.n_heads) - 1} with heads "
                                 f"{self.n_heads}")
            only = np.zeros_like(keep)
            only[(slice(None),) * first_axis + (layer, h)] = True
            keep &= only
        flat = np.where(keep, scores, -np.inf).ravel()
        order = np.argsort(-flat, kind="stable")[: min(k, int(keep.sum()))]
        return [self._edge(kind, np.unravel_index(i, scores.shape)) for i in order]

    def _edge(self, kind: str, index: tuple[Any, ...]) -> Composition:
        i, a, j, b = (int(n) for n in index)
        score = float(self.scores[kind][i, a, j, b])
        mean, std = float(self.baseline_mean[kind][i, j]), float(self.baseline_std[kind][i, j])
        return Composition(kind, (i, a), (j, b), score, (score - mean) / std if std > 0 else math.nan,
                    score / mean if mean > 0 else math.nan)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the baseline per kind and every edge (NaN as None)."""
        return {"kinds": list(self.kinds), "n_heads": self.n_heads, "samples": self.samples, "seed": self.seed,
                "baseline": {kind: {"mean": _json(float(np.nanmean(self.baseline_mean[kind])))
                                    if self.edges(kind) else None,
                                    "std": _json(float(np.nanmean(self.baseline_std[kind])))
                                    if self.edges(kind) else None} for kind in self.kinds},
                "edges": [e.to_dict() for kind in self.kinds for e in self.edges(kind)]}

    def _kind(self, kind: str) -> str:
        name = str(kind).lower()
        if name not in self.kinds:
            raise ValueError(f"kind {kind!r} was not computed; this result has {list(self.kinds)}")
        return name

    def _title(self) -> str:
        return (f"CompositionScores: {', '.join(k.upper() for k in self.kinds)} between {sum(self.n_heads)} heads "
                f"in {len(self.n_heads)} layers")

    def _facts(self) -> list[tuple[str, object]]:
        facts: list[tuple[str, object]] = []
        for kind in self.kinds:
            best = self.top(kind, 1)
            if not best:
                facts.append((f"{kind.upper()}-composition", "no pair of heads in different layers"))
                continue
            e = best[0]
            mean, std = float(np.nanmean(self.baseline_mean[kind])), float(np.nanmean(self.baseline_std[kind]))
            facts.append((f"{kind.upper()}-composition", f"top {head_label(*e.sender)} → {head_label(*e.receiver)} "
                          f"{display.short(e.score)} (z {display.short(e.z)}); chance {display.short(mean)} ± "
                          f"{display.short(std)}"))
        facts.append(("baseline", f"{self.samples} random pairs of the same shapes per layer pair, seed {self.seed}"))
        return facts

    def _parts(self) -> list[str]:
        rows = [[kind.upper(), head_label(*e.sender), head_label(*e.receiver), e.score, e.z, e.ratio]
                for kind in self.kinds for e in self.top(kind, 5)]
        if not rows:
            return []
        return [display.table(["kind", "sender", "receiver", "score", "z", "× chance"], rows, labels=3,
                              caption="the top edges of each kind")]


def composition_scores(model: HeadedModel | nn.Module, *, kinds: str | Sequence[str] = KINDS, samples: int = 32,
                       seed: int = 0) -> CompositionScores:
    """Q-, K- and V-composition scores between every head and every head of a later layer that reads its stream
    (``headlab.circuits.graph.reads``: in an encoder-decoder, encoder heads K- and V-compose with every
    cross-attention head, decoder heads with later decoder heads), from the sites' factored W_QK and W_OV (a
    grouped-query head's through the key/value head it reads).

    Weights only: norms and their scales, rotary positions, biases and the MLPs between the heads are
    ignored (see the module docstring).

    Args:
        model: a ``HeadedModel`` or an attached model (its q/k/v layout recognised).
        kinds: any of "q", "k", "v" (any case).
        samples: random pairs of matrices per baseline (≥ 1; 2 or more for a standard deviation).
        seed: the baseline's random draws.

    Returns:
        A ``CompositionScores``.

    Raises:
        ValueError: an unknown kind, ``samples`` < 1, or a site whose per-head weights are not known.
    """
    names = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    chosen = tuple(dict.fromkeys(str(k).lower() for k in names))
    unknown = [k for k in names if str(k).lower() not in KINDS]
    if unknown or not chosen:
        raise ValueError(f"kinds={kinds!r}: expected one or more of {KINDS}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples={samples!r}: expected an int ≥ 1 (random pairs per baseline)")
    handle = headed(model)
    sites = handle.sites
    n_layers, width = len(sites), max(site.n_heads for site in sites)
    with torch.no_grad():
        ov = [_bases(site.OV) for site in sites]  # per layer: (L, C, R) of each head's W_OV
        qk = [_bases(site.QK) for site in sites] if {"q", "k"} & set(chosen) else []
        scores = {kind: np.full((n_layers, width, n_layers, width), np.nan) for kind in chosen}
        means = {kind: np.full((n_layers, n_layers), np.nan) for kind in chosen}
        stds = {kind: np.full((n_layers, n_layers), np.nan) for kind in chosen}
        cache: dict[tuple[str, int, int, int], tuple[float, float]] = {}
        for j in range(1, n_layers):
            for kind in chosen:
                left, core = _receiver(kind, qk[j] if kind != "v" else ov[j])
                for i in range(j):
                    if not reads(sites, i, j, kind):
                        continue
                    _, sender_core, sender_out = ov[i]
                    if sender_out.shape[1] != left.shape[1]:  # layers of different widths: no shared stream
                        continue
                    block = _scores(sender_out, sender_core, left, core)  # (sender heads, receiver heads)
                    scores[kind][i, :block.shape[0], j, :block.shape[1]] = block
                    key = (kind, left.shape[1], sender_core.shape[-1], core.shape[-1])
                    if key not in cache:
                        cache[key] = _baseline(kind, key[1], key[2], key[3], samples=samples, seed=seed)
                    means[kind][i, j], stds[kind][i, j] = cache[key]
    return CompositionScores(chosen, scores, means, stds, [site.n_heads for site in sites], samples, seed)


def plot_composition(result: CompositionScores, path: str | Path, *, kinds: Sequence[str] | None = None) -> Path:
    """One heatmap per kind as a PNG: senders (rows, layers but the last) × receivers (columns, layers but the
    first), blank where no edge, lines between layers."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    names = [result._kind(k) for k in (kinds if kinds is not None else result.kinds)]
    heads = [(layer, h) for layer, n in enumerate(result.n_heads) for h in range(n)]
    senders = [h for h in heads if h[0] < len(result.n_heads) - 1]
    receivers = [h for h in heads if h[0] > 0]
    size = max(3.0, 0.12 * len(receivers) + 1.5)
    fig = Figure(figsize=(size * len(names) + 1, max(3.0, 0.12 * len(senders) + 1.5)), layout="constrained")
    grids = {kind: np.array([[result.scores[kind][i, a, j, b] for j, b in receivers] for i, a in senders])
             for kind in names}
    finite = [float(np.nanmax(g)) for g in grids.values() if g.size and not np.isnan(g).all()]
    peak = max(finite, default=1.0) or 1.0  # one colour scale for every kind
    image = None
    for n, kind in enumerate(names):
        ax = fig.add_subplot(1, len(names), n + 1)
        image = ax.imshow(grids[kind], cmap="Blues", vmin=0.0, vmax=peak, aspect="auto", interpolation="nearest")
        for line, group in ((ax.axhline, senders), (ax.axvline, receivers)):
            for k in range(1, len(group)):
                if group[k][0] != group[k - 1][0]:
                    line(k - 0.5, color="0.6", linewidth=0.6)
        ax.set_yticks(*_ticks(senders))
        ax.set_xticks(*_ticks(receivers))
        ax.set_ylabel("sender")
        ax.set_xlabel("receiver")
        chance = result.baseline_mean[kind]
        title = f"{kind.upper()}-composition"
        if not np.isnan(chance).all():
            title += f" (chance {display.short(float(np.nanmean(chance)))})"
        ax.set_title(title, fontsize="small")
    if image is not None:
        fig.colorbar(image, ax=fig.axes, label="composition score")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def _ticks(heads: list[tuple[int, int]]) -> tuple[list[float], list[str]]:
    """One tick per layer, at its first head."""
    first = [k for k, h in enumerate(heads) if k == 0 or h[0] != heads[k - 1][0]]
    return [float(k) for k in first], [f"L{heads[k][0]}" for k in first]


def _bases(matrix: FactoredMatrix) -> tuple[Tensor, Tensor, Tensor]:
    """``M = L C Rᵀ`` per head: L, R with orthonormal columns ``(head, d, r)``, C the core ``(head, r, r)`` (from
    thin QRs of the two factors, in float32 or wider); ``‖M‖_F = ‖C‖_F``."""
    dtype = torch.promote_types(matrix.A.dtype, torch.float32)
    q_a, r_a = torch.linalg.qr(matrix.A.detach().to(dtype))  # A = Q_A R_A
    q_b, r_b = torch.linalg.qr(matrix.B.detach().to(dtype).transpose(-1, -2))  # Bᵀ = Q_B R_B
    return q_a, r_a @ r_b.transpose(-1, -2), q_b


def _receiver(kind: str, bases: tuple[Tensor, Tensor, Tensor]) -> Basis:
    """The receiver's matrix M the sender's output enters on the left, as (its left basis, its core)."""
    left, core, right = bases
    if kind == "k":  # W_QKᵀ = R Cᵀ Lᵀ: the key side reads
        return right, core.transpose(-1, -2)
    return left, core


def _scores(sender_out: Tensor, sender_core: Tensor, left: Tensor, core: Tensor) -> np.ndarray:
    """``‖C_s (R_sᵀ L_r) C_r‖_F / (‖C_s‖_F ‖C_r‖_F)`` for every sender s and receiver r: ``(senders, receivers)``."""
    overlap = torch.einsum("sdr,tde->stre", sender_out, left.to(sender_out))  # (s, t, r_s, r_t)
    product = sender_core[:, None] @ overlap @ core.to(sender_core)[None]
    norms = torch.linalg.matrix_norm(sender_core)[:, None] * torch.linalg.matrix_norm(core)[None]
    score = torch.linalg.matrix_norm(product) / norms
    return score.where(norms > 0, torch.nan).double().cpu().numpy()


def _baseline(kind: str, d_model: int, rank_out: int, rank_in: int, *, samples: int,
              seed: int) -> tuple[float, float]:
    """Mean and std of the score of ``samples`` pairs of Gaussian matrices of the same shapes: a sender
    ``(d_model × rank_out)(rank_out × d_model)`` and a receiver of inner size ``rank_in``."""
    generator = torch.Generator().manual_seed(seed)
    values = []
    for start in range(0, samples, _CHUNK):
        n = min(_CHUNK, samples - start)
        sender = FactoredMatrix(torch.randn(n, d_model, rank_out, generator=generator),
                                torch.randn(n, rank_out, d_model, generator=generator))
        receiver = FactoredMatrix(torch.randn(n, d_model, rank_in, generator=generator),
                                  torch.randn(n, rank_in, d_model, generator=generator))
        _, sender_core, sender_out = _bases(sender)
        left, core = _receiver(kind, _bases(receiver))
        values.append(np.diagonal(_scores(sender_out, sender_core, left, core)))  # sample k with sample k
    drawn = np.concatenate(values)
    return float(drawn.mean()), float(drawn.std(ddof=1)) if samples > 1 else math.nan


def _json(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else value
