"""The PNG plots ``analyze`` writes (``AnalysisResult.write`` calls ``write_plots`` with its parts).

    heatmaps.png        layer × head per surface statistic (``plot_heatmaps``)
    mds.png             heads placed by Jensen–Shannon distance (``headlab.analysis.similarity.plot_mds``)
    value_weighted.png  raw vs value-weighted attention on the sink tokens (``norms.plot_value_weighted``)
    sinks.png           the sink share by query position (``sinks.plot_sink_share``)
    streaming.png       loss change of streaming heads against the window (``context_heads.plot_streaming``)
    pruning.png         the task metrics as heads are masked (``importance.plot_pruning_curve``)
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from headlab.analysis.context_heads import plot_streaming
from headlab.analysis.importance import PruningCurve, plot_pruning_curve
from headlab.analysis.norms import plot_value_weighted
from headlab.analysis.similarity import SimilarityResult, plot_mds
from headlab.analysis.sinks import SinkResult, plot_sink_share
from headlab.analysis.surface import head_statistics
from headlab.heads import HeadTable

if TYPE_CHECKING:
    from headlab.analysis.streaming import StreamingResult

__all__ = ["plot_heatmaps", "write_plots"]


def write_plots(out: Path, *, surface: HeadTable, similarity: SimilarityResult, value_weighted: HeadTable | None,
                sinks: SinkResult | None, streaming: StreamingResult | None, pruning: Mapping[str, PruningCurve],
                causal: bool, statistics: Sequence[str] | None = None) -> list[Path]:
    """The plots of the parts that ran, into the folder ``out`` (made already); returns their paths.

    Args:
        surface: ``SurfaceStats``' table; similarity: ``HeadSimilarity``'s result.
        value_weighted, sinks, streaming: those results, or None (no plot).
        pruning: ``{metric name: curve}``; empty: no plot.
        causal: the model's attention is causal (statistics that cannot vary are left out of the heatmaps).
        statistics: the heatmaps' columns of ``surface``; None: ``head_statistics`` of the model's kind.
    """
    paths = [out / "heatmaps.png"]
    plot_heatmaps(surface, paths[-1], causal=causal, statistics=statistics)
    paths.append(out / "mds.png")
    plot_mds(similarity, paths[-1])
    if value_weighted is not None:
        paths.append(out / "value_weighted.png")
        plot_value_weighted(value_weighted, paths[-1])
    if sinks is not None:
        paths.append(out / "sinks.png")
        plot_sink_share(sinks, paths[-1])
    if streaming is not None:
        paths.append(plot_streaming(streaming, out / "streaming.png"))
    if pruning:
        paths.append(out / "pruning.png")
        axis = next(iter(pruning)) if len(pruning) == 1 else "task metric"  # an encoder's two: [0, 1]
        labelled = {f"{metric} (flat)" if curve.flat() else metric: curve for metric, curve in pruning.items()}
        plot_pruning_curve(labelled, paths[-1], metric=axis)
    return paths


def plot_heatmaps(surface: HeadTable, path: str | os.PathLike[str], *, causal: bool = False,
                  statistics: Sequence[str] | None = None) -> None:
    """One layer × head heatmap per statistic, in one PNG: ``statistics`` (columns of ``surface``), or those that
    can vary for the model's kind (``head_statistics``) of a ``SurfaceStats`` result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = head_statistics(causal=causal) if statistics is None else tuple(statistics)
    cols = 3
    n_rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(4.2 * cols, 3.2 * n_rows))
    for ax, name in zip(axes.flat, names):
        image = ax.imshow(surface.grid(name), aspect="auto", cmap="viridis")  # NaN (a head not captured): blank
        ax.set_title(name)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(surface.layers)), [str(layer) for layer in surface.layers])
        fig.colorbar(image, ax=ax, fraction=0.046)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
