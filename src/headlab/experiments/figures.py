"""Matplotlib figures of the experiments, rendered to PNG bytes with the Agg canvas.

The figure is drawn on its own Agg canvas, so pyplot's global backend is never switched, and
saved without a timestamp, so the same numbers give the same file.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["png"]


def png(fig: Figure, *, dpi: int = 110) -> bytes:
    """Render ``fig`` to PNG bytes (no metadata that changes from run to run)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()
