"""Low-rank matrices kept as their two factors, M = A @ B.

A head's query-key form ``W_QK = W_Q W_Kᵀ`` is (d_model × kdim) but has rank at most d_head,
and its output-value circuit ``W_OV = W_V W_O`` is (vdim × d_model) with rank at most
d_head_v. Forming them costs d_model² per head; their singular values, rank and norms only
need the factors: with A = Q_A R_A and Bᵀ = Q_B R_B (thin QR), M = Q_A (R_A R_Bᵀ) Q_Bᵀ and the
small r × r core carries the whole spectrum.

Axis legend: ``A`` is ``(..., m, r)``, ``B`` is ``(..., r, n)``; leading axes (usually the head)
batch independent matrices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class FactoredMatrix:
    """``A @ B`` without forming it.

    Attributes:
        A: ``(..., m, r)``.
        B: ``(..., r, n)``.
    """

    A: Tensor
    B: Tensor

    def __post_init__(self) -> None:
        if self.A.dim() < 2 or self.B.dim() < 2 or self.A.shape[-1] != self.B.shape[-2]:
            raise ValueError(
                f"factors do not chain: A has shape {tuple(self.A.shape)}, B has shape {tuple(self.B.shape)}; "
                "expected (..., m, r) and (..., r, n)"
            )
        try:
            torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"batch axes do not broadcast: A has shape {tuple(self.A.shape)}, B has shape {tuple(self.B.shape)}"
            ) from None

    @property
    def shape(self) -> torch.Size:
        """``(..., m, n)``: the shape of the product."""
        batch = torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2])
        return torch.Size((*batch, self.A.shape[-2], self.B.shape[-1]))

    @property
    def inner_dim(self) -> int:
        """r: the rank bound of every matrix in the batch."""
        return self.A.shape[-1]

    def __getitem__(self, index: int | slice | Tensor) -> FactoredMatrix:
        """Index the leading (batch) axes, e.g. ``QK[h]`` for head h."""
        if self.A.dim() == 2:
            raise IndexError("a single matrix has no batch axis to index")
        return FactoredMatrix(self.A[index], self.B[index])

    def __len__(self) -> int:
        if self.A.dim() == 2:
            raise TypeError("a single matrix has no length")
        return self.shape[0]

    @property
    def T(self) -> FactoredMatrix:
        """The transpose, still factored: ``Bᵀ Aᵀ``."""
        return FactoredMatrix(self.B.transpose(-1, -2), self.A.transpose(-1, -2))

    @property
    def AB(self) -> Tensor:
        """The product, materialised: ``(..., m, n)``."""
        return self.A @ self.B

    def svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """Thin SVD of the product from the factors: ``U (..., m, k)``, ``S (..., k)``, ``Vh (..., k, n)``.

        k = min(m, n, r); ``U @ diag(S) @ Vh`` is the product.
        """
        q_a, r_a = torch.linalg.qr(self.A)  # (..., m, r), (..., r, r)
        q_b, r_b = torch.linalg.qr(self.B.transpose(-1, -2))  # (..., n, r), (..., r, r)
        u, s, vh = torch.linalg.svd(r_a @ r_b.transpose(-1, -2), full_matrices=False)
        return q_a @ u, s, vh @ q_b.transpose(-1, -2)

    @property
    def S(self) -> Tensor:
        """Singular values, descending: ``(..., min(m, n, r))``."""
        return self.svd()[1]

    @property
    def rank(self) -> int | Tensor:
        """Numerical rank (singular values above max(m, n) · eps · σ_max, as torch.linalg.matrix_rank).

        An int for a single matrix, a long tensor ``(...)`` for a batch.
        """
        s = self.S
        m, n = self.shape[-2:]
        tol = max(m, n) * torch.finfo(s.dtype).eps * s[..., :1]
        ranks = (s > tol).sum(dim=-1)
        return int(ranks) if ranks.dim() == 0 else ranks

    def norm(self) -> Tensor:
        """Frobenius norm of the product: ``(...)``."""
        return self.S.pow(2).sum(dim=-1).sqrt()
