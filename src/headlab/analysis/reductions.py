"""The reductions of a batch's patterns that several accumulators read, each computed once per batch.

Axis legend:
    pattern     (layer, batch, head, query_pos, key_pos)   a stack of captured layers' selected heads
    masks       (batch, pos)                               per position
    rows        (layer, batch, head, query_pos)            one number per attention row
    masses      (layer, batch, head, query_pos, column)    each row's mass on each key column of ``COLUMNS``
    key sums    (layer, batch, head, key_pos)              Σ over the real queries

Surface statistics and the taxonomy read the same attention rows: mass on special tokens,
punctuation and segments, the diagonals, the entropy, the distance, the largest weight.
``reductions(batch)`` hands every accumulator one ``BatchReductions`` per batch (kept on the batch
with ``CaptureBatch.shared``); of a view of cross-attention layers (``CaptureBatch.views``: a batch of
pairs), its query rows are the view's tokens and its key masks those of ``CaptureBatch.keys``. Its
``stacks`` hold the captured layers in runs with the same heads (``stack_layers``), and every
accumulator reads a stack's reductions as ``(layer, …)`` tensors, so its own arithmetic runs once
per batch rather than once per layer. Where the patterns are read depends on the
device: on a GPU a stack's patterns are copied into one ``(layer, batch, head, query_pos, key_pos)`` tensor
and each reduction is launched once for the whole stack (there an op costs its launch more than its
arithmetic); on a CPU each layer's pattern is reduced where it lies and the reductions, a number per row,
are put side by side (copying the patterns would cost more than the launches it saves). Each reduction of a
stack is computed by the first accumulator that asks for it and then reused, so each pattern is read once
per kind of reduction however many accumulators run: one matmul for every column mass (``COLUMNS``:
surface's and the taxonomy's key masks side by side), one for the segments' masses (the taxonomy's: a column
per segment, thousands in a long text, so apart), one for the key sums, one max, the entropy and the
distance together in blocks that stay in cache, and the diagonals as views. Each reads every run of items
of similar length (``CaptureBatch.length_groups``) as its own block, cut to the run's longest item
(``by_group``): the padding a long item gives the rest of its batch is never read.

Where the taps kept a batch's patterns as ``PatternRows`` (past the pattern budget, ``headlab.capture.blocks``),
no whole pattern exists: every row reduction of a layer comes from one ``headlab.analysis.sweep``, which forms
its rows a block at a time, and a consumer that reads masses on key columns of its own announces them
(``BatchReductions.announce``, in its ``prepare(batch)``) so that the same sweep takes them.

Reductions run in the patterns' dtype (float32 row sums are exact to ~1e-7, far below anything a
statistic is read at); the accumulators widen the per-row values to float64 before summing over the
corpus. Padded query rows hold whatever the model computed (NaN included): consumers select real
rows with ``real``, never by multiplying.
"""

from __future__ import annotations

import functools
import math
import string
import weakref
from collections.abc import Callable, Hashable, Sequence
from functools import cached_property

import torch
from torch import Tensor

from headlab.analysis.sweep import DIAGONALS, FIELDS, sweep
from headlab.capture.batch import CaptureBatch
from headlab.layer.pattern_rows import PatternRows

__all__ = [
    "COLUMNS", "BatchReductions", "StackReductions", "by_group", "column_masses", "is_punctuation", "launch_bound",
    "punctuation_mask", "reductions", "segments", "stack_layers",
]

# The key columns of ``StackReductions.masses``, in order (each segment's: ``StackReductions.segment_masses``).
COLUMNS = ("first_special", "other_special", "punctuation", "special")
# elements per block of the entropy's and distance's temporaries (1 MiB in float32): they stay in cache
_BLOCK = 1 << 18
_GPU_BLOCK = 1 << 26  # on a GPU, where a block costs its launches: a whole group at once as a rule
_GPU_STACK_BYTES = 1 << 30  # on a GPU, the most pattern bytes stacked into one copy
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


