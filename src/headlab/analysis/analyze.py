"""``analyze``: every head analysis of one model in one run, and the files it writes.

One capture pass over the corpus (patterns and v) feeds all the accumulators at once (surface
statistics, taxonomy, similarity, value-weighted attention, the sink share, syntax); the causal
probes, retrieval and streaming heads, importance and the pruning curve then run their own short
passes. The capture pass runs in this process (``engine="local"``) or in shards
on Ray workers (``engine="ray"``, ``headlab.capture.distributed``); both build their accumulators
with ``AnalysisAccumulators`` and give the same result. Parts that cannot run for this model or
this install (the causal probes on a bidirectional model, syntax without spaCy) are skipped with
the reason on record.

Outputs (``AnalysisResult.write``): heads.json and heads.csv (one row per head; fields in
docs/analysis.md), relations.csv, and PNG plots: heatmaps.png (layer × head per statistic),
mds.png, value_weighted.png (raw vs value-weighted attention on the sink tokens), sinks.png (the
sink share by query position), streaming.png (loss change of streaming heads against the window),
pruning.png.
"""

from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from headlab.analysis.importance import (
    LM_MAX_LENGTH, MAX_LENGTH, ImportanceResult, PruningCurve, ablation_importance, causal_lm_loss, fidelity_metric,
    gradient_importance, lm_batches, pair_batches, paraphrase_loss, plot_pruning_curve, pruning_curve,
    retrieval_metric, spearman,
)
from headlab.heads import head_label
from headlab.analysis.context_heads import ContextHeads, context_heads, plot_streaming
from headlab.analysis.norms import ValueProjections, ValueWeighted, out_projections, plot_value_weighted
from headlab.analysis.roles import ProbeScores, duplicate_token_scores, induction_scores, label_heads
from headlab.analysis.similarity import HeadSimilarity, MDSResult, SimilarityResult, mds, plot_mds
from headlab.analysis.sinks import (
    CAUSAL_SINK_TOKENS, ENCODER_SINK_TOKENS, SinkResult, SinkShare, plot_sink_share,
)
from headlab.analysis.surface import SurfaceStats, head_statistics, is_causal
from headlab.analysis.taxonomy import TaxonomyStats, class_shares, classify
from headlab.capture import CaptureResult, Shard, capture, load_corpus
from headlab.capture.corpus import ShortCorpus
from headlab.heads import HeadTable
from headlab.heads.selection import HeadSelection
from headlab.models import headed

FIDELITY_METRIC = "embedding cosine to the unpruned model"
RETRIEVAL_METRIC = "pair-retrieval accuracy"
LM_METRIC = "next-token loss"
METRIC_FORMATS = {FIDELITY_METRIC: "{:.3f}", RETRIEVAL_METRIC: "{:.0%}", LM_METRIC: "{:.2f} nats"}
PROBE_LENGTH = 32  # tokens in each repeated half of the causal probes (fewer when the model is shorter)
SIMILARITY_ROW_FRACTION = 0.02  # similarity reads this share of each batch's real query rows
ENGINES = ("local", "ray")  # where the capture pass runs: this process, or Ray workers
TABLE_RELATIONS = 12  # dependency relations shown in tables (most frequent first); the headline picks among them


