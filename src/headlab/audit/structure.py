"""What the recovered per-head maps say about a layer's structure: pure linear algebra.

Inputs are what the probes recover (``headlab.audit.probes``), for a layer of width d_model:
    W_QK  (head, d_model, d_model)  score = x_q W_QK x_kᵀ + w·x_k (+ terms the softmax cancels)
    w     (head, d_model)           the key-side linear term of the scores (a query bias)
    W_OV  (head, d_model, d_model)  a head's contribution to the output per unit of attention
    V     list of (d_model, width)  each head's values, where the call shows them

Every test compares numbers with a relative tolerance ``rtol`` (1e-7 in float64 probing,
1e-3 in float32): an entry, row or singular value counts as nonzero when it exceeds ``rtol``
times the largest one of its kind. docs/audit.md lists each test.

Large maps are decomposed through a random sketch (Halko, Martinsson and Tropp 2011): the range
of M Ω for a Gaussian Ω with more columns than M's rank is M's range, so a thin SVD of Qᵀ M
gives M's singular values and subspaces at a fraction of a full SVD's cost (d_model = 768: a
W_QK of rank 64 in a tenth of the time). Ω comes from a fixed seed: the result does not vary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "Reads", "Spectrum", "basis", "classify_reads", "kv_groups", "max_relative_difference", "own_rows", "read_dims",
    "same_subspace", "spectrum",
]

_FULL_SVD_UP_TO = 192  # below this size a full SVD costs no more than a sketch
_OVERSAMPLE = 16  # sketch columns beyond the rank being tested: a miss needs 16 unlucky draws at once


@dataclass(frozen=True)
class Reads:
    """Which input dimensions one of a head's queries, keys or values depends on.

    Attributes:
        kind: ``"wide"`` (all of d_model), ``"narrow"`` (only dimensions inside one of the
            n_heads equal slices), ``"partial"`` (some other set) or ``"none"``.
        dims: how many input dimensions it depends on.
        start: the first dimension it depends on (the slice's start for narrow).
        stop: one past the last (the slice's end for narrow).
        slice_index: for narrow, which slice (0-based); else None.
    """

    kind: str
    dims: int
    start: int
    stop: int
    slice_index: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Returns: the fields as a JSON-ready dict."""
        return asdict(self)


def read_dims(matrix: Tensor, *, rtol: float) -> Tensor:
    """Rows of ``matrix`` ``(d_model, n)`` that are not zero: the input dimensions it reads.

    Returns:
        Bool ``(d_model,)``: row norm above ``rtol`` × the largest row norm (all False for zero).
    """
    norms = matrix.norm(dim=1)
    top = float(norms.max()) if norms.numel() else 0.0
    return norms > rtol * top if top > 0 else torch.zeros_like(norms, dtype=torch.bool)


def classify_reads(mask: Tensor, *, n_heads: int) -> Reads:
    """Name the input dimensions in ``mask`` ``(d_model,)``: wide, narrow (inside one slice), partial or none."""
    d_model = mask.numel()
    index = mask.nonzero().flatten().tolist()
    if not index:
        return Reads("none", 0, 0, 0)
    start, stop = index[0], index[-1] + 1
    if len(index) == d_model:
        return Reads("wide", d_model, 0, d_model)
    if n_heads > 1 and d_model % n_heads == 0:
        width = d_model // n_heads
        if start // width == (stop - 1) // width:
            s = start // width
            return Reads("narrow", len(index), s * width, (s + 1) * width, s)
    return Reads("partial", len(index), start, stop)


@dataclass(frozen=True)
class Spectrum:
    """A matrix's numerical rank, its nonzero singular values and orthonormal bases of its two spaces.

    Attributes:
        rank: singular values above ``rtol`` × the largest (0 for a zero matrix).
        values: those singular values ``(rank,)``, largest first.
        left: ``(rows, rank)``, a basis of the column space.
        right: ``(cols, rank)``, a basis of the row space.
    """

    rank: int
    values: Tensor
    left: Tensor
    right: Tensor

    def thin(self, side: str) -> Tensor:
        """``left · diag(values)`` (``side="left"``) or ``right · diag(values)``: a thin matrix with the
        same column space and Gram matrix as the matrix (``"left"``) or its transpose (``"right"``)."""
        if side not in ("left", "right"):
            raise ValueError(f"side={side!r} is not 'left' or 'right'")
        return (self.left if side == "left" else self.right) * self.values


def _from_svd(u: Tensor, s: Tensor, vh: Tensor, rtol: float) -> Spectrum:
    rank = int((s > rtol * s[0]).sum()) if s.numel() and float(s[0]) > 0 else 0
    return Spectrum(rank=rank, values=s[:rank], left=u[:, :rank], right=vh[:rank].T)


def spectrum(matrix: Tensor, *, rtol: float) -> Spectrum:
    """Rank, singular values and subspaces of ``matrix`` ``(rows, cols)``, sketched when it is large.

    The sketch doubles its width until the rank it finds leaves ``_OVERSAMPLE`` columns spare;
    a map of (nearly) full rank ends in one full SVD.
    """
    small = min(matrix.shape)
    width = 4 * _OVERSAMPLE
    generator = torch.Generator().manual_seed(0)
    while small > _FULL_SVD_UP_TO and width + _OVERSAMPLE <= small // 2:
        omega = torch.randn(matrix.shape[1], width + _OVERSAMPLE, generator=generator, dtype=matrix.dtype)
        q, _ = torch.linalg.qr(matrix @ omega)  # (rows, width + oversample): spans the range if the rank fits
        u, s, vh = torch.linalg.svd(q.T @ matrix, full_matrices=False)
        found = _from_svd(q @ u, s, vh, rtol)
        if found.rank <= width:
            return found
        width *= 2
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    return _from_svd(u, s, vh, rtol)


def basis(matrix: Tensor, *, rtol: float) -> Tensor:
    """Orthonormal basis ``(rows, rank)`` of the column space of ``matrix`` ``(rows, n)``."""
    return spectrum(matrix, rtol=rtol).left


def same_subspace(a: Tensor, b: Tensor, *, tol: float) -> bool:
    """Whether orthonormal bases ``a`` and ``b`` ``(d, r)`` span one subspace (projectors within ``tol``)."""
    if a.shape != b.shape:
        return False
    return bool((a @ a.T - b @ b.T).abs().max() <= tol) if a.shape[1] else True


def kv_groups(key_bases: list[Tensor] | None, value_bases: list[Tensor], *, tol: float) -> list[list[int]]:
    """Group heads that can share one key head and one value head.

    Heads h and g can share them exactly when the key side of their scores reads one subspace of
    the input and their values read one subspace (a grouped-query layer with the group's shared
    W_K, W_V and per-head W_Q, W_O then reproduces both).

    Args:
        key_bases: per head, an orthonormal basis of the key-side subspace of [W_QKᵀ | w]; None
            to group by the values alone (when the scores are not a bilinear form).
        value_bases: per head, an orthonormal basis of the input-side subspace of W_OV.
        tol: projector tolerance.

    Returns:
        Groups of head indices, each ascending, in order of their first head.
    """
    groups: list[list[int]] = []
    for h, v in enumerate(value_bases):
        for group in groups:
            first = group[0]
            keys = key_bases is None or same_subspace(key_bases[h], key_bases[first], tol=tol)
            if keys and same_subspace(v, value_bases[first], tol=tol):
                group.append(h)
                break
        else:
            groups.append([h])
    return groups


def own_rows(matrix: Tensor, reads: Reads) -> Tensor:
    """A head's map in its own coordinates: the rows of its slice when it is narrow, else all rows."""
    return matrix[reads.start : reads.stop] if reads.kind == "narrow" else matrix


def max_relative_difference(a: Tensor, b: Tensor, *, scale: float) -> float:
    """``max |a − b| / scale``, or inf when the shapes differ (different maps cannot be equal)."""
    if a.shape != b.shape:
        return float("inf")
    if scale == 0:
        return 0.0 if bool((a == b).all()) else float("inf")
    return float((a - b).abs().max()) / scale if a.numel() else 0.0
