"""``pair_view_data``: what the attention viewer shows of a text encoder-decoder (BART, Marian, T5) on (source, target)
pairs: the source and the target side by side, every selected head's pattern over its site's sides
(``headlab.models.seq2seq.site_sides``: the encoder's source × source, the decoder's self-attention target × target,
cross-attention target × source) and each head's statistics on these pairs.

Axis legend:
    patterns   (head, query_pos, key_pos)   one pair's shown heads, encoded (``encoding.quantize``), each over its own
                                            axes (``ViewerData.axes``)
    tokens     the source's pieces (the ``pieces`` level, which holds every pattern)
    target     the target's pieces as the decoder reads them: its start token, then the target less its last piece
               (``ViewerItem.target``)

One capture pass over the pairs (``headlab.capture.capture``: each batch carries both sides) feeds the collector below,
which encodes each pair's patterns as its batch arrives, ``SurfaceStats`` and ``TaxonomyStats``, each layer read on its
own sides (a cross-attention head has no statistic of one text's positions and no pattern class). Rollout and flow
multiply a layer's pattern into the next one's, which two sequences do not allow: the page has neither, and no word
level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from headlab.analysis.surface import SurfaceStats, is_causal
from headlab.analysis.taxonomy import TaxonomyStats
from headlab.capture import CaptureBatch, capture, load_corpus, tokenize_corpus
from headlab.capture.run import check_pairs
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel, headed
from headlab.models.handle import truncation_message
from headlab.models.seq2seq import SOURCE, TARGET, site_sides
from headlab.report.provenance import model_name
from headlab.report.viewer.levels import head_infos, text_level, token_strip
from headlab.report.viewer.payload import MAX_ENTRIES, Level, ViewerData, ViewerItem

__all__ = ["AXES", "pair_view_data"]

AXES = {SOURCE: "tokens", TARGET: "target"}  # a side of a pair → the viewer's axis that shows it


def pair_view_data(
    model: HeadedModel | nn.Module,
    pairs: tuple[str, str] | Sequence[tuple[str, str]],
    *,
    heads: HeadSelection = None,
    corpus_rows: Sequence[Mapping[str, Any]] | None = None,
    max_entries: int = MAX_ENTRIES,
    progress: bool = False,
) -> ViewerData:
    """Run a text encoder-decoder on ``pairs`` and encode what the viewer shows.

    Args:
        model: a text encoder-decoder's ``HeadedModel`` with a fast tokenizer (offsets come from it).
        pairs: one ``(source, target)`` pair of texts, or several (the viewer switches between them).
        heads: the heads to show (``headlab.heads.selection``); None for all.
        corpus_rows: per-head rows of a corpus-wide analysis (``AnalysisResult.rows()``), shown beside the
            statistics measured on ``pairs``.
        max_entries: most pattern entries (Σ over heads of queries × keys, every pair) the page may carry.
        progress: show the capture's progress bar.

    Returns:
        The viewer's data: one item per pair, its source at the ``pieces`` level (no word level), its target in
        ``ViewerItem.target``; each head's axes in ``ViewerData.axes``; no rollout, no flow.

    Raises:
        ValueError: a model that is not a text encoder-decoder, an empty side, a bad selection, more than
            ``max_entries`` entries (the message gives the count and how to cut it).
        TypeError: a pair that is not two strings, or a model without a fast tokenizer.
    """
    handle = headed(model)
    check_pairs(handle)
    corpus = load_corpus([pairs] if isinstance(pairs, tuple) else list(pairs))
    if corpus.targets is None:
        raise TypeError(f"pairs must be (source, target) tuples of two strings; got {pairs!r:.80}")
    if handle.tokenizer is None:
        raise TypeError(f"{handle.source} has no tokenizer; the viewer needs its fast tokenizer for token offsets")
    selection = handle.heads(heads, inputs={"input_ids": None})
    shown = [(layer, h) for layer, hs in selection.items() for h in hs]
    axes = {layer: (AXES[query], AXES[key]) for layer, (query, key) in
            ((layer, site_sides(handle.sites[layer])) for layer in selection)}
    max_length = handle.max_length
    sources = tokenize_corpus(handle.tokenizer, corpus.texts, max_length=max_length)
    targets = tokenize_corpus(handle.tokenizer, corpus.targets, max_length=max_length)
    sizes = [{AXES[SOURCE]: s, AXES[TARGET]: t} for s, t in zip(sources.lengths, targets.lengths)]
    entries = sum(size[axes[layer][0]] * size[axes[layer][1]] for size in sizes for layer, _ in shown)
    if entries > max_entries:
        raise ValueError(f"{len(sizes)} pair(s) × {len(shown)} heads need {entries:,} pattern entries, more than "
                         f"max_entries={max_entries:,}; show fewer heads (--layers/--heads) or shorter texts")
    causal = is_causal(handle)
    collector = _Collector(shown)
    surface, taxonomy = SurfaceStats(causal=causal), TaxonomyStats(causal=causal)
    run = capture(handle, corpus=corpus, heads=selection, take=("pattern",), consumers=[collector, surface, taxonomy],
                  progress=progress)
    info = head_infos(shown, surface, taxonomy, causal=causal, corpus_rows=corpus_rows)
    items = [ViewerItem(text=corpus.texts[k], full_length=sources.full_lengths[k], truncated=k in run.truncated,
                        pieces=collector.levels[k][0], words=None, target=collector.levels[k][1])
             for k in range(len(corpus))]
    notes = [truncation_message(run.truncated, len(items), max_length)] if run.truncated else []
    return ViewerData(name=model_name(handle.source), source=handle.source, architecture=handle.architecture,
                      causal=causal, n_heads=handle.n_heads, heads=shown, info=info, items=items,
                      max_length=max_length, notes=notes, axes=[axes[layer] for layer, _ in shown])


class _Collector:
    """A capture consumer that encodes each pair's shown heads, each over its layer's sides, as its batch arrives."""

    def __init__(self, shown: list[tuple[int, int]]) -> None:
        self.shown = shown
        self.levels: dict[int, tuple[Level, Level]] = {}  # pair → (source with the patterns, target strip)

    def update(self, batch: CaptureBatch) -> None:
        target = batch.target
        assert target is not None  # a capture over pairs
        for row in range(len(batch)):
            index = int(batch.corpus_indices[row])
            patterns = []
            for layer, head in self.shown:
                queries, keys = batch.sides(layer)
                taken = batch.layers[layer]
                assert taken.pattern is not None  # captured with take=("pattern",)
                n_q, n_k = int(queries.lengths[row]), int(keys.lengths[row])
                patterns.append(taken.pattern[row, taken.heads.index(head), :n_q, :n_k].float().cpu())
            source = _side(batch, row)
            self.levels[index] = (text_level("pieces", patterns, *source, list(range(len(source[1]))), paths={}),
                                  token_strip(*_side(target, row)))


def _side(side: CaptureBatch, row: int) -> tuple[str, list[str], list[list[int]], list[bool]]:
    """``(text, tokens, offsets, special)`` of item ``row`` of one side."""
    n = int(side.lengths[row])
    return side.texts[row], side.tokens[row], side.offsets[row, :n].tolist(), side.special_tokens_mask[row, :n].tolist()