def stack_layers(batch: CaptureBatch) -> list[tuple[int, ...]]:
    """The captured layers in runs whose patterns are reduced as one ``(layer, …)`` stack, in layer order.

    A run holds consecutive layers with the same heads and the same pattern shape and dtype; where a stack's
    patterns are copied into one tensor (where ``launch_bound``: a GPU), at most ``_GPU_STACK_BYTES`` of them.
    (The default model on an H200, every accumulator layer by layer: 20 ms per one-item batch, while a batch of
    the corpus kept the GPU busy for 2.5 ms; stacked: 9.8 ms. On a CPU, the own arithmetic of surface statistics,
    the taxonomy, value-weighted attention and the sink share on the reductions of a corpus pass: 101 ms layer by
    layer, 71 ms stacked.)

    Raises:
        ValueError: a layer was captured without patterns.
    """
    runs: list[list[int]] = []
    previous = None
    for layer, taken in batch.layers.items():
        p = _pattern_of(batch, layer)
        kind = (tuple(taken.heads), tuple(p.shape), p.dtype, isinstance(p, PatternRows))
        size = math.prod(p.shape) * p.dtype.itemsize
        if kind == previous and (not launch_bound(p.device) or isinstance(p, PatternRows)
                                 or (len(runs[-1]) + 1) * size <= _GPU_STACK_BYTES):
            runs[-1].append(layer)
        else:
            runs.append([layer])
        previous = kind
    return [tuple(run) for run in runs]


def _pattern_of(batch: CaptureBatch, layer: int) -> Tensor | PatternRows:
    """Layer ``layer``'s captured patterns, or what makes them where its tap kept them as ``PatternRows``.

    Raises:
        ValueError: the layer was captured without patterns.
    """
    taken = batch.layers[layer]
    p = taken.pattern if taken.pattern is not None else taken.pattern_rows
    if p is None:
        raise ValueError(f"layer {layer} was captured without patterns; capture with take=('pattern',)")
    return p


def launch_bound(device: torch.device) -> bool:
    """Whether an op on ``device`` costs its launch more than its arithmetic: everywhere but on a CPU. There the
    accumulators take fewer, larger ops: a stack's patterns are copied into one tensor, statistics are stacked
    before they are summed (``headlab.analysis.per_head.real_row_sums``); on a CPU each layer's pattern is reduced
    where it lies and a statistic is summed on its own, both faster there."""
    return device.type != "cpu"


def by_group(pattern: Tensor, groups: list[tuple[slice, int]],
             reduce: Callable[[Tensor, slice, int], Tensor]) -> Tensor:
    """``(layer, batch, head, pos, …)``: ``reduce(block, items, pos)`` of each length group's block
    ``pattern[:, items, :, :pos, :pos]`` side by side, 0 past each group's ``pos``.

    Args:
        pattern: ``(layer, batch, head, query_pos, key_pos)``; when not square (not self-attention) the
            whole pattern is one block.
        groups: ``CaptureBatch.length_groups()``.
        reduce: maps a block ``(layer, items, head, pos, pos)`` to ``(layer, items, head, pos, …)``.
    """
    if _one_block(pattern.shape, groups):
        return reduce(pattern, slice(None), pattern.shape[-1])
    out = None
    for items, pos in groups:
        part = reduce(pattern[:, items, :, :pos, :pos], items, pos)
        if out is None:
            out = pattern.new_zeros(pattern.shape[:4] + part.shape[4:])
        out[:, items, :, :pos] = part
    assert out is not None  # length_groups gives a batch at least one group
    return out


def _one_block(shape: torch.Size, groups: list[tuple[slice, int]]) -> bool:
    """Whether a pattern of ``shape`` (``(…, query_pos, key_pos)``) is read as one block, the whole pattern: it is
    not square (not self-attention), or its batch is one length group as long as the pattern."""
    return shape[-1] != shape[-2] or (len(groups) == 1 and groups[0][1] == shape[-1])