@dataclass
class AnalysisResult:
    """Everything ``analyze`` measured. Parts that did not run are None, with a reason in ``skipped``.

    Attributes:
        surface: ``SurfaceStats``' table (a row per captured head; ``n_queries`` and every statistic).
        taxonomy: ``TaxonomyStats``' table (same heads).
        roles, classes: labels and the pattern class per captured head.
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
    """

    capture: CaptureResult
    surface: HeadTable
    roles: dict[tuple[int, int], tuple[str, ...]]
    taxonomy: HeadTable
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
            "heads": len(self.surface), "role_counts": role_counts, "class_shares": class_shares(self.classes),
            "mean_js_distance": float(self.similarity.distances[np.triu_indices(len(self.similarity.heads), 1)].mean())
            if len(self.similarity.heads) > 1 else None,
            "mds_stress": self.embedding.stress, "importance_spearman": self.importance_spearman,
            "pruning_metrics": list(self.pruning), "skipped": dict(self.skipped),
            "sink_heads": None if self.sinks is None else [list(h) for h in self.sinks.sink_heads()],
            "retrieval_heads": None if self.context is None or self.context.retrieval is None
            else [list(h) for h in self.context.retrieval.retrieval_heads()],
            "streaming_heads": None if self.context is None else {
                str(c.window): [list(h) for h in c.heads] for c in self.context.streaming.conversions},
        }

    def sentences(self) -> list[str]:
        """A few sentences about what the heads do, every number taken from this result.

        Statistics that cannot vary for the model's kind (``head_statistics``) are never cited; the
        dependency headline names one of the ``TABLE_RELATIONS`` most frequent relations (those the
        tables show); a pruning curve that does not move says so instead of reading as a result. The
        sinks have their own sentences (``headlab.analysis.sinks.sink_sentences``), as the report has a
        section for them.
        """
        surface = self.surface
        shares = class_shares(self.classes)
        top = sorted(shares.items(), key=lambda kv: -kv[1])
        out = [f"Of the {len(surface)} heads analysed, " + ", ".join(f"{share:.0%} are {name}" for name, share in top)
               + f" (pattern classes, docs/analysis.md); {sum('sink' in v for v in self.roles.values())} are "
               "special-token sinks, sending over half their attention to the special tokens."]
        prev = surface.top("to_prev", 1)[0]
        neighbours = (f"Head {head_label(*prev)} sends {surface.value('to_prev', *prev):.0%} of its attention to the "
                      "previous token")
        if "to_next" in head_statistics(causal=self.causal):  # a causal head never sees the next token
            nxt = surface.top("to_next", 1)[0]
            neighbours += f" and head {head_label(*nxt)} {surface.value('to_next', *nxt):.0%} to the next one"
        out.append(neighbours + f", while the mean head's entropy is {np.mean(surface['entropy']):.2f} nats.")
        if self.syntax is not None and self.syntax.relations:
            shown = self.syntax.relations[:TABLE_RELATIONS]
            rel = max(shown, key=lambda r: r.best[2] - r.baseline_accuracy)
            direction, (layer, head), accuracy = rel.best
            start, target = (("dependent", "syntactic head") if direction == "dep_to_head"
                             else ("syntactic head", "dependent"))
            out.append(f"Of the {len(shown)} most frequent dependency relations, {rel.relation} gains most over a "
                       f"fixed offset: reading from the {start} word of each of its {rel.count} arcs, attention head "
                       f"{head_label(layer, head)} puts its largest weight on the {target} word {accuracy:.0%} of "
                       f"the time, against {rel.baseline_accuracy:.0%} for the best fixed offset "
                       f"({rel.baseline_offset:+d} {'word' if abs(rel.baseline_offset) == 1 else 'words'}).")
        out += [_pruning_sentence(metric, curve) for metric, curve in self.pruning.items()]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "sentences": self.sentences(), "heads": self.rows(),
                "relations": [] if self.syntax is None else self.syntax.rows(),
                "probes": {name: probe.to_dict() for name, probe in self.probes.items()},
                "sinks": None if self.sinks is None else self.sinks.to_dict(),
                "context": None if self.context is None else self.context.to_dict(),
                "pruning": {metric: curve.to_dict() for metric, curve in self.pruning.items()}}

    def to_json(self) -> str:
        """``to_dict()`` as strict JSON (NaN → null)."""
        return json.dumps(_jsonable(self.to_dict()))

    def write(self, out_dir: str | os.PathLike[str]) -> list[Path]:
        """Write heads.json, heads.csv, relations.csv (when syntax ran) and the plots (those of the parts
        that ran); returns the paths."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = [out / "heads.json", out / "heads.csv"]
        paths[0].write_text(json.dumps(json.loads(self.to_json()), indent=2) + "\n")
        rows = self.rows()
        with paths[1].open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        if self.syntax is not None:
            paths.append(out / "relations.csv")
            self.syntax.to_csv(paths[-1])
        paths.append(out / "heatmaps.png")
        plot_heatmaps(self.surface, paths[-1], causal=self.causal)
        paths.append(out / "mds.png")
        plot_mds(self.similarity, paths[-1])
        if self.value_weighted is not None:
            paths.append(out / "value_weighted.png")
            plot_value_weighted(self.value_weighted, paths[-1])
        if self.sinks is not None:
            paths.append(out / "sinks.png")
            plot_sink_share(self.sinks, paths[-1])
        if self.context is not None:
            paths.append(plot_streaming(self.context.streaming, out / "streaming.png"))
        if self.pruning:
            paths.append(out / "pruning.png")
            axis = next(iter(self.pruning)) if len(self.pruning) == 1 else "task metric"  # an encoder's two: [0, 1]
            labelled = {f"{metric} (flat)" if curve.flat() else metric: curve for metric, curve in self.pruning.items()}
            plot_pruning_curve(labelled, paths[-1], metric=axis)
        return paths


class AnalysisAccumulators:
    """The accumulators of ``analyze``'s capture pass, made fresh for the whole corpus or for one shard.

    One definition for both engines: the local engine calls it once with no shard, the Ray engine
    once per shard on the workers (so it pickles: plain data and tensors, no model, no spaCy pipeline).

    Args:
        causal: the model's attention is causal (``is_causal``).
        parses: syntax's parse of every corpus item, in corpus order, made on the driver (spaCy never
            runs on a worker); None: no syntax accumulator.
        row_fraction: similarity's sample, a share of each batch's real query rows (``HeadSimilarity``).
        W_O: ``{layer: (n_heads, d_head_v, d_model)}`` (``headlab.analysis.norms.out_projections``) to add
            value-weighted attention and the sink share by position; None: neither. Kept (and shipped
            to Ray workers) as their ``ValueProjections``: the same norms, d_head_v wide, shared by both.

    Attributes:
        take: what the capture pass must take for these accumulators: ``("pattern", "v")`` with W_O,
            else ``("pattern",)``.

    Calling it:
        ``accumulators(shard=None)`` → ``[SurfaceStats, TaxonomyStats, HeadSimilarity]``, then with W_O
        ``ValueWeighted, SinkShare``, then with parses ``SyntaxAccuracy``. For a ``Shard`` the similarity
        sample starts at the shard's first batch (the rows one process draws for those batches) and
        syntax holds the shard's parses under the shard's local corpus indices.
    """

    def __init__(self, *, causal: bool, parses: list[Any] | None = None,
                 row_fraction: float | None = SIMILARITY_ROW_FRACTION,
                 W_O: dict[int, Any] | None = None) -> None:  # noqa: N803
        self.causal, self.parses, self.row_fraction = causal, parses, row_fraction
        self.projections = None if W_O is None else ValueProjections(W_O)  # d_model / d_head_v times smaller
        self.take = ("pattern",) if W_O is None else ("pattern", "v")

    def __call__(self, shard: Shard | None = None) -> list[Any]:
        similarity = HeadSimilarity(row_fraction=self.row_fraction)
        parts: list[Any] = [SurfaceStats(causal=self.causal), TaxonomyStats(causal=self.causal), similarity]
        if shard is not None:
            similarity.batches_seen = shard.first_batch
        if self.projections is not None:
            n_sink = CAUSAL_SINK_TOKENS if self.causal else ENCODER_SINK_TOKENS
            parts += [ValueWeighted(self.projections), SinkShare(n_sink=n_sink, W_O=self.projections)]
        if self.parses is not None:
            from headlab.analysis.syntax import SyntaxAccuracy

            parts.append(SyntaxAccuracy(self.parses if shard is None else [self.parses[i] for i in shard.items]))
        return parts


def check_engine(engine: str, *, address: str | None = None, workers: int | None = None) -> None:
    """Refuse an engine ``analyze`` cannot run, before any work.

    Raises:
        ValueError: ``engine`` is not one of ``ENGINES``; ``workers`` is not a positive int; ``address``
            or ``workers`` given to the local engine.
        ImportError: ``engine="ray"`` without Ray installed (the message names ``headlab[ray]``).
        ConnectionError: nothing answers at ``address`` (``headlab.capture.distributed.check_address``).
    """
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not one of {', '.join(ENGINES)}")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"workers={workers!r}; expected a positive int (Ray workers)")
    if engine != "ray":
        for name, value in (("address", address), ("workers", workers)):
            if value is not None:
                raise ValueError(f"{name}={value!r} is for the Ray engine; expected engine='ray' with it "
                                 f"(got engine={engine!r})")
        return
    from headlab.capture.distributed import INSTALL, check_address

    try:
        import ray
    except ImportError as err:
        raise ImportError(f"engine='ray' needs Ray, which is not installed: {INSTALL}") from err
    if address is not None and not ray.is_initialized():  # a Ray already running in this process is used as it is
        check_address(address)


def analyze(
    model: Any,
    corpus: Any = None,
    *,
    heads: HeadSelection = None,
    quick: bool = False,
    importance: bool = True,
    syntax: bool = True,
    streaming: bool = False,
    engine: str = "local",
    address: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> AnalysisResult:
    """Run every head analysis on a loaded model.

    Args:
        model: what ``headlab.load`` returned.
        corpus: a text file, a list of strings, or None for the bundled corpus.
        heads: the heads to capture (surface, taxonomy, similarity, syntax), as
            ``headlab.heads.selection`` takes them; None for all.
        quick: smaller budgets (the first 60 corpus items, fewer probe sequences and task batches).
        importance: run importance and the pruning curve (the slowest part).
        syntax: run the dependency-syntax part when spaCy and its pipeline are installed.
        streaming: also run retrieval scores (causal language models) and the streaming-head
            simulation on every head of the model (``headlab.analysis.context_heads``; their own passes,
            one forward per head and window: minutes for MiniLM, hours for a model of a thousand heads).
        engine: where the capture pass runs: ``"local"`` (this process) or ``"ray"`` (the corpus in
            shards on Ray workers that each load the model from its source; docs/scaling.md). The
            probes, retrieval and streaming heads, importance and pruning run in this process either way.
        address: the Ray engine joins the cluster there (``"auto"``, ``"host:port"``); None starts a
            local Ray on this machine.
        workers: Ray workers of one thread each; None: one per CPU of the (local or joined) cluster.
        progress: show progress bars.

    Returns:
        An ``AnalysisResult``.

    Raises:
        ValueError: a bad engine, address or workers (``check_engine``), or bad input.
        ImportError: ``engine="ray"`` without Ray (names ``headlab[ray]``).
        headlab.capture.distributed.ShardError: a shard failed on a Ray worker (named).
    """
    check_engine(engine, address=address, workers=workers)
    texts = load_corpus(corpus).texts
    if quick:
        texts = texts[:60]
    causal = is_causal(model)
    skipped: dict[str, str] = {}
    parses = None
    if syntax:
        try:
            from headlab.analysis.parses import load_pipeline, parse_texts

            load_pipeline()
            parses = parse_texts(texts)
        except ImportError as err:
            skipped["syntax"] = str(err)
    else:
        skipped["syntax"] = "not asked for"
    projections = None
    try:
        projections = out_projections(model)
    except ValueError as err:  # no output projection that takes the heads' z: no value vectors to weigh
        skipped["value-weighted attention and sink share"] = str(err)
    # Similarity from a sample of each batch's query rows: all head pairs on every row cost many times the
    # forward pass (benchmarks/RESULTS.md), and the mean distance needs far fewer rows.
    accumulators = AnalysisAccumulators(causal=causal, parses=parses, row_fraction=SIMILARITY_ROW_FRACTION,
                                        W_O=projections)
    if engine == "ray":
        from headlab.capture.distributed import sharded_capture

        sharded = sharded_capture(model, texts, consumers=accumulators, heads=heads, take=accumulators.take,
                                  workers=workers, address=address, progress=progress)
        run, consumers = sharded.capture, sharded.consumers
    else:
        consumers = accumulators()
        run = capture(model, corpus=texts, heads=heads, take=accumulators.take, consumers=consumers,
                      progress=progress)
    surface, taxonomy, similarity, *rest = consumers
    weighted, sinks = rest[:2] if projections is not None else (None, None)
    syntax_acc = rest[-1] if parses is not None else None
    surface_result, taxonomy_result, similarity_result = surface.result(), taxonomy.result(), similarity.result()
    result = AnalysisResult(
        capture=run, surface=surface_result, roles=label_heads(surface_result), taxonomy=taxonomy_result,
        classes=classify(taxonomy_result), similarity=similarity_result, embedding=mds(similarity_result.distances),
        value_weighted=None if weighted is None else weighted.result(), sinks=None if sinks is None else sinks.result(),
        causal=causal, skipped=skipped,
    )
    if syntax_acc is not None:
        try:
            result.syntax = syntax_acc.result(min_count=5 if quick else 20)
        except ValueError as err:  # nothing parseable: a stated skip
            skipped["syntax"] = str(err)
    limit = headed(model).max_length
    length = PROBE_LENGTH if limit is None else min(PROBE_LENGTH, (limit - 1) // 2)  # [BOS] + r + r must fit
    if causal and length < 2:
        skipped["causal probes"] = f"the model takes {limit} positions; the probes need at least 5"
    elif causal:
        n_seqs = 4 if quick else 16
        result.probes = {"duplicate_token": duplicate_token_scores(model, n_seqs=n_seqs, length=length),
                         "induction": induction_scores(model, n_seqs=n_seqs, length=length)}
        for name, probe in result.probes.items():  # probe roles join the surface roles
            for key in probe.heads_above():
                result.roles[key] = (*result.roles.get(key, ()), f"{name}_head")
    else:
        skipped["causal probes"] = "duplicate-token and induction probes need a causal model"
    if not streaming:
        skipped["retrieval and streaming heads"] = "not asked for (streaming=True, --streaming)"
    elif getattr(model, "tokenizer", None) is None:
        skipped["retrieval and streaming heads"] = "the model has no tokenizer; both run on corpus text"
    else:
        try:
            result.context = context_heads(model, texts, quick=quick)
        except ShortCorpus as err:  # a few lines of corpus: the other parts still run
            skipped["retrieval and streaming heads"] = f"the corpus is too short: {err}"
        if result.context is not None and result.context.reason is not None:
            skipped["retrieval heads"] = f"retrieval scores need a causal language model: {result.context.reason}"
    if importance:
        _importance(model, texts, result, causal=causal, quick=quick)
    else:
        skipped["importance"] = "not asked for"
    return result


def _importance(model: Any, texts: list[str], result: AnalysisResult, *, causal: bool, quick: bool) -> None:
    """Gradient and ablation importance on the model's task, their correlation, and pruning curves."""
    tokenizer = model.tokenizer
    limit = model.max_length
    if causal:
        batches = lm_batches(tokenizer, texts[: 16 if quick else 64],
                             max_length=LM_MAX_LENGTH if limit is None else min(LM_MAX_LENGTH, limit))
        loss_fn = causal_lm_loss

        def loss(loaded: Any) -> float:
            import torch

            with torch.no_grad():
                return float(np.mean([causal_lm_loss(loaded.model, b).item() for b in batches]))

        metrics = {LM_METRIC: loss}
    else:
        from headlab.data.pairs import load_pairs

        max_length = MAX_LENGTH if limit is None else min(MAX_LENGTH, limit)
        pairs = load_pairs(labels=("paraphrase",))[: 24 if quick else None]
        batches = pair_batches(tokenizer, pairs, max_length=max_length)
        loss_fn = paraphrase_loss
        # Fidelity first: retrieval on these pairs is mostly solved by shared words, so it may not move.
        texts_for_fidelity = [t for p in pairs for t in (p.sentence_a, p.sentence_b)]
        metrics = {FIDELITY_METRIC: fidelity_metric(model, tokenizer, texts_for_fidelity, max_length=max_length),
                   RETRIEVAL_METRIC: retrieval_metric(tokenizer, pairs, max_length=max_length)}
    gradient = gradient_importance(model, batches, loss_fn)
    result.importance = {"gradient": gradient}
    if quick:
        result.skipped["ablation importance"] = "--quick: exact ablation runs one forward per head"
    else:
        ablation = ablation_importance(model, batches, loss_fn)
        result.importance["ablation"] = ablation
        result.importance_spearman = spearman(gradient.table["raw"], np.abs(ablation.table["raw"]))
    result.pruning = {name: pruning_curve(model, gradient, metric) for name, metric in metrics.items()}


