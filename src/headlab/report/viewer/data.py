"""What the attention viewer shows: every selected head's pattern on a few texts, at piece and word level,
with each head's statistics and role labels measured on those texts.

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

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from headlab.analysis.flow import FLOW_MAX_LENGTH, attention_flow, rollout
from headlab.analysis.roles import label_heads
from headlab.analysis.surface import FIXED_WHEN_CAUSAL, STATISTICS, SurfaceStats, is_causal
from headlab.analysis.taxonomy import TaxonomyStats, classify
from headlab.capture import CaptureBatch, LayerCapture, capture, pattern_to_words, tokenize_corpus
from headlab.circuits.graph import EdgeScores
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel, headed
from headlab.models.handle import truncation_message
from headlab.report.provenance import model_name
from headlab.report.viewer.circuit import TOP_EDGES, CircuitView, circuit_view
from headlab.report.viewer.encoding import QuantizedPattern, quantize, thumbnails

__all__ = ["MAX_ENTRIES", "HeadInfo", "Level", "ViewerData", "ViewerItem", "view_data"]

MAX_ENTRIES = 400_000_000  # pattern entries (one byte each before deflate) one page may carry
_TAXONOMY = ("special", "band", "block", "top_columns")


@dataclass(frozen=True)
class HeadInfo:
    """One head as measured on the viewed texts.

    Attributes:
        layer, head: the head's address.
        roles: labels from ``label_heads`` (possibly none).
        pattern_class: the Kovaleva et al. class from ``classify``.
        stats: every surface statistic and the taxonomy scores (NaN-free: a statistic that could
            not be measured on these texts, e.g. ``block`` without two sentences, is left out).
        corpus: what a corpus-wide analysis found for this head (``AnalysisResult.rows()``), if given.
    """

    layer: int
    head: int
    roles: tuple[str, ...]
    pattern_class: str
    stats: dict[str, float]
    corpus: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "head": self.head, "roles": list(self.roles), "class": self.pattern_class,
                "stats": dict(self.stats), "corpus": self.corpus}


@dataclass(frozen=True)
class Level:
    """One item at one level of detail.

    Attributes:
        name: ``"pieces"`` or ``"words"``.
        labels: each position's text (a special token's own string, e.g. ``[CLS]``).
        gaps: the text between the previous position and this one (usually a space), so that the
            labels and gaps together give back the item's text.
        tail: the text after the last position.
        special: True at special tokens.
        pieces: word pieces in each position (1 at piece level).
        patterns: one encoded pattern per head, in ``ViewerData.heads`` order.
        thumb_size, thumbs: every head's pooled pattern (``encoding.thumbnails``).
        rollout: per layer 0 … the last shown layer, the attention rollout through it (``flow.rollout``).
        flow: the same for attention flow (``flow.attention_flow``), or None when the item has more than
            ``ViewerData.flow_max_length`` pieces.
    """

    name: str
    labels: list[str]
    gaps: list[str]
    tail: str
    special: list[bool]
    pieces: list[int]
    patterns: list[QuantizedPattern]
    thumb_size: int
    thumbs: bytes
    rollout: list[QuantizedPattern] = field(default_factory=list)
    flow: list[QuantizedPattern] | None = None

    @property
    def n(self) -> int:
        return len(self.labels)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "n": self.n, "labels": self.labels, "gaps": self.gaps, "tail": self.tail,
                "special": self.special, "pieces": self.pieces, "patterns": [p.to_dict() for p in self.patterns],
                "thumbSize": self.thumb_size, "thumbs": base64.b64encode(self.thumbs).decode("ascii"),
                "rollout": [p.to_dict() for p in self.rollout],
                "flow": None if self.flow is None else [p.to_dict() for p in self.flow]}


@dataclass(frozen=True)
class ViewerItem:
    """One viewed text.

    Attributes:
        text: the text as given.
        full_length: its length in pieces before truncation (special tokens included).
        truncated: True when it was cut to the model's limit; only the first ``pieces.n`` pieces are shown.
        pieces: the piece-level view.
        words: the word-level view, or None when every word is a single piece.
    """

    text: str
    full_length: int
    truncated: bool
    pieces: Level
    words: Level | None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "fullLength": self.full_length, "truncated": self.truncated,
                "pieces": self.pieces.to_dict(), "words": None if self.words is None else self.words.to_dict()}


@dataclass(frozen=True)
class ViewerData:
    """Everything the viewer page needs.

    Attributes:
        name: the model's short name (``headlab.report.provenance.model_name``).
        source: where the model came from.
        architecture: its model class, e.g. ``"BertModel"``.
        causal: whether its attention is causal.
        n_heads: heads of every layer of the model.
        heads: the shown ``(layer, head)`` pairs, in layer then head order.
        info: one ``HeadInfo`` per shown head, same order.
        items: the viewed texts.
        max_length: the truncation length in pieces, or None.
        flow_max_length: the longest item (in pieces) whose attention flow is computed.
        circuit: each shown head's strongest edges (``circuit.CircuitView``), or None: no circuit panel.
    """

    name: str
    source: str
    architecture: str
    causal: bool
    n_heads: list[int]
    heads: list[tuple[int, int]]
    info: list[HeadInfo]
    items: list[ViewerItem]
    max_length: int | None = None
    notes: list[str] = field(default_factory=list)
    flow_max_length: int = FLOW_MAX_LENGTH
    circuit: CircuitView | None = None

    def head_index(self, layer: int, head: int) -> int:
        """The position of ``(layer, head)`` in ``heads`` (and in every ``Level.patterns``).

        Raises:
            KeyError: the head is not shown.
        """
        try:
            return self.heads.index((layer, head))
        except ValueError:
            raise KeyError(f"(layer {layer}, head {head}) is not among the shown heads {self.heads}") from None

    @property
    def nbytes(self) -> int:
        """Bytes of encoded patterns and thumbnails (before base64)."""
        levels = [lv for item in self.items for lv in (item.pieces, item.words) if lv is not None]
        matrices = [p for lv in levels for p in (*lv.patterns, *lv.rollout, *(lv.flow or ()))]
        return sum(p.nbytes for p in matrices) + sum(len(lv.thumbs) for lv in levels)

    def to_dict(self) -> dict[str, Any]:
        """Returns: the page's payload (the format ``static/viewer.js`` reads)."""
        return {"format": 1, "name": self.name, "source": self.source, "architecture": self.architecture,
                "causal": self.causal, "nHeads": list(self.n_heads), "heads": [list(h) for h in self.heads],
                "info": [i.to_dict() for i in self.info], "items": [it.to_dict() for it in self.items],
                "maxLength": self.max_length, "notes": list(self.notes), "flowMaxLength": self.flow_max_length,
                "circuit": None if self.circuit is None else self.circuit.to_dict()}

    def __repr__(self) -> str:
        pieces = sum(item.pieces.n for item in self.items)
        circuit = "" if self.circuit is None else f", the strongest {self.circuit.method} edges of each head"
        return (f"ViewerData: {len(self.heads)} heads of {self.name} ({self.architecture}) on {len(self.items)} "
                f"text{'s' if len(self.items) != 1 else ''}, {pieces} word pieces, {self.nbytes:,} bytes encoded"
                f"{circuit}")


