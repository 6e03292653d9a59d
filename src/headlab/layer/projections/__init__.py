"""Registry of projection variants: name → Projection subclass (one file each)."""

from __future__ import annotations

from headlab.layer.projections.base import Projection
from headlab.layer.projections.wide import WideProjection

PROJECTIONS: dict[str, type[Projection]] = {
    "wide": WideProjection,
}

__all__ = ["PROJECTIONS", "Projection", "WideProjection"]
