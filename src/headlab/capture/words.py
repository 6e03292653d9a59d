"""Word-piece patterns to word patterns (Clark et al. 2019, "What Does BERT Look At?", §2).

Axis legend:
    units     (pos,) or (batch, pos)   each piece's word unit, -1 at padding
    pattern   (..., query_pos, key_pos) over pieces, e.g. (batch, head, query_pos, key_pos)
    result    (..., query_word, key_word)

A unit is a word (the pieces the tokenizer gave one word id, e.g. "un ##believ ##ably") or a
special token: [CLS], [SEP], BOS and EOS stay units of their own, so attention to them stays
visible at word level. Following Clark et al., attention TO a word is the SUM of the attention
to its pieces (key axis) and attention FROM a word is the MEAN over its pieces (query axis);
a query row that sums to 1 over pieces still sums to 1 over words.

The tokenizer's words split at punctuation ("don't" → "don", "'", "t"); to aggregate to other
words, e.g. a treebank's, build word ids with ``word_ids_from_spans`` from their character spans.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "WordMap", "batch_word_ids_from_spans", "pattern_to_words", "unit_labels", "whitespace_spans",
    "word_ids_from_spans", "word_units",
]


def word_units(word_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Number each item's units (words and special tokens) in order of position.

    Args:
        word_ids: ``(pos,)`` or ``(batch, pos)`` the tokenizer's word index of each piece, -1 at
            special tokens (and anything at padding).
        attention_mask: same shape, nonzero at real tokens.

    Returns:
        ``units`` (same shape, int64): a piece's unit, -1 at padding; ``n_units`` (``()`` or
        ``(batch,)``): units per item.
    """
    if word_ids.shape != attention_mask.shape:
        raise ValueError(f"word_ids {tuple(word_ids.shape)} and attention_mask {tuple(attention_mask.shape)} differ")
    real = attention_mask.bool()
    previous = torch.nn.functional.pad(word_ids, (1, 0), value=-1)[..., :-1]
    first = torch.zeros_like(real)
    first[..., 0] = True
    starts = real & (first | (word_ids < 0) | (word_ids != previous))  # a special token is always a new unit
    units = starts.long().cumsum(-1) - 1
    return units.masked_fill(~real, -1), starts.sum(-1)


def pattern_to_words(pattern: Tensor, units: Tensor, *, n_units: int | None = None) -> Tensor:
    """Aggregate a piece-level self-attention pattern to units: sum over keys, mean over queries.

    Args:
        pattern: ``(..., pos, pos)``: e.g. ``(head, q, k)`` with ``units`` of shape ``(pos,)``,
            or ``(batch, head, q, k)`` with ``units`` of shape ``(batch, pos)``.
        units: ``(pos,)`` shared by every leading index, or ``(batch, pos)`` matching the
            pattern's first axis; -1 at padding (see ``word_units``).
        n_units: size of the unit axes; default ``units.max() + 1``. Units an item lacks
            (shorter items in a batch) give all-zero rows and columns.

    Returns:
        ``(..., n_units, n_units)``: ``[q_word, k_word]`` = mean over q_word's pieces of the sum
        over k_word's pieces. Rows keep their sums (1 where no weight fell on padding).

    Raises:
        ValueError: the shapes do not fit.
    """
    return WordMap(units, n_units=n_units).apply(pattern)


