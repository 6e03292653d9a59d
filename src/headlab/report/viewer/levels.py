"""What the text viewers (``data.view_data``, ``pairs.pair_view_data``) build alike: an item's ``Level`` (labels, gaps
and encoded patterns at one level of detail) and each shown head's ``HeadInfo`` from the statistics measured on the
viewed items.

Axis legend:
    patterns   (head, query_pos, key_pos)   one item's shown heads (a list: heads over other axes differ in shape)
    units      each piece's position at the level (pieces: itself; words: its word, ``headlab.capture.words``)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from headlab.analysis.roles import label_heads
from headlab.analysis.surface import FIXED_WHEN_CAUSAL, STATISTICS, SurfaceStats
from headlab.analysis.taxonomy import TaxonomyStats, classify
from headlab.report.viewer.encoding import quantize, thumbnails
from headlab.report.viewer.payload import HeadInfo, Level

__all__ = ["head_infos", "text_level", "token_strip"]

_TAXONOMY = ("special", "band", "block", "top_columns")


def head_infos(shown: Sequence[tuple[int, int]], surface: SurfaceStats, taxonomy: TaxonomyStats, *, causal: bool,
               corpus_rows: Sequence[Mapping[str, Any]] | None = None) -> list[HeadInfo]:
    """Each shown head's roles, pattern class and statistics on the viewed items, NaN left out (not measurable there:
    ``block`` without two sentences, a cross-attention head's statistics of one text's positions), and its row of a
    corpus-wide analysis; statistics that cannot tell heads apart in a model of this kind (next-token for a causal
    one) left out. A taxonomy that read no layer (cross-attention alone) gives no class."""
    surface_result = surface.result()
    taxonomy_result = taxonomy.result() if taxonomy.sums else None
    roles = label_heads(surface_result)
    classes = {} if taxonomy_result is None else classify(taxonomy_result)
    fixed = set(FIXED_WHEN_CAUSAL) if causal else set()
    by_head = {(int(r["layer"]), int(r["head"])): {k: v for k, v in r.items() if k not in fixed}
               for r in corpus_rows or ()}
    info = []
    for layer, head in shown:
        stats = {name: surface_result.value(name, layer, head) for name in STATISTICS if name not in fixed}
        if taxonomy_result is not None and (layer, head) in taxonomy_result.heads:
            stats |= {name: taxonomy_result.value(name, layer, head) for name in _TAXONOMY}
        info.append(HeadInfo(layer=layer, head=head, roles=roles.get((layer, head), ()),
                             pattern_class=classes.get((layer, head), ""),
                             stats={k: v for k, v in stats.items() if v == v},  # NaN: not measurable here
                             corpus=by_head.get((layer, head))))
    return info


def text_level(name: str, patterns: torch.Tensor | list[torch.Tensor], text: str, tokens: list[str],
               offsets: list[list[int]], special: list[bool], units: list[int],
               paths: dict[str, torch.Tensor]) -> Level:
    """Labels, gaps and encodings of one item at one level; ``units[p]`` is piece p's position at this level;
    ``paths``: its ``rollout`` and ``flow`` where computed."""
    labels, gaps, tail, is_special, counts = _labels(text, tokens, offsets, special, units)
    size, thumbs = thumbnails(patterns)
    return Level(name=name, labels=labels, gaps=gaps, tail=tail, special=is_special, pieces=counts,
                 patterns=[quantize(p) for p in patterns], thumb_size=size, thumbs=thumbs,
                 rollout=[quantize(p) for p in paths.get("rollout", ())],
                 flow=[quantize(p) for p in paths["flow"]] if "flow" in paths else None)


def token_strip(text: str, tokens: list[str], offsets: list[list[int]], special: list[bool]) -> Level:
    """A text's pieces as a ``Level`` that carries no pattern (an encoder-decoder's target: the heads' patterns are
    on the source's level, ``ViewerData.axes`` saying which of them read it)."""
    labels, gaps, tail, is_special, counts = _labels(text, tokens, offsets, special, list(range(len(tokens))))
    return Level(name="pieces", labels=labels, gaps=gaps, tail=tail, special=is_special, pieces=counts, patterns=[],
                 thumb_size=0, thumbs=b"")


def _labels(text: str, tokens: list[str], offsets: list[list[int]], special: list[bool],
            units: list[int]) -> tuple[list[str], list[str], str, list[bool], list[int]]:
    """``(labels, gaps, tail, special, pieces)`` of ``Level`` for the pieces ``tokens`` grouped by ``units``."""
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
    return labels, gaps, text[cursor:], is_special, counts
