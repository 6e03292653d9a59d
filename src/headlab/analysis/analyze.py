"""``analyze``: every head analysis of one model in one run.

One capture pass over the corpus (patterns and v) feeds all the accumulators at once (surface
statistics, taxonomy, similarity, value-weighted attention, the sink share, syntax); the causal
probes, retrieval and streaming heads, importance and the pruning curve then run their own short
passes. The capture pass runs in this process (``engine="local"``) or in shards
on Ray workers (``engine="ray"``, ``headlab.capture.distributed``); both make their accumulators
with ``AnalysisAccumulators`` (``headlab.analysis.capture_pass``), held by name in a
``PassAccumulators``, and give the same result. Parts that cannot run for this model or this install
(the causal probes on a bidirectional model, syntax without spaCy) are skipped with the reason on record.

The result (``AnalysisResult``, ``headlab.analysis.result``) writes (``AnalysisResult.write``)
heads.json and heads.csv (one row per head; fields in docs/analysis.md), relations.csv
(``headlab.analysis.files``), and PNG plots (``headlab.analysis.plots``): heatmaps.png (layer × head
per statistic), mds.png, value_weighted.png (raw vs value-weighted attention on the sink tokens),
sinks.png (the sink share by query position), streaming.png (loss change of streaming heads against
the window), pruning.png. Its sentences are made by ``headlab.analysis.sentences``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch import nn

from headlab.analysis.audio import analyze_audio
from headlab.analysis.capture_pass import SIMILARITY_ROW_FRACTION, AnalysisAccumulators, PassAccumulators
from headlab.analysis.context_heads import context_heads, copy_haystack
from headlab.analysis.images import analyze_images
from headlab.analysis.importance import (
    LM_MAX_LENGTH,
    MAX_LENGTH,
    causal_lm_loss,
    fidelity_metric,
    lm_batches,
    pair_batches,
    paraphrase_loss,
    retrieval_metric,
)
from headlab.analysis.norms import out_projections
from headlab.analysis.plots import plot_heatmaps
from headlab.analysis.result import AnalysisResult
from headlab.analysis.roles import duplicate_token_scores, induction_scores, label_heads
from headlab.analysis.sentences import (
    FIDELITY_METRIC,
    LM_METRIC,
    METRIC_FORMATS,
    RETRIEVAL_METRIC,
    TABLE_RELATIONS,
)
from headlab.analysis.similarity import mds
from headlab.analysis.surface import POSITIONAL, is_causal
from headlab.analysis.taxonomy import classify
from headlab.capture import capture, load_corpus
from headlab.capture.corpus import ShortCorpus
from headlab.capture.run import blocks_needed, check_pairs
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel, headed
from headlab.models.audio import takes_features
from headlab.models.images import takes_pixels
from headlab.models.stream import has_logits

__all__ = [  # the orchestration, and the names it gathers from the modules it calls
    "ENGINES", "FIDELITY_METRIC", "LM_METRIC", "METRIC_FORMATS", "PROBE_LENGTH", "RETRIEVAL_METRIC",
    "SIMILARITY_ROW_FRACTION", "TABLE_RELATIONS", "AnalysisAccumulators", "AnalysisResult", "PassAccumulators",
    "analyze", "check_engine", "plot_heatmaps",
]

PROBE_LENGTH = 32  # tokens in each repeated half of the causal probes (fewer when the model is shorter)
ENGINES = ("local", "ray")  # where the capture pass runs: this process, or Ray workers
# What an image or an audio model analyses instead of text: its analysis, its kind, the corpus it needs.
_MEDIA = {"images": (analyze_images, "image", "a folder of images"),
          "audio": (analyze_audio, "audio", "a folder of WAV files")}


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
    model: HeadedModel | nn.Module,
    corpus: Any = None,
    *,
    heads: HeadSelection = None,
    quick: bool = False,
    importance: bool = True,
    syntax: bool = True,
    streaming: bool = False,
    max_length: int | None = None,
    max_pattern_memory: int | None = None,
    engine: str = "local",
    address: str | None = None,
    workers: int | None = None,
    progress: bool = True,
) -> AnalysisResult:
    """Run every head analysis on a loaded model.

    Args:
        model: a ``HeadedModel`` with a tokenizer (``headlab.load``), or an attached model whose handle has one.
        corpus: a text file, a list of strings, or None for the bundled corpus; for a text encoder-decoder also
            (source, target) pairs (a list of tuples, or ``load_corpus(path, pairs=True)``: each layer is read on its
            own sides, the statistics of one text's positions skipped for cross-attention layers, with the reason);
            for an image model (``main_input_name
            == "pixel_values"``), images (``headlab.analysis.images.analyze_images``: a folder, files, PIL images or
            pixel values; there is no bundled image corpus): what only means something for text is skipped; for an
            audio encoder-decoder (``main_input_name == "input_features"``: Whisper), recordings
            (``headlab.analysis.audio.analyze_audio``: a folder of WAV files, files, samples; none is bundled).
        heads: the heads to capture (surface, taxonomy, similarity, syntax), as
            ``headlab.heads.selection`` takes them; None for all.
        quick: smaller budgets (the first 60 corpus items, fewer probe sequences and task batches).
        importance: run importance and the pruning curve (the slowest part).
        syntax: run the dependency-syntax part when spaCy and its pipeline are installed.
        streaming: also run retrieval scores (causal language models) and the streaming-head
            simulation on the selected heads (``heads``; ``headlab.analysis.context_heads``: their own passes,
            one forward per selected head and window: minutes for every head of MiniLM, hours for a model of a
            thousand heads).
        max_length: most pieces per corpus item (longer ones are cut, with the one ``TruncationWarning`` sentence)
            and, with ``streaming``, the length of the streaming chunks and of the needle-style copy cases; each
            shrunk to the model's position table. None: the model's limit for the corpus, the quick/full sizes for
            the context passes.
        max_pattern_memory: the most bytes of whole patterns a batch of the capture pass may hold; where a batch's
            would take more, the taps keep what makes them and the statistics read them in row blocks
            (``headlab.capture.blocks``): memory linear in the length, and the pattern classes and syntax (which
            need whole patterns) skipped with the reason. None: a share of the device's free memory (``capture``).
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
        ValueError: a bad engine, address or workers (``check_engine``), or bad input; pairs for a model that is not
            a text encoder-decoder, or with the Ray engine; an image model without
            images, an audio model without recordings, either with the Ray engine.
        TypeError: images without an image processor, recordings without a feature extractor.
        ImportError: ``engine="ray"`` without Ray (names ``headlab[ray]``).
        headlab.capture.distributed.ShardError: a shard failed on a Ray worker (named).
    """
    check_engine(engine, address=address, workers=workers)
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"max_length={max_length!r}: expected an int ≥ 1 (pieces per item)")
    model = headed(model)
    media = "images" if takes_pixels(model.model) else "audio" if takes_features(model.model) else None
    if media is not None:  # no bundled corpus, one process: the media's own analysis
        analysis, kind, folder = _MEDIA[media]
        if corpus is None:
            raise ValueError(f"{model.architecture} takes {media} and headlab bundles none: give {folder} "
                             f"(headlab analyze MODEL --{media} FOLDER; analyze(model, folder))")
        if engine != "local":
            raise ValueError(f"engine={engine!r}: the Ray engine shards text corpora; an {kind} model runs with "
                             "engine='local'")
        if max_length is not None:
            raise ValueError(f"max_length={max_length}: pieces of text; an {kind} model's inputs are cut by its "
                             "processor")
        return analysis(model, corpus, heads=heads, quick=quick, importance=importance, progress=progress)
    if streaming and max_length is not None and model.tokenizer is not None and all(s.causal for s in model.sites):
        # a length that cannot hold a needle and its copy: refused before the capture pass, not after it
        copy_haystack(model, max_length, quick=quick)
    loaded = load_corpus(corpus)
    if loaded.targets is not None:
        check_pairs(model)
        if engine != "local":
            raise ValueError(f"engine={engine!r}: the Ray engine shards corpora of texts; (source, target) pairs run "
                             "with engine='local'")
    items: Sequence[str] | Sequence[tuple[str, str]] = loaded.texts if loaded.pairs is None else loaded.pairs
    if quick:
        items = items[:60]
    texts = loaded.texts[: len(items)]  # the texts themselves, or the pairs' sources
    causal = is_causal(model)
    skipped: dict[str, str] = {} if loaded.targets is None else _skipped_on_pairs(model, heads)
    blocks = None if loaded.targets is not None else blocks_needed(
        model, list(items), heads=heads, max_length=max_length, max_pattern_memory=max_pattern_memory)
    if blocks is not None:
        why = f"{blocks}: the patterns go to the statistics in row blocks, and these need them whole"
        skipped |= {"pattern classes": why, "syntax": why}
    parses = None
    if blocks is None and syntax:
        try:
            from headlab.analysis.parses import load_pipeline, parse_texts

            load_pipeline()
            parses = parse_texts(texts)
        except ImportError as err:
            skipped["syntax"] = str(err)
    elif blocks is None:
        skipped["syntax"] = "not asked for"
    projections = None
    try:
        projections = out_projections(model)
    except ValueError as err:  # no output projection that takes the heads' z: no value vectors to weigh
        skipped["value-weighted attention and sink share"] = str(err)
    # Similarity from a sample of each batch's query rows: all head pairs on every row cost many times the
    # forward pass (benchmarks/RESULTS.md), and the mean distance needs far fewer rows.
    accumulators = AnalysisAccumulators(causal=causal, parses=parses, row_fraction=SIMILARITY_ROW_FRACTION,
                                        W_O=projections, blocks=blocks is not None)
    if engine == "ray":
        from headlab.capture.distributed import sharded_capture

        sharded = sharded_capture(model, list(texts), consumers=accumulators, heads=heads, take=accumulators.take,
                                  workers=workers, address=address, max_length=max_length, progress=progress,
                                  max_pattern_memory=max_pattern_memory)
        run, consumers = sharded.capture, sharded.consumers
    else:
        consumers = accumulators()
        run = capture(model, corpus=items, heads=heads, take=accumulators.take, consumers=consumers,
                      max_length=max_length, progress=progress, max_pattern_memory=max_pattern_memory)
    parts: PassAccumulators = consumers  # either engine: the factory's accumulators, by name
    surface, similarity = parts.surface.result(), parts.similarity.result()
    # none when every layer analysed is cross-attention (pairs): the classes read one text's positions
    taxonomy = parts.taxonomy.result() if parts.taxonomy is not None and parts.taxonomy.sums else None
    result = AnalysisResult(
        capture=run, surface=surface, roles=label_heads(surface), taxonomy=taxonomy,
        classes={} if taxonomy is None else classify(taxonomy),
        similarity=similarity, embedding=mds(similarity.distances),
        value_weighted=None if parts.value_weighted is None else parts.value_weighted.result(),
        sinks=None if parts.sinks is None else parts.sinks.result(), causal=causal, skipped=skipped,
    )
    if result.sinks is not None:  # one definition of a sink head (SinkShare's, on the corpus): its role label
        for key in result.sinks.sink_heads():
            result.roles[key] = (*result.roles.get(key, ()), "sink")
    if parts.syntax is not None:
        try:
            result.syntax = parts.syntax.result(min_count=5 if quick else 20)
        except ValueError as err:  # nothing parseable: a stated skip
            skipped["syntax"] = str(err)
    limit = model.max_length
    length = PROBE_LENGTH if limit is None else min(PROBE_LENGTH, (limit - 1) // 2)  # [BOS] + r + r must fit
    mixed = causal and not all(site.causal for site in model.sites)  # an encoder-decoder: bidirectional layers too
    if mixed:
        skipped["causal probes"] = (f"{model.architecture} has bidirectional layers beside its causal ones (an "
                                    "encoder-decoder): the probes need every layer causal")
    elif causal and length < 2:
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
    if mixed:
        skipped["retrieval and streaming heads"] = "both need a decoder-only causal language model"
    elif not streaming:
        skipped["retrieval and streaming heads"] = ("off: pass --streaming (analyze(..., streaming=True)) to run them; "
                                                    "the report runs them in its own section")
    elif model.tokenizer is None:
        skipped["retrieval and streaming heads"] = "the model has no tokenizer; both run on corpus text"
    elif causal and not has_logits(model):
        skipped["retrieval and streaming heads"] = (f"{model.architecture} is causal but has no language-model head: "
                                                    "both measure the next-token loss")
    else:
        try:
            result.context = context_heads(model, texts, quick=quick, heads=heads, length=max_length)
        except ShortCorpus as err:  # a few lines of corpus: the other parts still run
            skipped["retrieval and streaming heads"] = f"the corpus is too short: {err}"
        if result.context is not None and result.context.reason is not None:
            skipped["retrieval heads"] = f"retrieval scores need a causal language model: {result.context.reason}"
    if importance:
        _importance(model, texts, result, causal=causal and not mixed, quick=quick)
    else:
        skipped["importance"] = "not asked for"
    return result


def _skipped_on_pairs(model: HeadedModel, heads: HeadSelection) -> dict[str, str]:
    """What a corpus of (source, target) pairs leaves out, and why (``AnalysisResult.skipped``): the statistics that
    compare a query's and a key's positions in one text, for the cross-attention layers analysed."""
    selection = model.heads(heads, inputs={"input_ids": None})
    cross = [model.sites[layer].address for layer in selection if model.sites[layer].cross]
    if not cross:
        return {}
    named = ", ".join(cross)
    return {
        "position statistics of cross-attention layers": f"{', '.join(POSITIONAL)} compare a query's and a key's "
                                                          f"positions in one text; {named} attend from the target's "
                                                          "positions to the source's: NaN there",
        "pattern classes of cross-attention layers": f"Kovaleva et al.'s classes read one text's diagonal and "
                                                     f"segments: none for {named}",
        "syntax and similarity of the decoder's layers": "the parses are the sources' and heads compare on the same "
                                                         "query rows and keys: both run on the encoder's heads (when "
                                                         "no encoder layer is analysed, similarity on the decoder's "
                                                         "self-attention heads, else the cross-attention heads)",
    }


def _importance(model: HeadedModel, texts: Sequence[str], result: AnalysisResult, *, causal: bool, quick: bool) -> None:
    """Gradient and ablation importance on the model's task, their correlation, and pruning curves: next-token
    loss for a causal language model, the output embedding's similarity for any other (a causal model without
    a language-model head included, said in ``result.skipped``)."""
    tokenizer = model.tokenizer
    limit = model.max_length
    if causal and not has_logits(model):
        causal = False
        result.skipped["next-token importance"] = (
            f"{model.architecture} has no language-model head (its output is hidden states, not logits): importance "
            "and the pruning curves use the output embedding's similarity instead")
    if causal:
        batches = lm_batches(tokenizer, texts[: 16 if quick else 64],
                             max_length=LM_MAX_LENGTH if limit is None else min(LM_MAX_LENGTH, limit))
        loss_fn = causal_lm_loss

        def loss(loaded: Any) -> float:
            import torch

            with torch.no_grad():
                return float(np.mean([causal_lm_loss(loaded.model, b).item() for b in batches]))

        metrics: dict[str, Callable[[Any], float]] = {LM_METRIC: loss}
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
    result.measure_importance(model, batches, loss_fn, metrics, quick=quick)