class WordMap:
    """Which pieces make up which unit, worked out once (per batch) and applied to any number of patterns.

    ``apply`` computes ``pattern_to_words``; ``best_keys`` each query unit's heaviest key unit among
    some (syntax's prediction) without forming the others. Most units are one piece, so their entries are
    gathered from the pattern (one read of it per layer); only the pieces after a unit's first
    are added, in the order of a sum over every piece (query pieces first, then key pieces, each
    in position order), so the values are those of that sum to the bit.

    Args:
        units: ``(pos,)`` or ``(batch, pos)``: each piece's unit, -1 at padding (see ``word_units``).
        n_units: size of the unit axes; default ``units.max() + 1``. Pieces of units outside
            ``0 … n_units − 1`` are left out.

    Raises:
        ValueError: ``units`` is not 1- or 2-dimensional.
    """

    def __init__(self, units: Tensor, *, n_units: int | None = None) -> None:
        if units.dim() not in (1, 2):
            raise ValueError(f"units has shape {tuple(units.shape)}; expected (pos,) or (batch, pos)")
        self.units = units
        self.n_units = n = int(units.max()) + 1 if n_units is None else n_units
        unit = units.reshape(-1, units.shape[-1])  # (item, pos)
        n_items, pos = unit.shape
        kept = (unit >= 0) & (unit < n)
        unit = torch.where(kept, unit, n)  # left-out pieces go to a spare unit n
        positions = torch.arange(pos, device=units.device).expand(n_items, pos)
        # Each piece's rank among its unit's pieces, in position order: sort by (unit, position).
        order = (unit * pos + positions).argsort(dim=-1)
        in_order = unit.gather(1, order)
        starts = torch.ones_like(kept)
        starts[:, 1:] = in_order[:, 1:] != in_order[:, :-1]
        run_start = torch.where(starts, positions, 0).cummax(-1).values  # each sorted piece's unit's first slot
        rank = torch.empty_like(order).scatter_(1, order, positions - run_start)
        counts = torch.zeros(n_items, n + 1, dtype=torch.long, device=units.device).scatter_add_(1, unit,
                                                                                                  torch.ones_like(unit))
        self.counts = counts[:, :n]  # (item, unit) pieces per unit
        n_pieces = max(1, int(self.counts.max()) if self.counts.numel() else 1)
        item = torch.arange(n_items, device=units.device)[:, None].expand(n_items, pos)
        pieces = torch.zeros(n_items, n + 1, n_pieces, dtype=torch.long, device=units.device)
        pieces[item[kept], unit[kept], rank[kept]] = positions[kept]
        self.pieces = pieces[:, :n]  # (item, unit, rank): position of the unit's rank-th piece (0 past its count)
        self._multi = (self.counts > 1).nonzero(as_tuple=True)  # units of several pieces: (items, units)
        self._multi_counts, self._multi_pieces = self.counts[self._multi], self.pieces[self._multi]  # (m,), (m, rank)
        self._every: _ScorePlan | None = None  # apply's plan (every key unit)
        self._choice: tuple[Tensor, _ScorePlan] | None = None  # best_keys' last keys and their plan

    def apply(self, pattern: Tensor) -> Tensor:
        """The unit-level pattern (see ``pattern_to_words``).

        Args:
            pattern: ``(..., pos, pos)`` as ``pattern_to_words`` takes it with these units.

        Returns:
            ``(..., n_units, n_units)``; rows and columns of units an item lacks are 0.

        Raises:
            ValueError: the shapes do not fit.
        """
        p = self._items(pattern)
        n_items, n = p.shape[0], self.n_units
        if self._every is None:
            self._every = self._plan(torch.arange(n, device=self.units.device).expand(n_items, n))
        words = self._unit_scores(p, self._every)
        absent = self.counts == 0  # (item, unit): units shorter items lack
        words.masked_fill_(absent[:, None, None, :], 0.0)
        i, u = absent.nonzero(as_tuple=True)
        words[i, :, u] = 0.0
        return words.view(*pattern.shape[:-2], n, n)

    def best_keys(self, pattern: Tensor, *, keys: Tensor,
                  workspace: Callable[[tuple[int, ...]], Tensor] | None = None) -> Tensor:
        """For every query unit, the key unit among ``keys`` with the largest unit-level weight.

        Equal to ``apply(pattern)`` with the other key units set to -inf, then the first largest
        of each row, without forming those columns: each item's kept key units are gathered side
        by side (padded with its first one, which a padding copy never beats).

        Args:
            pattern: ``(..., pos, pos)`` as ``apply`` takes it.
            keys: ``(batch, n_units)`` bool (``(n_units,)`` for 1-d units), True at the key units to choose
                from; units an item lacks are never chosen. An item with none gets unit 0.
            workspace: gives an uninitialised tensor of the shape asked, in the pattern's dtype, for the
                ``(..., n_units, kept units)`` scores (e.g. a reused buffer); None allocates.

        Returns:
            ``(..., n_units)`` int64 unit ids; rows of units an item lacks hold any unit.

        Raises:
            ValueError: the shapes do not fit.
        """
        p = self._items(pattern)
        n_items, n = p.shape[0], self.n_units
        keys = keys.reshape(n_items, n).to(self.counts.device)
        if self._choice is None or not torch.equal(self._choice[0], keys):  # worked out once for every layer
            kept = (self.counts > 0) & keys
            units = torch.arange(n, device=kept.device)
            columns = torch.where(kept, units, n + units).argsort(dim=-1)  # kept units first, each in unit order
            width = max(1, int(kept.sum(-1).max()))
            columns = torch.where(units[:width] < kept.sum(-1, keepdim=True), columns[:, :width], columns[:, :1])
            self._choice = (keys.clone(), self._plan(columns))
        plan = self._choice[1]
        out = None if workspace is None else workspace((n_items, p.shape[1], n, plan.columns.shape[1]))
        best = self._unit_scores(p, plan, out=out).max(-1).indices  # the first largest, as argmax (faster on CPU)
        best = plan.columns.gather(1, best.reshape(n_items, -1)).view(best.shape)
        return best.view(*pattern.shape[:-2], n)

    def _items(self, pattern: Tensor) -> Tensor:
        """``pattern`` as ``(item, rest, q, k)``, its shape checked against the units."""
        pos, units = pattern.shape[-1], self.units
        if pattern.dim() < 2 or pattern.shape[-2] != pos:
            raise ValueError(f"pattern has shape {tuple(pattern.shape)}; expected (..., pos, pos)")
        if units.shape[-1] != pos:
            raise ValueError(f"units has shape {tuple(units.shape)}; expected ({pos},) or (batch, {pos})")
        if units.dim() == 2 and (pattern.dim() < 3 or pattern.shape[0] != units.shape[0]):
            raise ValueError(
                f"units has shape {tuple(units.shape)}: a batch of {units.shape[0]}, but pattern has shape "
                f"{tuple(pattern.shape)}; expected (batch, ..., pos, pos)"
            )
        return pattern.reshape(self.pieces.shape[0], -1, pos, pos)

    def _plan(self, columns: Tensor) -> _ScorePlan:
        """The indices ``_unit_scores`` reads for the key units ``columns`` ``(item, width)``: worked out once
        for any number of patterns."""
        n, width = self.n_units, columns.shape[1]
        pos = self.units.shape[-1]
        first = self.pieces[..., 0]  # (item, unit)
        ranks = self.pieces.shape[2]
        column_pieces = self.pieces.gather(1, columns[..., None].expand(-1, -1, ranks))  # (item, width, rank)
        column_counts = self.counts.gather(1, columns)  # (item, width)
        index = (first[:, :, None] * pos + column_pieces[:, None, :, 0]).reshape(len(columns), 1, n * width)
        later_keys = []  # key units of several pieces: per later rank, (items, columns, their pieces)
        for r in range(1, ranks):
            i, c = (column_counts > r).nonzero(as_tuple=True)
            later_keys.append((i, c, column_pieces[i, c, r]))
        i = self._multi[0]  # the items of the query units of several pieces
        query_columns = [column_pieces[i, :, r] for r in range(ranks)]  # (m, width) each
        more_columns = [(column_counts[i] > r)[:, None, :] for r in range(ranks)]
        return _ScorePlan(columns=columns, pos=pos, index=index, later_keys=later_keys, query_columns=query_columns,
                          more_columns=more_columns)

    def _unit_scores(self, p: Tensor, plan: _ScorePlan, *, out: Tensor | None = None) -> Tensor:
        """``(item, rest, n_units, width)``: unit-level weights of every query unit on the key units of ``plan``
        (``_plan``); the entries of units an item lacks are not meaningful."""
        n_items, rest, pos, _ = p.shape
        n, width = self.n_units, plan.columns.shape[1]
        flat = None if out is None else out.view(n_items, rest, n * width)
        # Each (query, key) matrix read flat where it lies: a block cut from a longer batch has rows `row` apart,
        # not pos, and is read in place (its first pos rows), not copied.
        row = p.stride(-2) if p.stride(-1) == 1 else pos
        if row != pos:
            source = p.as_strided((n_items, rest, (pos - 1) * row + pos), (p.stride(0), p.stride(1), 1))
        else:
            source = p.reshape(n_items, rest, pos * pos)
        words = torch.gather(source, 2, plan.flat_index(row).expand(n_items, rest, n * width),
                             out=flat).view(n_items, rest, n, width)
        first = self.pieces[..., 0]  # (item, unit)
        for i, c, k in plan.later_keys:  # key units of several pieces: add their later pieces' columns
            words[i, :, :, c] += p[i[:, None], :, first[i], k[:, None]].transpose(1, 2)
        if self._multi[0].numel():  # query units of several pieces: sum their rows first, then as above
            i, u = self._multi
            counts, pieces = self._multi_counts, self._multi_pieces  # (m,), (m, rank)
            rows = p[i, :, pieces[:, 0]]  # (m, rest, k)
            for r in range(1, pieces.shape[1]):
                more = counts > r
                rows[more] += p[i[more], :, pieces[more, r]]
            sums = rows.gather(2, plan.query_columns[0][:, None, :].expand(len(i), rest, width))  # (m, rest, w)
            for r in range(1, len(plan.query_columns)):
                later = plan.query_columns[r][:, None, :].expand(len(i), rest, width)
                sums = torch.where(plan.more_columns[r], sums + rows.gather(2, later), sums)
            words[i, :, u] = sums / counts[:, None, None].to(sums.dtype)  # the mean over the query pieces
        return words


