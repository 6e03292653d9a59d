"""Registry of projection variants: name → Projection subclass (one file each)."""

from __future__ import annotations

from headlab.layer.config import AttentionConfig
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


def projection_for(config: AttentionConfig) -> type[Projection]:
    """The projection class that ``config.projection`` names, once it has checked ``config``.

    ``MultiHeadAttention`` builds its projection through this; call it to check a config
    without building anything.

    Raises:
        ValueError: the name is not registered (the known names are listed), or the variant
            cannot use the config's sizes (the message names them).
    """
    variant = PROJECTIONS.get(config.projection)
    if variant is None:
        raise ValueError(f"projection={config.projection!r} is not one of {sorted(PROJECTIONS)}")
    variant.validate(config)
    return variant


__all__ = [
    "PROJECTIONS", "BilinearProjection", "CollaborativeProjection", "NarrowProjection", "Projection",
    "SharedProjection", "WideProjection", "projection_for",
]
