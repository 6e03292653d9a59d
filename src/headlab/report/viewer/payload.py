"""What the viewer page carries (``ViewerData.to_dict()``, the format ``static/viewer.js`` reads): every shown head's
pattern on a few texts, images or recordings, at each level of detail, with each head's statistics and role labels.

Axis legend:
    patterns   (head, query_pos, key_pos)   one item's shown heads, encoded (``encoding.quantize``)
    pos        an item's positions: word pieces, special tokens included (``pieces`` level); words and special
               tokens (``words`` level); an image's special tokens and patches (``headlab.models.images``); a
               recording's decoder tokens (``pieces`` level) and encoder frames (``FrameStrip``)

A pattern is square, over the item's positions both ways, unless ``ViewerData.axes`` names each head's axes: then
its rows are the positions of its query axis and its columns those of its key axis (``"tokens"``: the ``pieces``
level, ``"frames"``: the item's ``FrameStrip``, ``"target"``: the item's ``target`` strip), as an encoder-decoder's
sites need (an audio one's cross-attention: tokens × frames; a text one's on a pair: target × tokens, the source).

``data.view_data`` makes it for text, ``pairs.pair_view_data`` for (source, target) pairs,
``images.image_view_data`` for images, ``audio.audio_view_data`` for recordings,
``cached.cache_view_data`` from a cache.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from headlab.analysis.flow import FLOW_MAX_LENGTH
from headlab.models.images import PatchGrid
from headlab.report.viewer.circuit import CircuitView
from headlab.report.viewer.encoding import QuantizedPattern

__all__ = ["MAX_ENTRIES", "FrameStrip", "HeadInfo", "ImagePanel", "Level", "ViewerData", "ViewerItem"]

MAX_ENTRIES = 400_000_000  # pattern entries (one byte each before deflate) one page may carry


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
class ImagePanel:
    """The picture an image model saw, under its patch grid: what the page shows a head's attention on.

    Attributes:
        data_url: the picture as a PNG ``data:`` URL (the page allows no other image source).
        width, height: its size in pixels as carried (the model's input, shrunk if large: ``images.MAX_SIDE``).
        grid: the model's patch grid on it (its positions: the special tokens, then the patches row by row; a
            windowed model's: its first stage's, each layer's own in ``grid.layers``, carried as ``layers``).
        cover: the shares of its width and height the grid covers from the top left (1 where the input's size is a
            multiple of the patch size; pixels beyond a whole patch are no patch's; over 1 where the model pads its
            input to whole patches, as Swin does).
    """

    data_url: str
    width: int
    height: int
    grid: PatchGrid
    cover: tuple[float, float] = (1.0, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.data_url, "width": self.width, "height": self.height, "rows": self.grid.rows,
                "columns": self.grid.columns, "first": self.grid.n_special, "coverX": self.cover[0],
                "coverY": self.cover[1],
                "layers": [{"rows": g.rows, "columns": g.columns, "strideY": g.stride[0], "strideX": g.stride[1]}
                           for g in self.grid.layers] or None}


@dataclass(frozen=True)
class FrameStrip:
    """An audio model's encoder positions, shown as a strip of times beside the decoder's tokens.

    Attributes:
        labels: each position's label (``frame 0.42 s``: ``headlab.models.audio.Timeline``).
        audio: how many positions hold audio (the first ones; the rest is the padding to the encoder's window).
    """

    labels: list[str]
    audio: int

    @property
    def n(self) -> int:
        return len(self.labels)

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "labels": self.labels, "audio": self.audio}


@dataclass(frozen=True)
class ViewerItem:
    """One viewed text, image or recording.

    Attributes:
        text: the text as given (an image's or a recording's name).
        full_length: its length in pieces before truncation (special tokens included).
        truncated: True when it was cut to the model's limit; only the first ``pieces.n`` pieces are shown.
        pieces: the piece-level view (a recording's: its decoder tokens).
        words: the word-level view, or None when every word is a single piece (and for an image or a recording).
        image: an image's picture and patch grid; None for a text.
        frames: a recording's encoder frames; None for a text or an image.
        target: a (source, target) pair's target as its decoder reads it (the start token, then the target less its
            last piece), a ``Level`` without patterns (``text`` and ``pieces`` are the source's); None otherwise.
    """

    text: str
    full_length: int
    truncated: bool
    pieces: Level
    words: Level | None
    image: ImagePanel | None = None
    frames: FrameStrip | None = None
    target: Level | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "fullLength": self.full_length, "truncated": self.truncated,
                "pieces": self.pieces.to_dict(), "words": None if self.words is None else self.words.to_dict(),
                "image": None if self.image is None else self.image.to_dict(),
                "frames": None if self.frames is None else self.frames.to_dict(),
                "target": None if self.target is None else self.target.to_dict()}


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
        axes: per shown head (``heads`` order), its pattern's ``(query axis, key axis)``, each ``"tokens"``,
            ``"frames"`` or ``"target"`` (the module docstring); None: every pattern is over the item's positions both
            ways.
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
    axes: list[tuple[str, str]] | None = None

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
                "circuit": None if self.circuit is None else self.circuit.to_dict(),
                "axes": None if self.axes is None else [list(pair) for pair in self.axes]}

    def readable(self) -> dict[str, Any]:
        """What the page shows, for a program (``headlab view --json``): each item's positions by axis and each shown
        head's pattern over its axes as weights (the page's: within 1/510 of each row's largest, ``encoding``),
        with its statistics and roles.

        Returns:
            ``{"model", "source", "architecture", "heads": [{"layer", "head", "axes", "roles", "class", "stats"}],
            "items": [{"text", "positions": {axis: labels}, "patterns": [(queries, keys) weights per head]}]}``;
            the axes ``"tokens"`` (a text's pieces, an image's positions, a decoder's tokens), ``"frames"`` (a
            recording's), ``"target"`` (a pair's target).
        """
        axes = self.axes or [("tokens", "tokens")] * len(self.heads)
        heads = [{"layer": i.layer, "head": i.head, "axes": list(pair), "roles": list(i.roles),
                  "class": i.pattern_class, "stats": dict(i.stats)} for i, pair in zip(self.info, axes)]
        items = []
        for item in self.items:
            positions = {"tokens": list(item.pieces.labels)}
            if item.frames is not None:
                positions["frames"] = list(item.frames.labels)
            if item.target is not None:
                positions["target"] = list(item.target.labels)
            patterns = [[[round(float(w), 6) for w in row] for row in p.values()] for p in item.pieces.patterns]
            items.append({"text": item.text, "positions": positions, "patterns": patterns})
        return {"model": self.name, "source": self.source, "architecture": self.architecture, "heads": heads,
                "items": items}

    @property
    def contents(self) -> str:
        """What the items are, counted: ``"2 texts (23 word pieces)"``, ``"1 pair (19 word pieces)"``, ``"1 image (17
        positions)"``, ``"1 recording (1500 frames)"``."""
        if all(item.frames is not None for item in self.items):
            n, what, unit = sum(item.frames.n for item in self.items if item.frames), "recording", "frames"
        elif all(item.target is not None for item in self.items):
            n = sum(item.pieces.n + item.target.n for item in self.items if item.target)
            what, unit = "pair", "word pieces"
        else:
            images = all(item.image is not None for item in self.items)
            n = sum(item.pieces.n for item in self.items)
            what, unit = ("image", "positions") if images else ("text", "word pieces")
        return f"{len(self.items)} {what}{'s' if len(self.items) != 1 else ''} ({n} {unit})"

    def __repr__(self) -> str:
        circuit = "" if self.circuit is None else f", the strongest {self.circuit.method} edges of each head"
        return (f"ViewerData: {len(self.heads)} heads of {self.name} ({self.architecture}) on {self.contents}, "
                f"{self.nbytes:,} bytes encoded{circuit}")