@dataclass(frozen=True)
class _ScorePlan:
    """``WordMap._plan``: the indices of one choice of key units, for every pattern of a batch."""

    columns: Tensor  # (item, width) the key units
    pos: int  # the patterns' positions
    index: Tensor  # (item, 1, n_units · width) flat (query piece, key piece) of each unit pair's first pieces
    later_keys: list[tuple[Tensor, Tensor, Tensor]]  # per later rank: items, columns, pieces of multi-piece keys
    query_columns: list[Tensor]  # per rank: (m, width) key pieces, for the multi-piece query units' items
    more_columns: list[Tensor]  # per rank: (m, 1, width) whether each key unit has that many pieces
    _strided: dict[int, Tensor] = field(default_factory=dict)  # flat_index's by row stride

    def flat_index(self, row: int) -> Tensor:
        """``index`` for matrices whose rows lie ``row`` entries apart (``index`` itself: rows of pos)."""
        if row == self.pos:
            return self.index
        if row not in self._strided:
            self._strided[row] = self.index + torch.div(self.index, self.pos, rounding_mode="floor") * (row - self.pos)
        return self._strided[row]


def unit_labels(text: str, tokens: Sequence[str], offsets: Sequence[Sequence[int]], units: Sequence[int]) -> list[str]:
    """Each unit's text: its characters in ``text`` for a word, the token itself for a special token.

    A word's label leaves out the whitespace at its ends (a byte-level BPE piece's span holds the
    space before it), unless the word is whitespace only.

    Args:
        text: the item's text.
        tokens: ``(pos,)`` piece strings (unpadded, or padding marked by unit -1).
        offsets: ``(pos, 2)`` character spans.
        units: ``(pos,)`` unit of each piece (``word_units``), -1 at padding.

    Returns:
        One string per unit, in unit order.
    """
    spans: dict[int, list[int]] = {}
    special: dict[int, str] = {}
    for token, (start, end), unit in zip(tokens, offsets, [int(u) for u in units]):
        if unit < 0:
            continue
        if start == end:  # a special token covers no character
            special[unit] = token
        elif unit in spans:
            spans[unit][1] = max(spans[unit][1], int(end))
        else:
            spans[unit] = [int(start), int(end)]
    n = max([*spans, *special], default=-1) + 1
    labels = [text[spans[u][0]:spans[u][1]] if u in spans else special[u] for u in range(n)]
    return [label if u in special else label.strip() or label for u, label in enumerate(labels)]


