"""Registry of projection variants: name → Projection subclass (one file each)."""

from __future__ import annotations

from headlab.layer.projections.base import Projection
from headlab.layer.projections.bilinear import BilinearProjection
from headlab.layer.projections.collaborative import CollaborativeProjection
from headlab.layer.projections.narrow import NarrowProjection
from headlab.layer.projections.shared import SharedProjection
from headlab.layer.projections.wide import WideProjection

PROJECTIONS: dict[str, type[Projection]] = {
    "wide": WideProjection,
    "narrow": NarrowProjection,
    "shared": SharedProjection,
    "bilinear": BilinearProjection,
    "collaborative": CollaborativeProjection,
}

__all__ = [
    "PROJECTIONS", "BilinearProjection", "CollaborativeProjection", "NarrowProjection", "Projection", "SharedProjection", "WideProjection",
]
