"""The reductions of a batch's patterns that several accumulators read, each computed once per batch.

Axis legend:
    pattern     (batch, head, query_pos, key_pos)   one captured layer's selected heads
    masks       (batch, pos)                        per position
    rows        (batch, head, query_pos)            one number per attention row
    masses      (batch, head, query_pos, column)    each row's mass on each key column of ``COLUMNS``
    key sums    (batch, head, key_pos)              Σ over the real queries

Surface statistics and the taxonomy read the same attention rows: mass on special tokens,
punctuation and segments, the diagonals, the entropy, the distance, the largest weight.
``reductions(batch)`` hands every accumulator one ``BatchReductions`` per batch (kept on the batch
with ``CaptureBatch.shared``); each reduction of a layer is computed by the first accumulator that
asks for it and then reused, so each pattern is read once per kind of reduction however many
accumulators run: one matmul for every column mass (``COLUMNS``: surface's and the taxonomy's key
masks side by side), one for the key sums, one max, the entropy and the distance together in blocks
that stay in cache, and the diagonals as views. Each reads every run of items of similar length
(``CaptureBatch.length_groups``) as its own block, cut to the run's longest item (``by_group``): the
padding a long item gives the rest of its batch is never read.

Reductions run in the patterns' dtype (float32 row sums are exact to ~1e-7, far below anything a
statistic is read at); the accumulators widen the per-row values to float64 before summing over the
corpus. Padded query rows hold whatever the model computed (NaN included): consumers select real
rows with ``real``, never by multiplying.
"""

from __future__ import annotations

import functools
import string
import weakref
from collections.abc import Callable
from functools import cached_property

import torch
from torch import Tensor

from headlab.capture.batch import CaptureBatch

__all__ = [
    "COLUMNS", "BatchReductions", "LayerReductions", "by_group", "is_punctuation", "punctuation_mask", "reductions",
    "segments",
]

# The key columns of ``LayerReductions.masses``, in order; segment s of ``segments`` is column
# ``len(COLUMNS) + s`` (its content tokens only).
COLUMNS = ("first_special", "other_special", "punctuation", "special")
_BLOCK = 1 << 18  # elements per block of the entropy's and distance's temporaries (1 MiB in float32): they stay in cache
_GPU_BLOCK = 1 << 26  # on a GPU, where a block costs its launches: a whole group at once as a rule
_SENTENCE_ENDS = frozenset({".", "!", "?"})
# Word-piece markers stripped before the punctuation test: WordPiece "##", byte-level BPE "Ġ"
# (a leading space), SentencePiece "▁".
_PIECE_PREFIXES = ("##", "Ġ", "▁")
_PUNCTUATION = frozenset(string.punctuation)


@functools.lru_cache(maxsize=1 << 16)
def is_punctuation(token: str) -> bool:
    """True when ``token``, its word-piece marker stripped, is non-empty and all ``string.punctuation``."""
    for prefix in _PIECE_PREFIXES:
        if token.startswith(prefix):
            token = token[len(prefix):]
            break
    return bool(token) and all(c in _PUNCTUATION for c in token)


def _flags(batch: CaptureBatch, test: Callable[[str], bool]) -> Tensor:
    """``(batch, pos)`` bool: ``test`` of each item's pieces, False at padding (one tensor per batch)."""
    width = batch.input_ids.shape[1]
    flags = [[test(t) for t in tokens] + [False] * (width - len(tokens)) for tokens in batch.tokens]
    return torch.tensor(flags, dtype=torch.bool).reshape(len(batch.tokens), width).to(batch.input_ids.device)


def punctuation_mask(batch: CaptureBatch) -> Tensor:
    """``(batch, pos)`` bool: True at punctuation pieces that are not special tokens."""
    return _flags(batch, is_punctuation) & ~batch.special_tokens_mask.bool()


def _is_sentence_end(token: str) -> bool:
    return token.lstrip("Ġ▁") in _SENTENCE_ENDS


def segments(batch: CaptureBatch) -> tuple[Tensor, Tensor]:
    """Each position's segment and each item's number of content segments.

    A segment ends after a special token or a sentence-final piece (``.``, ``!``, ``?``): the
    boundary belongs to the segment it closes. A content segment holds a non-special token, so
    ``[CLS] a b . c d [SEP]`` has the content segments ``a b .`` and ``c d``.

    Returns:
        ``(segment (batch, pos) int64, n_content (batch,) int64)``.
    """
    real = batch.attention_mask.bool()
    special = batch.special_tokens_mask.bool() & real
    boundary = (special | _flags(batch, _is_sentence_end)) & real
    segment = torch.zeros_like(batch.input_ids)
    segment[:, 1:] = boundary[:, :-1].long().cumsum(-1)
    content = real & ~special
    # segments only grow along an item: a content piece opens a new one where the last content piece's differs
    last = torch.where(content, segment, -1).cummax(-1).values  # the segment of the last content piece so far
    opens = content.clone()
    opens[:, 1:] &= segment[:, 1:] != last[:, :-1]
    return segment, opens.sum(-1)


