"""``AnalysisResult``: everything ``analyze`` measured, and its per-head rows, summary and JSON document.

The data stays here; the sentences (``headlab.analysis.sentences``), the data files
(``headlab.analysis.files``) and the plots (``headlab.analysis.plots``) are made in their own modules,
from the parts of a result: ``sentences()`` and ``write()`` are the entry points that hand them over.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from headlab.analysis.context_heads import ContextHeads
from headlab.analysis.files import jsonable, write_data
from headlab.analysis.frames import audio_sentences, audio_statistics
from headlab.analysis.importance import (
    ImportanceResult,
    PruningCurve,
    ablation_importance,
    gradient_importance,
    pruning_curve,
    spearman,
)
from headlab.analysis.patches import image_statistics, patch_sentences
from headlab.analysis.plots import write_plots
from headlab.analysis.roles import ProbeScores
from headlab.analysis.sentences import analysis_sentences
from headlab.analysis.similarity import MDSResult, SimilarityResult
from headlab.analysis.sinks import SinkResult
from headlab.analysis.taxonomy import class_shares
from headlab.capture import CaptureResult
from headlab.heads import HeadTable
from headlab.models.audio import Timeline
from headlab.models.images import PatchGrid

__all__ = ["AnalysisResult"]


@dataclass
class AnalysisResult:
    """Everything ``analyze`` measured. Parts that did not run are None, with a reason in ``skipped``.

    Attributes:
        surface: ``SurfaceStats``' table (a row per captured head; ``n_queries`` and every statistic); for an image
            model ``PatchStats``' (``headlab.analysis.patches``), for an audio model ``AudioStats``'
            (``headlab.analysis.frames``).
        taxonomy: ``TaxonomyStats``' table (same heads); None for an image model (the classes read text).
        roles, classes: labels and the pattern class per captured head (an image model: ``patch_roles``, no
            classes).
        value_weighted: ``ValueWeighted``'s table (raw vs value-weighted attention on the sink tokens).
        sinks: ``SinkShare``'s result (the share on the sink positions by query position).
        context: retrieval scores (causal language models) and the streaming simulation, every head
            of the model (``headlab.analysis.context_heads``).
        probes: causal models: ``{"duplicate_token": ..., "induction": ...}``, a row per head of the model.
        importance: ``{"gradient": ..., "ablation": ...}``, a row per head of the model.
        pruning: ``{metric name: curve}``, heads masked least important first (by gradient
            importance): for an encoder the embedding cosine to the unpruned model, then pair-retrieval
            accuracy; for a causal model the next-token loss.
        causal: the model's attention is causal (statistics that cannot vary, e.g. ``to_next``, are
            left out of the sentences and plots).
        grid: an image model's patch grid (its statistics, sentences and plots are ``headlab.analysis.patches``');
            None for text.
        timeline: an audio model's encoder positions in time (its statistics, sentences and plots are
            ``headlab.analysis.frames``'); None for text and images.
    """

    capture: CaptureResult
    surface: HeadTable
    roles: dict[tuple[int, int], tuple[str, ...]]
    taxonomy: HeadTable | None
    classes: dict[tuple[int, int], str]
    similarity: SimilarityResult
    embedding: MDSResult
    value_weighted: HeadTable | None = None
    sinks: SinkResult | None = None
    syntax: Any | None = None
    context: ContextHeads | None = None
    probes: dict[str, ProbeScores] = field(default_factory=dict)
    importance: dict[str, ImportanceResult] = field(default_factory=dict)
    importance_spearman: float | None = None
    pruning: dict[str, PruningCurve] = field(default_factory=dict)
    causal: bool = False
    skipped: dict[str, str] = field(default_factory=dict)
    grid: PatchGrid | None = None
    timeline: Timeline | None = None

    def measure_importance(self, model: Any, batches: list[Any], loss_fn: Callable[[Any, Any], Any],
                           metrics: dict[str, Callable[[Any], float]], *, quick: bool) -> None:
        """Set ``importance`` (gradient; ablation too, and their Spearman, unless ``quick``, which is said in
        ``skipped``) on ``batches`` of the task ``loss_fn``, and ``pruning``: one curve per metric of ``metrics``,
        heads masked least important first by gradient importance."""
        gradient = gradient_importance(model, batches, loss_fn)
        self.importance = {"gradient": gradient}
        if quick:
            self.skipped["ablation importance"] = "--quick: exact ablation runs one forward per head"
        else:
            ablation = ablation_importance(model, batches, loss_fn)
            self.importance["ablation"] = ablation
            self.importance_spearman = spearman(gradient.table["raw"], np.abs(ablation.table["raw"]))
        self.pruning = {name: pruning_curve(model, gradient, metric) for name, metric in metrics.items()}

    def table(self) -> HeadTable:
        """Every per-head number of heads.json / heads.csv, a row per captured head: the surface columns,
        the value-weighted columns (``headlab.analysis.norms.COLUMNS``), ``sink_{column}`` of the sink
        share (its ``sink_head`` as it is), ``retrieval_score``, ``streaming_{column}`` of the simulation,
        then ``{probe}_score`` per probe and ``importance_{method}`` per importance (NaN where that table
        has no row for the head)."""
        columns = dict(self.surface.columns)
        heads = self.surface.heads
        if self.value_weighted is not None:
            columns |= {name: self.value_weighted.at(name, heads) for name in self.value_weighted.columns
                        if name != "n_queries"}
        if self.sinks is not None:
            columns |= {name if name == "sink_head" else f"sink_{name}": self.sinks.table.at(name, heads)
                        for name in self.sinks.table.columns if name != "n_queries"}
        if self.context is not None:
            if self.context.retrieval is not None:
                columns["retrieval_score"] = self.context.retrieval.table.at("score", heads)
            streaming = self.context.streaming.table
            columns |= {f"streaming_{name}": streaming.at(name, heads) for name in streaming.columns}
        for name, probe in self.probes.items():
            columns[f"{name}_score"] = probe.table.at(name, self.surface.heads)
        for name, importance in self.importance.items():
            columns[f"importance_{name}"] = importance.table.at("score", self.surface.heads)
        return HeadTable(self.surface.heads, columns)

    def rows(self) -> list[dict[str, Any]]:
        """One row per captured head: layer, head, n_queries, every surface statistic, roles, pattern class,
        probe scores and importance (``table()``'s rows with the labels; None for NaN)."""
        rows = []
        for row in self.table().rows():
            key = (row["layer"], row["head"])
            out = {name: row.pop(name) for name in ("layer", "head", *self.surface.columns)}
            out["n_queries"] = int(out["n_queries"])
            out["roles"] = " ".join(self.roles.get(key, ()))
            out["pattern_class"] = self.classes.get(key, "")
            rows.append(out | row)
        return rows

    def summary(self) -> dict[str, Any]:
        """The headline numbers: counts, class shares, role counts, correlations, skips."""
        role_counts: dict[str, int] = {}
        for labels in self.roles.values():
            for label in labels:
                role_counts[label] = role_counts.get(label, 0) + 1
        return {
            "items": self.capture.items, "tokens": self.capture.tokens, "truncated": self.capture.n_truncated,
            "pattern_memory": self.capture.pattern_memory, "blocked_batches": self.capture.blocked,
            "heads": len(self.surface), "role_counts": role_counts,
            "class_shares": class_shares(self.classes) if self.taxonomy is not None else {},
            "mean_js_distance": float(self.similarity.distances[np.triu_indices(len(self.similarity.heads), 1)].mean())
            if len(self.similarity.heads) > 1 else None,
            "mds_stress": self.embedding.stress, "importance_spearman": self.importance_spearman,
            "pruning_metrics": list(self.pruning), "skipped": dict(self.skipped),
            "sink_heads": None if self.sinks is None else [list(h) for h in self.sinks.sink_heads()],
            "retrieval_heads": None if self.context is None or self.context.retrieval is None
            else [list(h) for h in self.context.retrieval.retrieval_heads()],
            "streaming_heads": None if self.context is None else {
                str(c.window): [list(h) for h in c.heads] for c in self.context.streaming.conversions},
            "grid": None if self.grid is None else self.grid.to_dict(),
            "timeline": None if self.timeline is None else self.timeline.to_dict(),
            "decoder": self.capture.corpus.get("decoder"),  # an audio encoder-decoder's: what its decoder read
        }

    def sentences(self) -> list[str]:
        """A few sentences about what the heads do, every number taken from this result
        (``headlab.analysis.sentences.analysis_sentences``; ``headlab.analysis.patches.patch_sentences`` for an
        image model, ``headlab.analysis.frames.audio_sentences`` for an audio model)."""
        if self.timeline is not None:
            return audio_sentences(self.surface, self.roles, self.timeline)
        if self.grid is not None:
            return patch_sentences(self.surface, self.roles, self.grid, self.pruning)
        return analysis_sentences(surface=self.surface, roles=self.roles, classes=self.classes, syntax=self.syntax,
                                  pruning=self.pruning, causal=self.causal)

    def to_dict(self) -> dict[str, Any]:
        """heads.json's document: summary, sentences, per-head rows, relations, probes, sinks, context, pruning."""
        return {"summary": self.summary(), "sentences": self.sentences(), "heads": self.rows(),
                "relations": [] if self.syntax is None else self.syntax.rows(),
                "probes": {name: probe.to_dict() for name, probe in self.probes.items()},
                "sinks": None if self.sinks is None else self.sinks.to_dict(),
                "context": None if self.context is None else self.context.to_dict(),
                "pruning": {metric: curve.to_dict() for metric, curve in self.pruning.items()}}

    def to_json(self) -> str:
        """``to_dict()`` as strict JSON (NaN → null)."""
        return json.dumps(jsonable(self.to_dict()))

    def write(self, out_dir: str | os.PathLike[str]) -> list[Path]:
        """Write heads.json, heads.csv, relations.csv (when syntax ran) and the plots of the parts that ran
        (``headlab.analysis.files.write_data``, ``headlab.analysis.plots.write_plots``); returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = write_data(out, document=self.to_dict(), rows=self.rows(), syntax=self.syntax)
        return paths + write_plots(out, surface=self.surface, similarity=self.similarity,
                                   value_weighted=self.value_weighted, sinks=self.sinks,
                                   streaming=None if self.context is None else self.context.streaming,
                                   pruning=self.pruning, causal=self.causal,
                                   statistics=self._statistics())

    def _statistics(self) -> tuple[str, ...] | None:
        """The heatmaps' columns: an image or audio model's own (``image_statistics``, ``audio_statistics``); None:
        the text statistics of the model's kind."""
        if self.timeline is not None:
            return audio_statistics(self.surface)
        return None if self.grid is None else image_statistics(self.surface)