def _pruning_sentence(metric: str, curve: PruningCurve) -> str:
    """One sentence on a pruning curve: where the metric goes as heads are masked, or that it does not move."""
    fmt = METRIC_FORMATS.get(metric, "{:.3g}").format
    first, last = curve.values[0], curve.values[-1]
    if curve.flat():
        low, high = fmt(min(curve.values)), fmt(max(curve.values))
        return (f"The {metric} stays at {fmt(first)}{'' if low == high else f' (between {low} and {high})'} from no "
                f"head masked to {curve.fractions[-1]:.0%} of them: this task cannot tell the heads apart, so its "
                "pruning curve says nothing about which heads matter.")
    middle = len(curve.values) // 2
    return (f"Masking heads least important first (gradient importance), the {metric} goes from {fmt(first)} with "
            f"every head to {fmt(curve.values[middle])} with {curve.fractions[middle]:.0%} masked and {fmt(last)} with "
            f"{curve.fractions[-1]:.0%} masked.")


def plot_heatmaps(surface: HeadTable, path: str | os.PathLike[str], *, causal: bool = False) -> None:
    """One layer × head heatmap per statistic that can vary for the model's kind (``head_statistics``),
    from a ``SurfaceStats`` result, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = head_statistics(causal=causal)
    cols = 3
    fig, axes = plt.subplots(math.ceil(len(names) / cols), cols, figsize=(4.2 * cols, 3.2 * math.ceil(len(names) / cols)))
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


def _jsonable(value: Any) -> Any:
    """NaN → None, numpy scalars → Python, tuples → lists (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
