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
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "pattern_to_words", "unit_labels", "unit_matrix", "whitespace_spans", "word_ids_from_spans", "word_units",
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


def unit_matrix(units: Tensor, n_units: int, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """One-hot membership of pieces in units.

    Args:
        units: ``(..., pos)`` unit of each piece, -1 for none.
        n_units: size of the unit axis.

    Returns:
        ``(..., n_units, pos)``: 1 where piece p belongs to unit u, else 0.
    """
    grid = torch.arange(n_units, device=units.device)
    return (units.unsqueeze(-2) == grid[:, None]).to(dtype)


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
    pos = pattern.shape[-1]
    if pattern.dim() < 2 or pattern.shape[-2] != pos:
        raise ValueError(f"pattern has shape {tuple(pattern.shape)}; expected (..., pos, pos)")
    if units.dim() not in (1, 2) or units.shape[-1] != pos:
        raise ValueError(f"units has shape {tuple(units.shape)}; expected ({pos},) or (batch, {pos})")
    if units.dim() == 2 and (pattern.dim() < 3 or pattern.shape[0] != units.shape[0]):
        raise ValueError(
            f"units has shape {tuple(units.shape)}: a batch of {units.shape[0]}, but pattern has shape "
            f"{tuple(pattern.shape)}; expected (batch, ..., pos, pos)"
        )
    n_units = int(units.max()) + 1 if n_units is None else n_units
    member = unit_matrix(units, n_units, dtype=pattern.dtype)  # (batch?, unit, pos)
    if units.dim() == 2:  # (batch, 1…, unit, pos) to broadcast over the pattern's middle axes
        member = member.view(units.shape[0], *[1] * (pattern.dim() - 3), n_units, pos)
    to_words = pattern @ member.transpose(-1, -2)  # (..., q, unit): sum over each word's key pieces
    mean = member / member.sum(-1, keepdim=True).clamp(min=1)
    return mean @ to_words  # (..., unit, unit): mean over each word's query pieces


def unit_labels(text: str, tokens: Sequence[str], offsets: Sequence[Sequence[int]], units: Sequence[int]) -> list[str]:
    """Each unit's text: its characters in ``text`` for a word, the token itself for a special token.

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
    return [text[spans[u][0]:spans[u][1]] if u in spans else special[u] for u in range(n)]


def whitespace_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the whitespace-separated words of ``text``."""
    return [m.span() for m in re.finditer(r"\S+", text)]


def word_ids_from_spans(
    offsets: Tensor, spans: Sequence[tuple[int, int]], *, special_tokens_mask: Tensor,
) -> Tensor:
    """Word ids of one item's pieces for words given as character spans (e.g. a treebank's).

    A piece belongs to the word whose span holds its first character.

    Args:
        offsets: ``(pos, 2)`` each piece's character span.
        spans: the words' ``(start, end)`` character spans, in order, not overlapping.
        special_tokens_mask: ``(pos,)`` True at special tokens (they get -1).

    Returns:
        ``(pos,)`` int64 word index of each piece, -1 at special tokens.

    Raises:
        ValueError: a non-special piece starts outside every span.
    """
    bounds = torch.tensor(spans, dtype=torch.long, device=offsets.device).reshape(-1, 2)
    start = offsets[:, 0]
    inside = (bounds[:, 0] <= start[:, None]) & (start[:, None] < bounds[:, 1])  # (pos, word)
    word_ids = torch.where(inside.any(-1), inside.long().argmax(-1), -1)
    special = special_tokens_mask.bool()
    orphans = (~special & (word_ids < 0)).nonzero().flatten().tolist()
    if orphans:
        raise ValueError(
            f"pieces {orphans[:10]} start outside every word span (offsets {offsets[orphans[:3]].tolist()})"
        )
    return word_ids.masked_fill(special, -1)