def reductions(batch: CaptureBatch) -> BatchReductions:
    """The batch's ``BatchReductions``, made by the first accumulator that asks and shared by the rest."""
    return batch.shared(BatchReductions, BatchReductions)


def by_group(pattern: Tensor, groups: list[tuple[slice, int]],
             reduce: Callable[[Tensor, slice, int], Tensor]) -> Tensor:
    """``(batch, head, pos, …)``: ``reduce(block, items, pos)`` of each length group's block
    ``pattern[items, :, :pos, :pos]`` side by side, 0 past each group's ``pos``.

    Args:
        pattern: ``(batch, head, query_pos, key_pos)``; when not square (not self-attention) the whole
            pattern is one block.
        groups: ``CaptureBatch.length_groups()``.
        reduce: maps a block ``(items, head, pos, pos)`` to ``(items, head, pos, …)``.
    """
    if pattern.shape[-1] != pattern.shape[-2]:
        return reduce(pattern, slice(None), pattern.shape[-1])
    out = None
    for items, pos in groups:
        part = reduce(pattern[items, :, :pos, :pos], items, pos)
        if out is None:
            out = pattern.new_zeros(pattern.shape[:3] + part.shape[3:])
        out[items, :, :pos] = part
    return out


class BatchReductions:
    """The key masks of one batch and, per captured layer, its ``LayerReductions``.

    Attributes:
        batch: the batch.
        real: ``(batch, pos)`` bool, True at real tokens.
        special: ``(batch, pos)`` bool, True at real special tokens ([CLS], [SEP], BOS …).
        punctuation: ``(batch, pos)`` bool, True at punctuation pieces that are not special tokens.
        segment: ``(batch, pos)`` int64, each position's segment (``segments``).
        n_content: ``(batch,)`` int64, content segments per item.
        groups: ``CaptureBatch.length_groups``: the runs of items each reduction reads as one block.
    """

    def __init__(self, batch: CaptureBatch) -> None:
        self.batch = batch
        self.real = batch.attention_mask.bool()
        self.special = batch.special_tokens_mask.bool() & self.real
        self.punctuation = punctuation_mask(batch)
        self.segment, self.n_content = segments(batch)
        self.groups = batch.length_groups()
        self._layers: dict[int, LayerReductions] = {}
        self._columns: dict[torch.dtype, Tensor] = {}

    @property
    def content(self) -> Tensor:
        """``(batch, pos)`` bool: real tokens that are not special."""
        return self.real & ~self.special

    def columns(self, dtype: torch.dtype) -> Tensor:
        """``(batch, key_pos, len(COLUMNS) + n_segments)``: the key masks of ``COLUMNS``, then one per segment
        (its content tokens), as 0/1 in ``dtype`` (made once per dtype)."""
        if dtype not in self._columns:
            self._columns[dtype] = self._make_columns(dtype)
        return self._columns[dtype]

    def _make_columns(self, dtype: torch.dtype) -> Tensor:
        first = torch.zeros_like(self.special)
        first[:, 0] = self.special[:, 0]
        one_hot = torch.nn.functional.one_hot(self.segment, int(self.segment.max()) + 1).bool()
        one_hot &= self.content[..., None]
        masks = [first, self.special & ~first, self.punctuation & self.real, self.special]
        return torch.cat([torch.stack(masks, dim=-1), one_hot], dim=-1).to(dtype)

    def layer(self, layer: int) -> LayerReductions:
        """The reductions of one captured layer's patterns (computed as they are asked for).

        Raises:
            ValueError: the layer was captured without patterns.
        """
        if layer not in self._layers:
            pattern = self.batch.layers[layer].pattern
            if pattern is None:
                raise ValueError(f"layer {layer} was captured without patterns; capture with what=('pattern',)")
            self._layers[layer] = LayerReductions(pattern, self)
        return self._layers[layer]