def column_masses(pattern: Tensor, columns: Tensor, groups: list[tuple[slice, int]], *,
                  out: Tensor | None = None) -> Tensor:
    """``(layer, batch, head, query_pos, column)``: ``Σ_j p_ij c_j``, each row's mass on each key column of its item,
    0 past each length group's ``pos`` (as ``by_group`` lays it out; a view of a ``(…, column, head, query_pos)``
    tensor, so that each column is contiguous).

    The product is taken columns first: ``(column × key_pos) · (key_pos × head·query_pos)`` per layer and item. On a
    CPU a product with few rows and many columns runs 1.5–4× faster than its transpose (every head's rows of an item
    times the columns, as this was before); reading every query row of a group's items, padded ones included, lets
    the heads' rows form one matrix without a copy. A padded row's mass is discarded, never summed with another.

    Args:
        pattern: ``(layer, batch, head, query_pos, key_pos)``; when not square (not self-attention) the whole
            pattern is one block.
        columns: ``(batch, column, key_pos)``, the same for every head of an item.
        groups: ``CaptureBatch.length_groups()``.
        out: ``(layer, batch, column, head, query_pos)``, contiguous, to write the masses into (returned as the
            view above); None allocates.
    """
    layers, batch, heads, n_q, n_k = pattern.shape
    n_columns = columns.shape[1]
    if out is None:
        out = pattern.new_empty(layers, batch, n_columns, heads, n_q)
    if n_q != n_k or (len(groups) == 1 and groups[0][1] == n_k):  # one block, the whole pattern
        rows = pattern.reshape(layers, batch, heads * n_q, n_k).transpose(-1, -2)
        torch.matmul(columns, rows, out=out.view(layers, batch, n_columns, heads * n_q))
        return out.permute(0, 1, 3, 4, 2)
    out.zero_()
    for items, pos in groups:
        block = pattern[:, items, :, :, :pos]  # every query row: (head, query) rows one key_pos stride apart
        n = block.shape[1]
        for layer in range(layers):
            rows = block[layer].reshape(n, heads * n_q, pos).transpose(1, 2)
            product = torch.matmul(columns[items, :, :pos], rows).view(n, n_columns, heads, n_q)
            out[layer, items, :, :, :pos] = product[..., :pos]
    return out.permute(0, 1, 3, 4, 2)