def view_data(
    model: HeadedModel | nn.Module,
    texts: str | Sequence[str],
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
        model: a ``HeadedModel`` (``headlab.load``) with a fast tokenizer, needed for offsets.
        texts: one text or several (the viewer switches between them).
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
    selection = model.heads(heads)
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
    every_head = {layer: list(range(n_heads[layer])) for layer in range(depth)}  # rollout averages every head
    run = capture(model, corpus=texts, heads=every_head, take=("pattern",),
                  consumers=[collector, surface, taxonomy], progress=progress)
    surface_result, taxonomy_result = surface.result(), taxonomy.result()
    roles, classes = label_heads(surface_result), classify(taxonomy_result)
    # Statistics that cannot tell heads apart in a model of this kind (next-token for a causal one) are left out.
    fixed = set(FIXED_WHEN_CAUSAL) if causal else set()
    by_head = {(int(r["layer"]), int(r["head"])): {k: v for k, v in r.items() if k not in fixed}
               for r in corpus_rows or ()}
    info = []
    for layer, head in shown:
        stats = {name: surface_result.value(name, layer, head) for name in STATISTICS if name not in fixed}
        stats |= {name: taxonomy_result.value(name, layer, head) for name in _TAXONOMY}
        info.append(HeadInfo(layer=layer, head=head, roles=roles.get((layer, head), ()),
                             pattern_class=classes.get((layer, head), ""),
                             stats={k: v for k, v in stats.items() if v == v},  # NaN: not measurable here
                             corpus=by_head.get((layer, head))))
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
            pieces = _level("pieces", stack, text, tokens, offsets, special, list(range(n)), paths)
            item_units = units[row, :n].cpu()
            words = None
            if int(n_units[row]) < n:  # some word has several pieces
                pooled = {k: pattern_to_words(v, item_units) for k, v in paths.items()}
                words = _level("words", pattern_to_words(stack.double(), item_units).float(), text, tokens, offsets,
                               special, item_units.tolist(), pooled)
            self.levels[index] = (pieces, words)


def _pattern(taken: LayerCapture) -> torch.Tensor:
    """A captured layer's patterns: the viewer captures them (take=("pattern",))."""
    assert taken.pattern is not None
    return taken.pattern


def _level(name: str, patterns: torch.Tensor, text: str, tokens: list[str], offsets: list[list[int]],
           special: list[bool], units: list[int], paths: dict[str, torch.Tensor]) -> Level:
    """Labels, gaps and encodings of one item at one level; ``units[p]`` is piece p's position at this level."""
    n = max(units) + 1
    spans: list[list[int] | None] = [None] * n
    is_special = [True] * n
    counts = [0] * n
    for (start, end), sp, unit in zip(offsets, special, units):
        counts[unit] += 1
        if sp:
            continue
        is_special[unit] = False
        piece = text[start:end]
        if piece.strip():  # a byte-level BPE piece spans the space before it: leave the space to the gap
            start, end = start + len(piece) - len(piece.lstrip()), end - len(piece) + len(piece.rstrip())
        held = spans[unit]
        spans[unit] = [start, end] if held is None else [min(held[0], start), max(held[1], end)]
    own_tokens: list[list[str]] = [[] for _ in range(n)]
    for token, unit in zip(tokens, units):
        own_tokens[unit].append(token)
    labels, gaps, cursor = [], [], 0
    for unit in range(n):
        span = spans[unit]
        if span is None:  # a special token: no characters of its own
            labels.append("".join(own_tokens[unit]))
            gaps.append("")
            continue
        start, end = span
        gaps.append(text[cursor:start] if start >= cursor else "")
        # a piece inside characters already shown (bytes of one character) repeats them; a piece
        # without characters shows its token string, so that no position is invisible
        labels.append(text[max(start, cursor):end] if end > cursor else text[start:end] or "".join(own_tokens[unit]))
        cursor = max(cursor, end)
    size, thumbs = thumbnails(patterns)
    return Level(name=name, labels=labels, gaps=gaps, tail=text[cursor:], special=is_special, pieces=counts,
                 patterns=[quantize(p) for p in patterns], thumb_size=size, thumbs=thumbs,
                 rollout=[quantize(p) for p in paths["rollout"]],
                 flow=[quantize(p) for p in paths["flow"]] if "flow" in paths else None)