class LayerReductions:
    """The row reductions of one layer's patterns, each computed on first access.

    All are in the patterns' dtype. Rows are ``(batch, head, query_pos)``; padded query rows
    hold whatever the patterns hold there, or 0. Each reduction reads the batch's length groups
    (``CaptureBatch.length_groups``) as their own shorter blocks, never the padding past a group's
    longest item.

    Args:
        pattern: ``(batch, head, query_pos, key_pos)``.
        keys: the batch's masks, which make and hold this object (``BatchReductions.layer``); held weakly here.
    """

    def __init__(self, pattern: Tensor, keys: BatchReductions) -> None:
        self.pattern = pattern
        # held weakly: keys holds this object, and a cycle would keep the batch's patterns alive until the next
        # garbage collection after the batch is done (capture then could not reuse their memory)
        self.keys = weakref.proxy(keys)
        self._diagonals: dict[int, Tensor] = {}

    def _by_group(self, reduce: Callable[[Tensor, slice, int], Tensor]) -> Tensor:
        return by_group(self.pattern, self.keys.groups, reduce)

    @cached_property
    def masses(self) -> Tensor:
        """``(batch, head, query_pos, column)``: each row's mass on each of ``BatchReductions.columns``."""
        columns = self.keys.columns(self.pattern.dtype).to(self.pattern.device)  # (batch, key_pos, column)

        def reduce(block: Tensor, items: slice, pos: int) -> Tensor:
            # A matmul reduces short rows far faster than elementwise products followed by sum(-1). A whole
            # block (contiguous) stacks every head's rows of an item into one (head · query_pos × key_pos)
            # product; a trimmed block (rows strided) takes one product per item and head, copying nothing.
            if not block.is_contiguous():
                return torch.matmul(block, columns[items, None, :pos])
            n, heads = block.shape[:2]
            return torch.bmm(block.view(n, heads * block.shape[2], pos), columns[items, :pos]).view(
                n, heads, block.shape[2], -1)

        return self._by_group(reduce)

    def mass(self, column: str) -> Tensor:
        """``(batch, head, query_pos)``: each row's mass on the key column ``column`` of ``COLUMNS``."""
        return self.masses[..., COLUMNS.index(column)]

    @property
    def segment_masses(self) -> Tensor:
        """``(batch, head, query_pos, n_segments)``: each row's mass on the content tokens of each segment."""
        return self.masses[..., len(COLUMNS):]

    def diagonal(self, offset: int) -> Tensor:
        """``(batch, head, query_pos)``: ``p[..., i, i + offset]``, 0 where key ``i + offset`` does not exist."""
        if offset not in self._diagonals:
            p = self.pattern
            out = p.new_zeros(p.shape[:-1])
            values = p.diagonal(offset=offset, dim1=-2, dim2=-1)
            if offset < 0:
                out[..., -offset:] = values
            else:
                out[..., : out.shape[-1] - offset] = values
            self._diagonals[offset] = out
        return self._diagonals[offset]

    @property
    def entropy(self) -> Tensor:
        """``(batch, head, query_pos)``: ``−Σ_j p_ij ln p_ij`` (nats; ``0 ln 0 = 0``)."""
        return self._entropy_and_distance[..., 0]

    @property
    def distance(self) -> Tensor:
        """``(batch, head, query_pos)``: ``Σ_j p_ij |i − j|``."""
        return self._entropy_and_distance[..., 1]

    @cached_property
    def _entropy_and_distance(self) -> Tensor:
        """``(batch, head, query_pos, 2)``: both row sums in one pass over each group's block, in blocks of
        whole (query, key) matrices whose temporaries stay in cache."""

        def reduce(block: Tensor, items: slice, pos: int) -> Tensor:
            n_q, n_k = block.shape[-2:]
            matrices = block.reshape(-1, n_q, n_k)
            offsets = (torch.arange(n_q, device=block.device)[:, None] - torch.arange(n_k, device=block.device))
            offsets = offsets.abs().to(block.dtype)
            sums = block.new_empty(2, len(matrices), n_q)  # entropy, distance
            step = max(1, (_BLOCK if block.device.type == "cpu" else _GPU_BLOCK) // max(1, n_q * n_k))
            buffer = block.new_empty(min(step, len(matrices)), n_q, n_k)
            tiny = torch.finfo(block.dtype).tiny
            for start in range(0, len(matrices), step):
                part = matrices[start:start + step]
                scratch = buffer[: len(part)]
                torch.sum(torch.mul(part, offsets, out=scratch), -1, out=sums[1, start:start + step])
                log_p = torch.clamp_min(part, tiny, out=scratch).log_()  # finite at 0
                torch.sum(log_p.mul_(part), -1, out=sums[0, start:start + step])
            sums[0].neg_()
            return sums.movedim(0, -1).view(*block.shape[:-1], 2)

        return self._by_group(reduce)

    @cached_property
    def confidence(self) -> Tensor:
        """``(batch, head, query_pos)``: ``max_j p_ij``."""
        return self._by_group(lambda block, items, pos: block.amax(-1))

    @cached_property
    def key_sums(self) -> Tensor:
        """``(batch, head, key_pos)``: ``Σ_i p_ij`` over the real queries ``i``."""
        p = self.pattern
        real = self.keys.real.to(p.device)

        def reduce(block: Tensor, items: slice, pos: int) -> Tensor:
            rows = real[items, : block.shape[-2]]  # (n, query_pos)
            sums = torch.matmul(rows.to(block.dtype)[:, None, None, :], block).squeeze(-2)  # (n, head, key_pos)
            if not torch.isfinite(sums).all():  # padded query rows may hold anything (NaN): keep them out
                sums = torch.where(rows[:, None, :, None], block, 0.0).sum(-2)
            return sums

        return self._by_group(reduce)  # (batch, head, key_pos): each group's sums fill its first pos keys
