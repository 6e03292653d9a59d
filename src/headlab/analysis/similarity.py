"""How alike heads attend: pairwise Jensen–Shannon distances between heads, and an MDS map of them.

Clark et al. 2019 ("What Does BERT Look At?", §6) compare every pair of heads by the
Jensen–Shannon divergence between their attention distributions on the same tokens, and
embed the heads in 2-D with multidimensional scaling. Here the per-token quantity is the
Jensen–Shannon *distance* (the square root of the divergence, natural log, a metric in
``[0, sqrt(ln 2)]``), averaged over real query tokens.

Axis legend:
    patterns     (batch, head, query_pos, key_pos)  as ``CaptureBatch`` carries them
    rows         (head, row, key_pos)               the real query rows of a batch, flattened
    distances    (n, n)                             n = captured heads over all layers, in ``heads`` order

``HeadSimilarity`` is an accumulator (update / merge / result): it keeps an ``(n, n)`` float64
sum of distances and a count of rows per pair, so memory grows with heads², never with the corpus.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from headlab import display
from headlab.analysis.scratch import Scratch
from headlab.capture.batch import CaptureBatch
from headlab.capture.blocks import BLOCK_BYTES
from headlab.heads import head_label
from headlab.layer.pattern_rows import PatternRows

__all__ = ["HeadSimilarity", "MDSResult", "SimilarityResult", "js_distance", "mds", "plot_mds"]

MAX_JS_DISTANCE = math.sqrt(math.log(2.0))
# Elements per pair chunk, which bounds the pair loop's 3 float32 scratch buffers. On the CPU 4 MiB each: they stay
# in the last-level cache, which makes the loop ~1.7× faster than 16 MiB ones; on a GPU 16 MiB, fewer launches.
_CPU_CHUNK_ELEMENTS, _CHUNK_ELEMENTS = 1 << 20, 1 << 22


def js_distance(p: Tensor, q: Tensor) -> Tensor:
    """Jensen–Shannon distance between distributions along the last axis (natural log).

    ``sqrt(H(m) − (H(p) + H(q)) / 2)`` with ``m = (p + q) / 2`` and ``0·log 0 = 0``; tiny negative
    rounding is clamped to 0.

    Args:
        p, q: broadcastable tensors of probability rows ``(..., key_pos)``.

    Returns:
        ``(...)`` distances in ``[0, sqrt(ln 2)]``.
    """
    m = (p + q) / 2
    divergence = _entropy(m) - (_entropy(p) + _entropy(q)) / 2
    return divergence.clamp_min(0.0).sqrt()


def _entropy(p: Tensor) -> Tensor:
    return -torch.special.xlogy(p, p).sum(-1)


@dataclass(repr=False)
class SimilarityResult(display.Shown):
    """Mean JS distance between every pair of captured heads.

    Attributes:
        distances: ``(n, n)`` float64, symmetric, zero diagonal.
        heads: ``(layer, head)`` of each row/column.
        rows: real query rows the means stand for (the same for every pair): every real row seen.
        sampled: of those, the rows read (``rows`` when every row was read).
    """

    distances: np.ndarray
    heads: list[tuple[int, int]]
    rows: int
    sampled: int

    def to_dict(self) -> dict[str, Any]:
        return {"heads": [list(h) for h in self.heads], "distances": self.distances.tolist(), "rows": self.rows,
                "sampled": self.sampled}

    def _title(self) -> str:
        return f"SimilarityResult: Jensen–Shannon distances between {len(self.heads)} heads"

    def _facts(self) -> list[tuple[str, object]]:
        facts: list[tuple[str, object]] = [("query rows", f"{self.sampled:,} read of {self.rows:,}")]
        if len(self.heads) > 1:
            upper = np.triu_indices(len(self.heads), k=1)
            pairs = self.distances[upper]
            for label, k in (("closest", int(np.argmin(pairs))), ("farthest", int(np.argmax(pairs)))):
                a, b = self.heads[upper[0][k]], self.heads[upper[1][k]]
                facts.append((label, f"{head_label(*a)} and {head_label(*b)}: {display.short(float(pairs[k]))}"))
            facts.append(("mean distance", float(pairs.mean())))
        return facts


class HeadSimilarity:
    """Sums of per-row JS distances between every pair of captured heads, over real query rows.

    Every batch must carry patterns of the same heads (the first batch fixes them). Padded
    query rows are excluded through ``attention_mask``.

    Args:
        row_fraction: average over a seeded uniform sample of this share of each batch's real query rows
            (rounded up: at least one row), at a fraction of the all-pairs cost; None uses every row. A
            batch's sampled rows stand for all of its rows (each weighs its real rows over its sample), so
            the estimate is an unbiased one of the mean over every real row whatever the batches.
        seed: seeds the sample; batch k draws with seed + k, so a run is reproducible.

    Raises:
        ValueError: ``row_fraction`` is not a number in (0, 1].
    """

    READS_ROW_BLOCKS = True  # where the patterns are PatternRows, its sampled rows are formed a block at a time

    def __init__(self, *, row_fraction: float | None = None, seed: int = 0) -> None:
        if row_fraction is not None and (isinstance(row_fraction, bool) or not isinstance(row_fraction, (int, float))
                                         or not 0 < row_fraction <= 1):
            raise ValueError(f"row_fraction={row_fraction!r}; expected a number in (0, 1] or None")
        self.row_fraction, self.seed, self.batches_seen = row_fraction, seed, 0
        self.heads: list[tuple[int, int]] | None = None
        self.sums: np.ndarray | None = None  # (n, n) float64: Σ over sampled rows of weight × distance
        self.counts: np.ndarray | None = None  # (n, n) float64: real rows seen per pair
        self.sampled = 0  # rows read
        self._scratch = Scratch()

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch (its layers must carry patterns, whole or as ``PatternRows``): the heads of its first view
        (``CaptureBatch.views``), as heads compare on the same query rows and keys: a batch of texts whole; of pairs,
        the encoder's heads (when no encoder layer was captured, the decoder's self-attention heads, else the
        cross-attention heads)."""
        batch = next(iter(batch.views()), batch)
        heads: list[tuple[int, int]] = []
        sources: list[Tensor | PatternRows] = []
        for layer, taken in sorted(batch.layers.items()):
            source = taken.pattern if taken.pattern is not None else taken.pattern_rows
            if source is None:
                raise ValueError(f"layer {layer} was captured without patterns; capture with take=('pattern',)")
            heads += [(layer, h) for h in taken.heads]
            sources.append(source)
        if not heads:
            raise ValueError("the batch carries no captured layer")
        self._check_heads(heads)
        self.batches_seen += 1
        item, query, n_real = self._sample(batch)
        sums = np.zeros((len(heads), len(heads)))
        for rows in _sampled_rows(sources, item, query):  # (head, row, key_pos) each
            sums += self._pair_sums(rows)
        self.sampled += len(item)
        # the sample stands for every real row
        self._add(sums * (n_real / max(len(item), 1)), np.full((len(heads), len(heads)), float(n_real)))

    def _pair_sums(self, rows: Tensor) -> np.ndarray:
        """``(head, head)``: Σ over the rows of each pair of heads' JS distance, of ``rows`` ``(head, row, key_pos)``
        (every head's patterns on the same rows)."""
        n, n_rows = rows.shape[0], rows.shape[1]
        # In the rows' dtype (float32): with s = p + q, H(m) = ½·ln2·(Σp + Σq) − ½·Σ s ln s, so each
        # pair costs one add, one log and one dot product; entropies are ~1e-7-exact, a floor of
        # ~1e-3 on the distance of near-identical heads (distances between real heads are ~0.1–0.8).
        log_rows = rows.clamp_min(torch.finfo(rows.dtype).tiny).log()
        entropy = -torch.einsum("hrk,hrk->hr", rows, log_rows).double()  # (head, row)
        mass = rows.sum(-1).double()  # (head, row): 1, or 0 for a row that saw no key
        sums = np.zeros((n, n))
        i, j = torch.triu_indices(n, n, offset=1)  # on the CPU, where the sums are
        on_rows = i.to(rows.device), j.to(rows.device)  # the same, where the rows are
        elements = _CPU_CHUNK_ELEMENTS if rows.device.type == "cpu" else _CHUNK_ELEMENTS
        chunk = max(1, elements // (n_rows * rows.shape[2]))
        for start in range(0, len(i), chunk):
            at = slice(start, start + chunk)
            a, b = on_rows[0][at], on_rows[1][at]
            shape = (len(a), n_rows, rows.shape[2])  # (pairs, row, key_pos)
            s = torch.index_select(rows, 0, a, out=self._scratch.take(shape, dtype=rows.dtype, device=rows.device))
            s += torch.index_select(rows, 0, b, out=self._scratch.take(shape, dtype=rows.dtype, device=rows.device,
                                                                          slot=1))
            log_s = torch.clamp_min(s, torch.finfo(s.dtype).tiny, out=self._scratch.take(
                shape, dtype=rows.dtype, device=rows.device, slot=2)).log_()
            s_log_s = log_s.mul_(s).sum(-1).double()
            mixed = 0.5 * math.log(2.0) * (mass[a] + mass[b]) - 0.5 * s_log_s  # H((p + q) / 2)
            divergence = mixed - (entropy[a] + entropy[b]) / 2  # (pairs, row)
            sums[i[at].numpy(), j[at].numpy()] = divergence.clamp_min(0.0).sqrt().sum(-1).cpu().numpy()
        return sums + sums.T

    def _sample(self, batch: CaptureBatch) -> tuple[Tensor, Tensor, int]:
        """``(item, query, n_real)``: the sampled real query rows of a batch (every one without ``row_fraction``),
        drawn with seed + batches seen, and how many real rows it has."""
        item, query = batch.attention_mask.bool().nonzero(as_tuple=True)  # the real query rows, in row-major order
        n_real = len(item)
        n_read = n_real if self.row_fraction is None else math.ceil(self.row_fraction * n_real)
        if n_read < n_real:
            generator = torch.Generator().manual_seed(self.seed + self.batches_seen)
            pick = torch.randperm(n_real, generator=generator)[:n_read].to(item.device)
            item, query = item[pick], query[pick]
        return item, query, n_real

    def merge(self, other: HeadSimilarity) -> HeadSimilarity:
        """Fold another accumulator's sums into this one; returns self."""
        if other.heads is None or other.sums is None or other.counts is None:  # it has seen no batch
            return self
        self._check_heads(other.heads)
        self._add(other.sums, other.counts)
        self.sampled += other.sampled
        return self

    def result(self) -> SimilarityResult:
        """The mean distance matrix.

        Raises:
            ValueError: nothing was accumulated.
        """
        if self.heads is None or self.sums is None or self.counts is None:
            raise ValueError("HeadSimilarity has seen no batch")
        distances = np.divide(self.sums, self.counts, out=np.zeros_like(self.sums), where=self.counts > 0)
        return SimilarityResult(distances=distances, heads=list(self.heads), rows=int(self.counts.max()),
                                sampled=self.sampled)

    def _check_heads(self, heads: list[tuple[int, int]]) -> None:
        if self.heads is None:
            self.heads = list(heads)
        elif list(heads) != self.heads:
            raise ValueError(f"heads {heads[:4]}… differ from the accumulated {self.heads[:4]}… ({len(self.heads)})")

    def _add(self, sums: np.ndarray, counts: np.ndarray) -> None:
        self.sums = sums.copy() if self.sums is None else self.sums + sums
        self.counts = counts.copy() if self.counts is None else self.counts + counts


@dataclass
class MDSResult:
    """A metric MDS embedding.

    Attributes:
        coords: ``(n, dim)`` coordinates, centred.
        stress: Kruskal's stress-1, ``sqrt(Σ (d_ij − D_ij)² / Σ D_ij²)`` over pairs (0 = exact).
        iterations: SMACOF iterations run.
    """

    coords: np.ndarray
    stress: float
    iterations: int

    def to_dict(self) -> dict[str, Any]:
        return {"coords": self.coords.tolist(), "stress": self.stress, "iterations": self.iterations}


def mds(
    distances: np.ndarray, *, dim: int = 2, seed: int = 0, max_iter: int = 1000, tol: float = 1e-9,
) -> MDSResult:
    """Metric MDS by SMACOF (de Leeuw 1977; Borg & Groenen, *Modern MDS*, ch. 8), unit weights.

    Starts from classical (Torgerson) scaling, plus a tiny seeded jitter so that degenerate
    starts (repeated points) can move, then iterates the Guttman transform
    ``X ← B(X) X / n`` until raw stress improves by less than ``tol`` (relative).

    Args:
        distances: ``(n, n)`` symmetric, non-negative dissimilarities.
        dim: embedding dimension.
        seed: seeds the jitter.
        max_iter: most iterations.
        tol: relative stress improvement under which iteration stops.

    Returns:
        Coordinates ``(n, dim)`` and stress-1.

    Raises:
        ValueError: ``distances`` is not square, symmetric and non-negative, or dim < 1.
    """
    D = np.asarray(distances, dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != D.shape[1]:
        raise ValueError(f"distances must be a square matrix, got shape {D.shape}")
    if not np.allclose(D, D.T, atol=1e-10) or (D < 0).any() or not np.isfinite(D).all():
        raise ValueError("distances must be symmetric, finite and non-negative")
    if dim < 1:
        raise ValueError(f"dim={dim} must be at least 1")
    n = D.shape[0]
    if n <= 1:
        return MDSResult(np.zeros((n, dim)), 0.0, 0)
    X = _classical(D, dim)
    scale = np.sqrt((D**2).mean()) or 1.0
    X += np.random.default_rng(seed).normal(scale=1e-6 * scale, size=X.shape)
    upper = np.triu_indices(n, 1)
    old = np.inf
    iterations = 0
    for iterations in range(1, max_iter + 1):  # noqa: B007 - the count is returned after the loop
        d = _pairwise(X)
        raw = ((d - D)[upper] ** 2).sum()
        if old - raw < tol * max(old, 1e-300) and np.isfinite(old):
            break
        old = raw
        with np.errstate(divide="ignore", invalid="ignore"):
            B = np.where(d > 0, -D / d, 0.0)
        np.fill_diagonal(B, 0.0)
        np.fill_diagonal(B, -B.sum(axis=1))
        X = B @ X / n
    X -= X.mean(axis=0)
    d = _pairwise(X)
    denominator = (D[upper] ** 2).sum()
    stress = float(np.sqrt(((d - D)[upper] ** 2).sum() / denominator)) if denominator > 0 else 0.0
    return MDSResult(X, stress, iterations)


def _pairwise(X: np.ndarray) -> np.ndarray:
    return np.sqrt(np.maximum(((X[:, None, :] - X[None, :, :]) ** 2).sum(-1), 0.0))


def _classical(D: np.ndarray, dim: int) -> np.ndarray:
    """Torgerson scaling: the top eigenvectors of the double-centred squared distances."""
    n = D.shape[0]
    J = np.eye(n) - 1.0 / n
    values, vectors = np.linalg.eigh(-0.5 * J @ (D**2) @ J)
    top = np.argsort(values)[::-1][:dim]
    X = vectors[:, top] * np.sqrt(np.maximum(values[top], 0.0))
    if X.shape[1] < dim:
        X = np.pad(X, ((0, 0), (0, dim - X.shape[1])))
    return X


def plot_mds(
    result: SimilarityResult, path: str | os.PathLike[str], *, seed: int = 0, annotate: bool = True,
) -> Path:
    """Draw the heads' 2-D MDS map, coloured by layer, as a PNG.

    Args:
        result: a ``HeadSimilarity`` result.
        path: the PNG file to write (parent folders are created).
        seed: passed to ``mds``.
        annotate: label each point with its head (``head_label``: "L3 H7").

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    embedding = mds(result.distances, dim=2, seed=seed)
    layers = np.array([layer for layer, _ in result.heads])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    points = ax.scatter(embedding.coords[:, 0], embedding.coords[:, 1], c=layers, cmap="viridis", s=36)
    if annotate:
        for (layer, head), (x, y) in zip(result.heads, embedding.coords):
            ax.annotate(head_label(layer, head), (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
    fig.colorbar(points, ax=ax, label="layer")
    ax.set_title(f"Heads by Jensen–Shannon distance (MDS, stress-1 {embedding.stress:.3f})")
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _sampled_rows(sources: list[Tensor | PatternRows], item: Tensor, query: Tensor) -> Iterator[Tensor]:
    """The rows ``(item, query)`` of every layer's patterns, heads side by side: ``(head, row, key_pos)``. Of whole
    patterns, in one piece; of ``PatternRows``, a block of query rows at a time (every item's rows ``[start, stop)``
    at most ``BLOCK_BYTES``, padded to the widest layer's keys), each block's sampled rows."""
    whole = [p for p in sources if isinstance(p, Tensor)]
    if len(whole) == len(sources):
        if len(item):
            yield torch.cat([p[item, :, query] for p in whole], dim=1).transpose(0, 1).contiguous()
        return
    rows_of = [p if isinstance(p, PatternRows) else PatternRows.of(p) for p in sources]
    n_queries, start = rows_of[0].shape[2], 0
    while start < n_queries:
        stop = start + min(r.block_rows(start, BLOCK_BYTES // len(rows_of)) for r in rows_of)
        here = (query >= start) & (query < stop)
        if here.any():
            blocks = [r.rows(start, stop) for r in rows_of]
            keys = max(block.shape[-1] for block in blocks)
            at, rows = item[here], query[here] - start
            yield torch.cat([torch.nn.functional.pad(block, (0, keys - block.shape[-1]))[at, :, rows]
                             for block in blocks], dim=1).transpose(0, 1).contiguous()
        start = stop