def whitespace_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the whitespace-separated words of ``text``."""
    return [m.span() for m in re.finditer(r"\S+", text)]


def word_ids_from_spans(
    offsets: Tensor, spans: Sequence[tuple[int, int]], *, special_tokens_mask: Tensor, text: str | None = None,
) -> Tensor:
    """Word ids of one item's pieces for words given as character spans (e.g. a treebank's).

    A piece belongs to the word whose span holds its first character that is not whitespace.
    Byte-level BPE tokenizers as transformers converts GPT-2's (``trim_offsets=False``) give a
    piece the space before it ("Ġcat" spans " cat"), and words never start with whitespace, so
    the piece's own first character would fall between words. A piece of whitespace only (the
    "Ġ" of a double space) joins the word after it, or the last word when none follows: BPE
    attaches spaces to the word they precede. ``batch_word_ids_from_spans`` does the same for a
    whole batch at once.

    Args:
        offsets: ``(pos, 2)`` each piece's character span.
        spans: the words' ``(start, end)`` character spans, in order, not overlapping.
        special_tokens_mask: ``(pos,)`` True at special tokens (they get -1).
        text: the item's text, to see the whitespace in the pieces' spans; None takes each
            piece's first character as it is.

    Returns:
        ``(pos,)`` int64 word index of each piece, -1 at special tokens.

    Raises:
        ValueError: a non-special piece starts outside every span.
    """
    pos = offsets.reshape(-1, 2).shape[0]
    word_ids, orphans = batch_word_ids_from_spans(
        offsets.reshape(1, pos, 2), [pos], [spans], special_tokens_mask=special_tokens_mask.reshape(1, pos),
        texts=None if text is None else [text])
    if orphans[0]:
        pieces = offsets.reshape(-1, 2)[orphans[0][:3]].tolist()
        raise ValueError(f"pieces {orphans[0][:10]} start outside every word span (offsets {pieces})")
    return word_ids.reshape(offsets.shape[:-1])


def batch_word_ids_from_spans(
    offsets: Tensor, lengths: Sequence[int], spans: Sequence[Sequence[tuple[int, int]]], *,
    special_tokens_mask: Tensor, texts: Sequence[str] | None = None,
) -> tuple[Tensor, list[list[int]]]:
    """``word_ids_from_spans`` of every item of a batch in one pass.

    Each item's characters are moved to their own stretch of one long line (item r's after every
    earlier item's text and a gap), so one sorted search over every item's words and whitespace serves
    the whole batch; a piece never reaches another item's word.

    Args:
        offsets: ``(batch, pos, 2)`` each piece's character span in its item's text.
        lengths: each item's real pieces (the rest is padding).
        spans: per item, its words' ``(start, end)`` spans, in order, not overlapping.
        special_tokens_mask: ``(batch, pos)`` True at special tokens.
        texts: each item's text (see ``word_ids_from_spans``), or None.

    Returns:
        ``(word_ids, orphans)``: ``(batch, pos)`` int64 word index of each piece within its item, -1 at special
        tokens and padding; per item, the positions of its non-special pieces that start outside every span
        (empty where every piece found its word; those items' word ids are not meaningful).

    Raises:
        ValueError: ``lengths``, ``spans`` or ``texts`` do not give one entry per item.
    """
    n_items, pos = offsets.shape[:2]
    for name, given in (("lengths", lengths), ("spans", spans), ("texts", texts)):
        if given is not None and len(given) != n_items:
            raise ValueError(f"{name} has {len(given)} entries for a batch of {n_items} items")
    # numpy, not torch: a few thousand pieces per batch, where torch's per-call cost would dominate
    counted = np.asarray(lengths, dtype=np.int64)
    real = np.arange(pos)[None, :] < counted[:, None]  # (batch, pos)
    item = np.repeat(np.arange(n_items), counted)  # each real piece's item
    spanned = offsets.cpu().numpy().reshape(n_items, pos, 2)
    counts = np.array([len(s) for s in spans], dtype=np.int64)
    bounds = np.asarray([span for item_spans in spans for span in item_spans], dtype=np.int64).reshape(-1, 2)
    if texts is not None:
        sizes = np.array([len(t) for t in texts], dtype=np.int64)
    else:  # the item's characters reach as far as its pieces and its words
        ends = np.where(real, spanned[..., 1], 0).max(-1, initial=0)
        last = np.zeros(n_items, dtype=np.int64)
        np.maximum.at(last, np.repeat(np.arange(n_items), counts), bounds[:, 1])
        sizes = np.maximum(ends, last)
    shift = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]])  # where each item's characters start
    pieces = spanned[real] + shift[item][:, None]
    bounds = bounds + np.repeat(shift, counts)[:, None]
    first_word = np.cumsum(counts) - counts  # each item's first word among every item's
    start, blank = pieces[:, 0], np.zeros(len(pieces), dtype=bool)
    if texts is not None:
        # the first character at or after each piece's start that is not whitespace (the item's end if none)
        runs = np.asarray([(a + s, b + s) for t, s in zip(texts, shift.tolist()) for a, b in whitespace_spans(t)],
                          dtype=np.int64).reshape(-1, 2)
        run = np.searchsorted(runs[:, 1], pieces[:, 0], side="right")  # the first run ending after the start
        visible = np.maximum(np.append(runs[:, 0], int(shift[-1] + sizes[-1]) if n_items else 0)[run], pieces[:, 0])
        start = np.minimum(visible, pieces[:, 1])  # a piece of whitespace only: its end
        blank = (pieces[:, 1] > pieces[:, 0]) & (visible >= pieces[:, 1])
    word = np.searchsorted(bounds[:, 0], start, side="right") - 1  # the last word starting at or before it
    inside = (word >= 0) & (start < bounds[np.maximum(word, 0), 1]) if len(bounds) else np.zeros_like(blank)
    word_ids = np.where(inside, word, -1)
    if len(bounds):  # a piece of whitespace only joins the word after it, or its item's last word
        following = np.minimum(np.searchsorted(bounds[:, 0], pieces[:, 1]), first_word[item] + counts[item] - 1)
        word_ids = np.where(blank & (word_ids < 0) & (counts[item] > 0), following, word_ids)
    word_ids = np.where(word_ids >= 0, word_ids - first_word[item], -1)  # within the item
    special = special_tokens_mask.cpu().numpy().astype(bool).reshape(n_items, pos)[real]
    orphan = ~special & (word_ids < 0)
    out = np.full((n_items, pos), -1, dtype=np.int64)
    out[real] = np.where(special, -1, word_ids)
    positions = np.nonzero(real)[1]
    orphans: list[list[int]] = [[] for _ in range(n_items)]
    for i, position in zip(item[orphan].tolist(), positions[orphan].tolist()):
        orphans[i].append(position)
    return torch.from_numpy(out).to(special_tokens_mask.device), orphans