class BatchReductions:
    """The query and key masks of one batch and its ``stacks`` of layers, each with its ``StackReductions``.

    The queries are the batch's tokens, the keys ``CaptureBatch.keys`` where set (a view of cross-attention
    layers), else the same tokens: every mask but ``real`` is of the keys.

    Attributes:
        batch: the batch.
        real: ``(batch, query_pos)`` bool, True at real query tokens.
        key_real: ``(batch, key_pos)`` bool, True at real key tokens (``real`` itself for self-attention).
        special: ``(batch, key_pos)`` bool, True at real special tokens ([CLS], [SEP], BOS …).
        groups: ``CaptureBatch.length_groups``: the runs of items each reduction reads as one block.
        announced: ``{name: build}``, the key columns consumers will read the masses on (``announce``).
    """

    def __init__(self, batch: CaptureBatch) -> None:
        self.batch = batch
        self.announced: dict[Hashable, Callable[[StackReductions], Tensor]] = {}
        self._keys = batch if batch.keys is None else batch.keys
        self.real = batch.attention_mask.bool()
        self.key_real = self.real if batch.keys is None else self._keys.attention_mask.bool()
        self.special = self._keys.special_tokens_mask.bool() & self.key_real
        self.groups = batch.length_groups()
        self._columns: dict[tuple[str, torch.dtype], Tensor] = {}

    @cached_property
    def punctuation(self) -> Tensor:
        """``(batch, key_pos)`` bool: True at punctuation pieces that are not special tokens."""
        return punctuation_mask(self._keys)

    @cached_property
    def _segments(self) -> tuple[Tensor, Tensor]:
        return segments(self._keys)

    @property
    def segment(self) -> Tensor:
        """``(batch, key_pos)`` int64: each position's segment (``segments``)."""
        return self._segments[0]

    @property
    def n_content(self) -> Tensor:
        """``(batch,)`` int64: content segments per item."""
        return self._segments[1]

    @property
    def content(self) -> Tensor:
        """``(batch, key_pos)`` bool: real tokens that are not special."""
        return self.key_real & ~self.special

    def columns(self, dtype: torch.dtype) -> Tensor:
        """``(batch, key_pos, len(COLUMNS))``: the key masks of ``COLUMNS`` as 0/1 in ``dtype`` (made once per
        dtype)."""
        if ("columns", dtype) not in self._columns:
            first = torch.zeros_like(self.special)
            first[:, 0] = self.special[:, 0]
            masks = [first, self.special & ~first, self.punctuation & self.key_real, self.special]
            self._columns["columns", dtype] = torch.stack(masks, dim=-1).to(dtype)
        return self._columns["columns", dtype]

    def segment_columns(self, dtype: torch.dtype) -> Tensor:
        """``(batch, key_pos, n_segments)``: one key mask per segment (its content tokens), as 0/1 in ``dtype`` (made
        once per dtype). Apart from ``columns``: a long text has thousands of segments, and only the taxonomy reads
        them."""
        if ("segments", dtype) not in self._columns:
            one_hot = torch.nn.functional.one_hot(self.segment, int(self.segment.max()) + 1).bool()
            self._columns["segments", dtype] = (one_hot & self.content[..., None]).to(dtype)
        return self._columns["segments", dtype]

    def announce(self, name: Hashable, build: Callable[[StackReductions], Tensor]) -> None:
        """Say, before any reduction is read, that a consumer will read each row's masses on the key columns
        ``build(stack)`` ``(layer, batch, head | 1, key_pos, column)`` (``StackReductions.masses_on``): where the
        patterns are kept as ``PatternRows``, the one sweep over them then takes those masses too. A consumer does
        it in its ``prepare(batch)``, which ``capture`` calls before any consumer's update."""
        self.announced.setdefault(name, build)

    @cached_property
    def stacks(self) -> list[StackReductions]:
        """The captured layers' patterns as ``stack_layers`` stacks them, each with its reductions (computed as
        they are asked for), in layer order.

        Raises:
            ValueError: a layer was captured without patterns.
        """
        out = []
        for layers in stack_layers(self.batch):
            patterns = [_pattern_of(self.batch, layer) for layer in layers]
            out.append(StackReductions(patterns, self, layers=layers, heads=tuple(self.batch.layers[layers[0]].heads)))
        return out

    def stack(self, layer: int) -> StackReductions:
        """The stack that holds ``layer`` (its index in the stack: ``stack.layers.index(layer)``).

        Raises:
            ValueError: the layer was not captured, or a layer was captured without patterns.
        """
        for stack in self.stacks:
            if layer in stack.layers:
                return stack
        raise ValueError(f"layer {layer} was not captured; the batch holds the layers {sorted(self.batch.layers)}")


