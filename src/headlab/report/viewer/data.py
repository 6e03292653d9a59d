"""``view_data``: what the attention viewer shows of a text model (``payload.ViewerData``): every selected head's
pattern on a few texts, at piece and word level, with each head's statistics and role labels measured on those
texts. An image model's goes to ``images.image_view_data``, an audio model's to ``audio.audio_view_data``.

Axis legend:
    patterns   (head, query_pos, key_pos)   one layer's selected heads on one item
    pos        word pieces of one item, special tokens included (``pieces`` level)
    word       words and special tokens (``words`` level; ``headlab.capture.words``)

One capture pass (``headlab.capture.capture``) feeds three consumers at once: the collector below,
which encodes each item's patterns as it goes (``encoding.quantize``: one byte per entry, so the
float patterns never pile up), ``SurfaceStats`` and ``TaxonomyStats``. The collector also computes each
item's attention rollout through every layer up to the last shown one and, for items of at most
``flow_max_length`` pieces, its attention flow (``headlab.analysis.flow``; every head of those layers is
captured for them); at word level both are pooled from the piece level the way patterns are. Roles come from
``headlab.analysis.roles.label_heads`` and pattern classes from ``headlab.analysis.taxonomy.classify``,
on the viewed texts themselves. Given edge scores (``headlab.circuits``), the page also carries each shown
head's strongest incoming and outgoing edges (``circuit.circuit_view``) for its circuit panel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from headlab.analysis.flow import FLOW_MAX_LENGTH, attention_flow, rollout
from headlab.analysis.surface import SurfaceStats, is_causal
from headlab.analysis.taxonomy import TaxonomyStats
from headlab.capture import CaptureBatch, LayerCapture, capture, pattern_to_words, tokenize_corpus
from headlab.circuits.graph import EdgeScores
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel, headed
from headlab.models.audio import takes_features
from headlab.models.handle import truncation_message
from headlab.models.images import takes_pixels
from headlab.models.seq2seq import is_pairs
from headlab.report.provenance import model_name
from headlab.report.viewer.audio import audio_view_data
from headlab.report.viewer.circuit import TOP_EDGES, circuit_view
from headlab.report.viewer.images import image_view_data
from headlab.report.viewer.levels import head_infos, text_level
from headlab.report.viewer.pairs import pair_view_data
from headlab.report.viewer.payload import MAX_ENTRIES, Level, ViewerData, ViewerItem

__all__ = ["view_data"]


def view_data(
    model: HeadedModel | nn.Module,
    texts: str | Sequence[str] | Sequence[tuple[str, str]],
    *,
    heads: HeadSelection = None,
    corpus_rows: Sequence[Mapping[str, Any]] | None = None,
    max_entries: int = MAX_ENTRIES,
    flow_max_length: int = FLOW_MAX_LENGTH,
    edges: EdgeScores | None = None,
    edge_texts: tuple[str, str] | None = None,
    top_edges: int = TOP_EDGES,
    progress: bool = False,
) -> ViewerData:
    """Run the model on ``texts`` and encode what the viewer shows.

    Args:
        model: a ``HeadedModel`` (``headlab.load``) with a fast tokenizer, needed for offsets (an image model: its
            image processor).
        texts: one text or several (the viewer switches between them); for a text encoder-decoder also a
            ``(source, target)`` pair or a list of them (``pairs.pair_view_data``: source and target side by side, no
            edges, no rollout or flow); for an image model (``main_input_name ==
            "pixel_values"``), images: ``images.image_view_data`` shows them (no edges then); for an audio model
            (``main_input_name == "input_features"``: Whisper), recordings: ``audio.audio_view_data`` shows them (no
            edges, no rollout or flow).
        heads: the heads to show (``headlab.heads.selection``); None for all.
        corpus_rows: per-head rows of a corpus-wide analysis (``AnalysisResult.rows()``), shown
            next to the statistics measured on ``texts``.
        max_entries: most pattern entries (heads × positions², both levels; rollout and flow count as a
            head per layer) the page may carry.
        flow_max_length: compute attention flow for items of at most this many pieces (its cost grows like
            pieces⁴; ``headlab.analysis.flow.FLOW_MAX_LENGTH``); 0 for none.
        edges: edge scores of this model (``headlab.circuits.edge_attribution``, ``edge_patching``,
            ``path_patching``): clicking a head then shows its strongest incoming and outgoing edges
            (``circuit.circuit_view``); None: no circuit panel.
        edge_texts: ``(clean, corrupted)``, the texts the edges were scored on, shown with them (``EdgeScores``
            does not keep them); None to leave them out.
        top_edges: most edges each way per head that the page carries.
        progress: show the capture's progress bar.

    Returns:
        The viewer's data.

    Raises:
        ValueError: no text, an empty text, a bad selection, a negative ``flow_max_length``, more
            than ``max_entries`` entries (the message gives the count and how to cut it), or edges that do not
            fit the model, a bad ``top_edges`` or ``edge_texts`` (``circuit.circuit_view``).
        TypeError: the model has no fast tokenizer.
    """
    pixels, audio = takes_pixels(headed(model).model), takes_features(headed(model).model)
    pairs = is_pairs(texts)
    if (pixels or audio or pairs) and (edges is not None or edge_texts is not None):
        what = "(source, target) pairs" if pairs else "images" if pixels else "audio"
        raise ValueError(f"{headed(model).architecture} on {what}: its viewer has no circuit panel (edges=, "
                         "edge_texts= are for texts)")
    if pairs:
        return pair_view_data(model, cast(Sequence[tuple[str, str]], texts), heads=heads, corpus_rows=corpus_rows,
                              max_entries=max_entries, progress=progress)
    texts = cast("str | Sequence[str]", texts)  # not pairs
    if pixels:
        return image_view_data(model, texts, heads=heads, corpus_rows=corpus_rows, max_entries=max_entries,
                               flow_max_length=flow_max_length, progress=progress)
    if audio:
        return audio_view_data(model, texts, heads=heads, corpus_rows=corpus_rows, max_entries=max_entries,
                               progress=progress)
    if isinstance(flow_max_length, bool) or not isinstance(flow_max_length, int) or flow_max_length < 0:
        raise ValueError(f"flow_max_length={flow_max_length!r}; expected an int >= 0 (pieces; 0: no flow)")
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise ValueError("no text to view: pass at least one non-empty text")
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ValueError(f"text {empty[0]} is empty or whitespace only; every viewed text needs a word")
    model = headed(model)
    if model.tokenizer is None:
        raise TypeError(f"{model.source} has no tokenizer; the viewer needs its fast tokenizer for token offsets")
    n_heads = model.n_heads
    text = {"input_ids": None}  # the layers text runs (not a vision tower's: headlab.models.HeadedModel.heads)
    selection = model.heads(heads, inputs=text)
    shown = [(layer, h) for layer, hs in selection.items() for h in hs]
    if edges is None and edge_texts is not None:
        raise ValueError("edge_texts name the inputs of edge scores; pass the scores too (edges=)")
    circuit = None if edges is None else circuit_view(edges, [site.kv_head_of for site in model.sites], heads=shown,
                                                      top=top_edges, texts=edge_texts)
    max_length = model.max_length
    tokenized = tokenize_corpus(model.tokenizer, texts, max_length=max_length)
    lengths = tokenized.lengths
    depth = 1 + max(layer for layer, _ in shown)  # rollout and flow run through every layer up to the last shown
    entries = 2 * sum((len(shown) + depth * (1 + (n <= flow_max_length))) * n * n for n in lengths)  # both levels
    if entries > max_entries:
        raise ValueError(
            f"{len(texts)} text(s) of {max(lengths)} pieces at most × {len(shown)} heads need up to {entries:,} "
            f"pattern entries, more than max_entries={max_entries:,}; show fewer heads (--layers/--heads) "
            "or shorter texts"
        )
    causal = is_causal(model)
    collector = _Collector(shown, flow_max_length=flow_max_length)
    surface, taxonomy = SurfaceStats(causal=causal), TaxonomyStats(causal=causal)
    every_head = {layer: heads for layer, heads in model.heads(None, inputs=text).items()  # rollout: every head
                  if layer < depth}
    run = capture(model, corpus=texts, heads=every_head, take=("pattern",),
                  consumers=[collector, surface, taxonomy], progress=progress)
    info = head_infos(shown, surface, taxonomy, causal=causal, corpus_rows=corpus_rows)
    items = [ViewerItem(text=texts[k], full_length=tokenized.full_lengths[k], truncated=k in run.truncated,
                        pieces=collector.levels[k][0], words=collector.levels[k][1]) for k in range(len(texts))]
    cut = [k for k, it in enumerate(items) if it.truncated]
    notes = [truncation_message(cut, len(items), max_length)] if cut else []
    return ViewerData(name=model_name(model.source), source=model.source, architecture=model.architecture,
                      causal=causal, n_heads=n_heads, heads=shown, info=info, items=items, max_length=max_length,
                      notes=notes, flow_max_length=flow_max_length, circuit=circuit)


class _Collector:
    """A capture consumer that encodes each item's patterns at both levels as its batch arrives."""

    def __init__(self, shown: list[tuple[int, int]], *, flow_max_length: int) -> None:
        self.shown = shown
        self.flow_max_length = flow_max_length
        self.levels: dict[int, tuple[Level, Level | None]] = {}

    def update(self, batch: CaptureBatch) -> None:
        units, n_units = batch.word_units()
        patterns = {layer: _pattern(taken) for layer, taken in batch.layers.items()}
        for row in range(len(batch)):
            n = int(batch.lengths[row])
            index = int(batch.corpus_indices[row])
            layers = batch.layers
            stack = torch.stack([patterns[layer][row, layers[layer].heads.index(head), :n, :n]
                                 for layer, head in self.shown]).float().cpu()  # (head, n, n)
            text, tokens = batch.texts[row], batch.tokens[row]
            offsets = batch.offsets[row, :n].tolist()
            special = batch.special_tokens_mask[row, :n].bool().tolist()
            # every head of each layer, averaged: rollout and flow read nothing else
            means = [patterns[layer][row, :, :n, :n].float().mean(0, keepdim=True).cpu()
                     for layer in sorted(layers)]
            paths = {"rollout": rollout(means)}
            if n <= self.flow_max_length:
                paths["flow"] = attention_flow(means, max_length=self.flow_max_length)
            pieces = text_level("pieces", stack, text, tokens, offsets, special, list(range(n)), paths)
            item_units = units[row, :n].cpu()
            words = None
            if int(n_units[row]) < n:  # some word has several pieces
                pooled = {k: pattern_to_words(v, item_units) for k, v in paths.items()}
                words = text_level("words", pattern_to_words(stack.double(), item_units).float(), text, tokens, offsets,
                               special, item_units.tolist(), pooled)
            self.levels[index] = (pieces, words)


def _pattern(taken: LayerCapture) -> torch.Tensor:
    """A captured layer's patterns: the viewer captures them (take=("pattern",))."""
    assert taken.pattern is not None
    return taken.pattern