class StackReductions:
    """The row reductions of a stack of layers' patterns, each computed on first access.

    All are in the patterns' dtype. Rows are ``(layer, batch, head, query_pos)``; padded query rows
    hold whatever the patterns hold there, or 0. Each reduction reads the batch's length groups
    (``CaptureBatch.length_groups``) as their own shorter blocks, never the padding past a group's
    longest item.

    Where the layers' taps kept their patterns as ``PatternRows`` (``swept``: no whole pattern exists), every row
    reduction comes from one ``headlab.analysis.sweep.sweep`` of each layer, on first access: the entropy, the
    distance, the largest weight, the diagonals of ``DIAGONALS``, the masses on ``COLUMNS`` and on every key column
    announced before (``BatchReductions.announce``). What sums over queries (``key_sums``, ``segment_masses``) and
    ``over_layers`` need whole patterns.

    Args:
        patterns: each layer's ``(batch, head, query_pos, key_pos)``, the same shape and dtype; or each layer's
            ``PatternRows`` of such patterns.
        keys: the batch's masks, which make and hold this object (``BatchReductions.stacks``); held weakly here.
        layers: the layers of the stack, in order.
        heads: the heads every one of them captured, in the patterns' order.

    Attributes:
        shape: ``(layer, batch, head, query_pos, key_pos)``, the stack's patterns side by side.
        dtype, device: the patterns'.
        swept: the patterns are ``PatternRows``, read by the sweep.
        parts: the patterns as the reductions read them, ``[(pattern (layer, batch, head, query_pos, key_pos),
            the slice of the stack's layers it holds)]``: one copy of the whole stack where ``launch_bound`` (a
            GPU), else each layer's pattern where it lies (a CPU); empty where ``swept``.
        slices: the slices of the stack's layers as ``parts`` hold them (one per layer where ``swept``).
    """

    def __init__(self, patterns: Sequence[Tensor | PatternRows], keys: BatchReductions, *,
                 layers: tuple[int, ...], heads: tuple[int, ...]) -> None:
        first = patterns[0]
        self.layers, self.heads = layers, heads
        self.shape, self.dtype, self.device = (len(patterns), *first.shape), first.dtype, first.device
        self.swept = isinstance(first, PatternRows)
        self._rows = [p for p in patterns if isinstance(p, PatternRows)]
        # the patterns as they are read, each with the slice of the stack's layers it holds
        tensors = [p for p in patterns if isinstance(p, Tensor)]
        if len(tensors) > 1 and launch_bound(first.device):  # one (layer, …) tensor: an op per stack
            self.parts = [(torch.stack(tensors), slice(0, len(tensors)))]
        else:  # each layer where it lies, as (1, …)
            self.parts = [(p[None], slice(i, i + 1)) for i, p in enumerate(tensors)]
        self.slices = [part for _, part in self.parts] if self.parts else [slice(i, i + 1) for i in range(len(layers))]
        # held weakly: keys holds this object, and a cycle would keep the batch's patterns alive until the next
        # garbage collection after the batch is done (capture then could not reuse their memory)
        self.keys = weakref.proxy(keys)
        self._diagonals: dict[int, Tensor] = {}
        self._column_masses: dict[Hashable, Tensor] = {}

    def over_layers(self, reduce: Callable[[Tensor, slice], Tensor]) -> Tensor:
        """``(layer, …)``: ``reduce(pattern, layers)`` of each of ``parts`` (``pattern`` ``(layer, batch, head,
        query_pos, key_pos)``, ``layers`` the slice of the stack it holds), the results side by side: all at once
        where the patterns were copied into one tensor (a GPU), else layer by layer (a CPU).

        Raises:
            ValueError: the patterns are ``PatternRows`` (``swept``): no whole pattern to hand.
        """
        if self.swept:
            raise ValueError(f"layers {list(self.layers)} kept their patterns as PatternRows (they would not fit "
                             "whole): only their row reductions can be read, or rows formed with pattern_rows.rows")
        results = [reduce(pattern, layers) for pattern, layers in self.parts]
        return results[0] if len(results) == 1 else torch.cat(results)

    def _by_group(self, reduce: Callable[[Tensor, slice, int], Tensor]) -> Tensor:
        return self.over_layers(lambda pattern, _: by_group(pattern, self.keys.groups, reduce))

    @cached_property
    def _swept(self) -> tuple[Tensor, dict[Hashable, slice]]:
        """``(out, where)``: each layer's ``sweep`` side by side, ``(layer, batch, head, query_pos, field)``, with
        the masses on ``COLUMNS`` and on every announced column set, ``where[name]`` the fields of each (``COLUMNS``
        under "columns")."""
        columns = self.keys.columns(self.dtype)[None, :, None]  # (1, batch, 1, key_pos, column)
        sets: dict[Hashable, Tensor] = {"columns": columns.expand(len(self.layers), -1, -1, -1, -1)}
        sets |= {name: build(self) for name, build in self.keys.announced.items()}  # (layer, batch, head | 1, …)
        where: dict[Hashable, slice] = {}
        at = len(FIELDS) + len(DIAGONALS)
        for name, columns in sets.items():
            where[name] = slice(at, at + columns.shape[-1])
            at += columns.shape[-1]
        out = []
        for i, rows in enumerate(self._rows):
            parts = [columns[i] for columns in sets.values()]  # this layer's
            heads = max(part.shape[1] for part in parts)
            columns = torch.cat([part.to(self.device, self.dtype).expand(-1, heads, -1, -1) for part in parts], -1)
            out.append(sweep(rows, columns))
        return torch.stack(out), where

    def _field(self, index: int) -> Tensor:
        return self._swept[0][..., index]

    @cached_property
    def masses(self) -> Tensor:
        """``(layer, batch, head, query_pos, column)``: each row's mass on each of ``BatchReductions.columns``."""
        if self.swept:
            out, where = self._swept
            return out[..., where["columns"]]
        return self._masses(self.keys.columns(self.dtype))

    def masses_on(self, name: Hashable, build: Callable[[StackReductions], Tensor], *,
                  first_keys: int | None = None) -> Tensor:
        """``(layer, batch, head, query_pos, column)``: each row's mass ``Σ_j p_ij c_j`` on the key columns ``c`` of
        ``build(self)`` ``(layer, batch, head | 1, key_pos, column)``, computed once per ``name``.

        Of whole patterns, one product per length group, each head's columns first (``(column × key_pos) · (key_pos ×
        query_pos)``: on a CPU ~4× faster than its transpose, as in the module's ``column_masses``); where the columns
        are 0 past the first ``first_keys`` keys, those keys' weights alone are read. Where ``swept``, from the sweep
        when ``name`` was announced (``BatchReductions.announce``) before it ran, else from a sweep of its own.
        """
        if name in self._column_masses:
            return self._column_masses[name]
        if self.swept and name in self._swept[1]:
            masses = self._swept[0][..., self._swept[1][name]]
        elif self.swept:
            columns = build(self)
            masses = torch.stack([sweep(rows, columns[i].to(self.dtype))[..., len(FIELDS) + len(DIAGONALS):]
                                  for i, rows in enumerate(self._rows)])
        elif first_keys is not None:  # the first keys' weights, as they lie
            columns = build(self).to(self.dtype)[..., :first_keys, :]  # (layer, batch, head | 1, first_keys, column)
            masses = self.over_layers(lambda pattern, layers: torch.matmul(pattern[..., :first_keys], columns[layers]))
        else:
            columns = build(self).to(self.dtype).transpose(-1, -2)  # (layer, batch, head | 1, column, key_pos)

            def masses_of(pattern: Tensor, layers: slice) -> Tensor:
                def reduce(block: Tensor, items: slice, pos: int) -> Tensor:
                    return torch.matmul(columns[layers, items, :, :, :pos], block.transpose(-1, -2)).transpose(-1, -2)

                return by_group(pattern, self.keys.groups, reduce)

            masses = self.over_layers(masses_of)
        self._column_masses[name] = masses
        return masses

    def _masses(self, columns: Tensor) -> Tensor:
        """``(layer, batch, head, query_pos, column)``: each row's mass on each key column of ``columns`` ``(batch,
        key_pos, column)``."""
        columns = columns.to(self.device).transpose(1, 2)  # (batch, column, key_pos)
        layers, batch, heads, n_q, _ = self.shape
        out = torch.empty(layers, batch, columns.shape[1], heads, n_q, dtype=self.dtype, device=self.device)
        for pattern, part in self.parts:  # each part's masses written in place
            column_masses(pattern, columns, self.keys.groups, out=out[part])
        return out.permute(0, 1, 3, 4, 2)

    def mass(self, column: str) -> Tensor:
        """``(layer, batch, head, query_pos)``: each row's mass on the key column ``column`` of ``COLUMNS``."""
        return self.masses[..., COLUMNS.index(column)]

    @cached_property
    def segment_masses(self) -> Tensor:
        """``(layer, batch, head, query_pos, n_segments)``: each row's mass on the content tokens of each segment.

        Raises:
            ValueError: the patterns are ``PatternRows`` (a column per segment is the taxonomy's, which needs whole
                patterns).
        """
        self._whole("segment_masses")
        return self._masses(self.keys.segment_columns(self.dtype))

    def diagonal(self, offset: int) -> Tensor:
        """``(layer, batch, head, query_pos)``: ``p[..., i, i + offset]``, 0 where key ``i + offset`` does not exist.

        Raises:
            ValueError: ``swept`` and ``offset`` not one of ``DIAGONALS``.
        """
        if self.swept:
            if offset not in DIAGONALS:
                raise ValueError(f"offset={offset!r}: patterns kept as PatternRows give the diagonals {DIAGONALS}")
            return self._field(len(FIELDS) + DIAGONALS.index(offset))
        if offset not in self._diagonals:
            out = torch.zeros(self.shape[:-1], dtype=self.dtype, device=self.device)
            first = max(0, -offset)
            for pattern, layers in self.parts:
                values = pattern.diagonal(offset=offset, dim1=-2, dim2=-1)
                out[layers, ..., first:first + values.shape[-1]] = values
            self._diagonals[offset] = out
        return self._diagonals[offset]

    @property
    def entropy(self) -> Tensor:
        """``(layer, batch, head, query_pos)``: ``−Σ_j p_ij ln p_ij`` (nats; ``0 ln 0 = 0``)."""
        return self._field(FIELDS.index("entropy")) if self.swept else self._entropy_and_distance[..., 0]

    @property
    def distance(self) -> Tensor:
        """``(layer, batch, head, query_pos)``: ``Σ_j p_ij |i − j|``."""
        return self._field(FIELDS.index("distance")) if self.swept else self._entropy_and_distance[..., 1]

    @cached_property
    def _entropy_and_distance(self) -> Tensor:
        """``(layer, batch, head, query_pos, 2)``: both row sums in one pass over each group's block, in blocks of
        whole (query, key) matrices whose temporaries stay in cache."""

        def reduce(block: Tensor, items: slice, pos: int) -> Tensor:
            n_q, n_k = block.shape[-2:]
            matrices = block.reshape(-1, n_q, n_k)
            offsets = torch.arange(n_q, device=block.device)[:, None] - torch.arange(n_k, device=block.device)
            offsets = offsets.abs().to(block.dtype)
            sums = block.new_empty(2, len(matrices), n_q)  # entropy, distance
            step = max(1, (_GPU_BLOCK if launch_bound(block.device) else _BLOCK) // max(1, n_q * n_k))
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
        """``(layer, batch, head, query_pos)``: ``max_j p_ij``."""
        if self.swept:
            return self._field(FIELDS.index("confidence"))
        return self._by_group(lambda block, items, pos: block.amax(-1))

    @cached_property
    def key_sums(self) -> Tensor:
        """``(layer, batch, head, key_pos)``: ``Σ_i p_ij`` over the real queries ``i``.

        Raises:
            ValueError: the patterns are ``PatternRows``.
        """
        self._whole("key_sums")
        real = self.keys.real.to(self.device)

        def reduce(block: Tensor, items: slice, pos: int) -> Tensor:
            rows = real[items, : block.shape[-2]]  # (n, query_pos)
            sums = torch.matmul(rows.to(block.dtype)[:, None, None, :], block).squeeze(-2)  # (layer, n, head, key)
            if not torch.isfinite(sums).all():  # padded query rows may hold anything (NaN): keep them out
                sums = torch.where(rows[:, None, :, None], block, 0.0).sum(-2)
            return sums

        return self._by_group(reduce)  # (layer, batch, head, key_pos): each group's sums fill its first pos keys

    def _whole(self, what: str) -> None:
        """Raise ValueError where the patterns are ``PatternRows``: ``what`` sums over queries, and needs them whole."""
        if self.swept:
            raise ValueError(f"{what} needs whole patterns; layers {list(self.layers)} kept theirs as PatternRows")
