"""What a consumer receives for each batch: the inputs and, per selected layer, the selected heads.

Axis legend:
    input_ids, attention_mask, word_ids   (batch, pos)     pos = the batch's longest item
    offsets                               (batch, pos, 2)  character (start, end) in the item's text
    pattern                               (batch, head, query_pos, key_pos)
    z                                     (batch, head, query_pos, d_head_v)
    result                                (batch, head, query_pos, d_model)
    q                                     (batch, head, query_pos, d_head)
    k, v                                  (batch, head, key_pos, d_head | d_head_v)
``head`` runs over the selected heads only, in ``LayerCapture.heads`` order.

What several consumers derive from the same batch (e.g. the analysis accumulators' row
reductions of every pattern) is computed once, by the first consumer that asks, through
``CaptureBatch.shared``, and dropped with the batch.

Items are padded on the right. Padded key positions get zero attention; padded query rows
hold whatever the model computed there and should be ignored (``attention_mask``, ``lengths``).

A batch of (source, target) pairs (an encoder-decoder) has two sides of tokens: its own fields are the
source's (what the encoder reads), ``target`` the decoder's (the target shifted one place right behind the
decoder start token, ``headlab.models.seq2seq``). Each ``LayerCapture`` says which side its queries and
keys come from (``sides``): encoder self-attention (source, source), decoder self-attention (target,
target), cross-attention (target, source). A consumer asks the batch, never the layer's kind: ``sides(layer)``
gives a layer's query and key sides, ``views()`` the batch cut into one single-side batch per kind of layer
(a batch of texts is its own one view).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

from headlab.capture.batching import GPU_GROUP_COST, length_groups
from headlab.capture.encoding import TokenizedCorpus
from headlab.capture.words import word_units
from headlab.models import TapOutput
from headlab.models.seq2seq import SOURCE, TARGET

__all__ = ["SIDES", "SOURCE", "TARGET", "CaptureBatch", "LayerCapture", "collate"]

SIDES = (SOURCE, TARGET)  # a batch's own tokens (a text, or a pair's source), a pair's target

T = TypeVar("T")


@dataclass(kw_only=True)
class LayerCapture(TapOutput):
    """The selected heads of one layer, for one batch: what a tap took (``pattern``, ``z``,
    ``result``, ``q``, ``k``, ``v``; None if not asked for), and where from.

    Attributes:
        layer: the layer's index (0-based).
        heads: the selected query heads; axis 1 of every tensor follows this order.
        sides: the sides (``SIDES``) its queries and its keys come from: ``(SOURCE, SOURCE)`` but in a batch of
            pairs, where the decoder's self-attention is ``(TARGET, TARGET)`` and its cross-attention
            ``(TARGET, SOURCE)`` (``CaptureBatch.sides``).
    """

    layer: int
    heads: tuple[int, ...]
    sides: tuple[str, str] = (SOURCE, SOURCE)


@dataclass
class CaptureBatch:
    """One batch of a capture: the model's inputs, where each item came from, and what was taken.

    Attributes:
        input_ids: ``(batch, pos)`` right-padded token ids.
        attention_mask: ``(batch, pos)`` int64, 1 at real tokens, 0 at padding (the model's input).
        lengths: ``(batch,)`` real tokens per item, special tokens included.
        offsets: ``(batch, pos, 2)`` each piece's character span in its text; ``(0, 0)`` for
            special tokens and padding.
        word_ids: ``(batch, pos)`` the tokenizer's word index of each piece; -1 for special
            tokens and padding (see ``headlab.capture.words``).
        special_tokens_mask: ``(batch, pos)`` bool, True at special tokens ([CLS], [SEP], BOS …).
        corpus_indices: ``(batch,)`` each item's index in the corpus.
        truncated: ``(batch,)`` bool, True where the item was cut to ``max_length``.
        texts: each item's text.
        tokens: each item's pieces as strings (unpadded).
        layers: per selected layer index, the selected heads' tensors (filled by the forward).
        target: a batch of pairs: the decoder's side, a ``CaptureBatch`` of the same items (no layers) whose
            tokens are the targets shifted one place right behind the decoder start token (what each decoder
            position reads); None for a batch of texts.
        keys: a view of cross-attention layers (``views``): the side their keys come from, this batch's own
            fields being the queries'; None where queries and keys are the same tokens.
    """

    input_ids: Tensor
    attention_mask: Tensor
    lengths: Tensor
    offsets: Tensor
    word_ids: Tensor
    special_tokens_mask: Tensor
    corpus_indices: Tensor
    truncated: Tensor
    texts: list[str]
    tokens: list[list[str]]
    layers: dict[int, LayerCapture] = field(default_factory=dict)
    target: CaptureBatch | None = None
    keys: CaptureBatch | None = None
    _shared: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def shared(self, key: Hashable, compute: Callable[[CaptureBatch], T]) -> T:
        """``compute(self)``, computed once per batch: the first consumer to ask pays, the others reuse it.

        Args:
            key: names what is computed; consumers that ask under equal keys get the same object.
            compute: derives it from this batch (its inputs and its layers, filled by then).

        Returns:
            The value stored under ``key`` for this batch.
        """
        if key not in self._shared:
            self._shared[key] = compute(self)
        return self._shared[key]

    def release_shared(self) -> None:
        """Drop everything ``shared`` holds (its views' too). What consumers derive often holds the batch itself (a
        reference cycle), which would keep the batch's tensors alive until the next garbage collection; ``capture``
        calls this when the batch's turn ends, so they are freed (and their memory reused) at once."""
        for view in self._shared.get(_views, ()):
            if view is not self:
                view.release_shared()
        self._shared.clear()

    def side(self, name: str) -> CaptureBatch:
        """The tokens of the side ``name`` (``SIDES``): this batch for ``SOURCE``, ``target`` for ``TARGET``.

        Raises:
            ValueError: an unknown side, or ``TARGET`` of a batch of texts.
        """
        if name == SOURCE:
            return self
        if name == TARGET and self.target is not None:
            return self.target
        raise ValueError(f"side {name!r}: this batch has the sides {SIDES if self.target is not None else (SOURCE,)}")

    def sides(self, layer: int) -> tuple[CaptureBatch, CaptureBatch]:
        """``(queries, keys)``: the sides layer ``layer``'s queries and keys come from (``LayerCapture.sides``), the
        same batch twice for self-attention over one text.

        Raises:
            KeyError: the layer was not captured.
        """
        query, key = self.layers[layer].sides
        return self.side(query), self.side(key)

    def views(self) -> list[CaptureBatch]:
        """The batch as single-side batches, one per kind of layer (``LayerCapture.sides``), each holding those
        layers in order, its own fields the queries' side and ``keys`` the keys' when they differ (cross-attention):
        ``[self]`` for a batch of texts; for a batch of pairs, the encoder's, the decoder's self-attention and the
        cross-attention layers, made once per batch. A consumer that reads masks of one text updates with each
        view in turn."""
        if self.target is None:
            return [self]
        return self.shared(_views, _views)

    def view(self, query: str, key: str) -> CaptureBatch | None:
        """The view (``views``) of the layers whose queries come from the side ``query`` and keys from ``key``
        (``SIDES``), or None when no such layer was captured; a batch of texts is its own ``(SOURCE, SOURCE)``."""
        return next((view for view in self.views()
                     if all(taken.sides == (query, key) for taken in view.layers.values())), None)

    @property
    def cross(self) -> bool:
        """Queries and keys come from different texts: a view of cross-attention layers (``views``)."""
        return self.keys is not None

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def length_groups(self) -> list[tuple[slice, int]]:
        """Runs of items that readers of the patterns take as their own ``(items, pos, pos)`` blocks, each
        ``(items, its longest length)`` (``headlab.capture.batching.length_groups``; ``GPU_GROUP_COST`` per
        run on a GPU), worked out once."""
        if self.keys is not None:  # cross-attention: queries and keys not the same, read as one block
            return [(slice(0, len(self)), self.input_ids.shape[1])]
        group_cost = None if self.input_ids.device.type == "cpu" else GPU_GROUP_COST
        return self.shared(length_groups, lambda batch: length_groups(batch.lengths.tolist(), group_cost=group_cost))

    def word_units(self) -> tuple[Tensor, Tensor]:
        """``(units (batch, pos), n_units (batch,))``: words and special tokens, for
        ``headlab.capture.words.pattern_to_words``."""
        return word_units(self.word_ids, self.attention_mask)


def _views(batch: CaptureBatch) -> list[CaptureBatch]:
    """``CaptureBatch.views`` of a batch of pairs."""
    kinds: dict[tuple[str, str], dict[int, LayerCapture]] = {}
    for layer, taken in batch.layers.items():
        kinds.setdefault(taken.sides, {})[layer] = taken
    out = []
    for (query, key), layers in kinds.items():
        keys = None if query == key else batch.side(key)
        out.append(replace(batch.side(query), layers=layers, target=None, keys=keys))
    return out


def collate(tokenized: TokenizedCorpus, indices: Sequence[int], *, device: torch.device | str = "cpu",
            target: TokenizedCorpus | None = None, start: tuple[int, str] | None = None) -> CaptureBatch:
    """Pad the items ``indices`` of ``tokenized`` to their longest and stack them.

    Args:
        tokenized: the tokenized corpus (a corpus of pairs: the sources).
        indices: corpus indices of the batch's items, in batch order.
        device: where the tensors go (the model's device).
        target: a corpus of pairs: the tokenized targets, in corpus order; None for texts.
        start: with ``target``: the decoder start token's id and label, put before each target (shifted one
            place right, the target's last piece dropped: what the decoder reads, ``headlab.models.seq2seq``).

    Returns:
        A ``CaptureBatch`` with no layer captured yet (``target`` set for pairs).

    Raises:
        ValueError: ``target`` without ``start``.
    """
    batch = _collated(tokenized, indices, device=device)
    if target is not None:
        if start is None:
            raise ValueError("collate(target=...) needs start=(the decoder start token's id, its label)")
        batch.target = _collated(target, indices, device=device, start=start)
    return batch


def _collated(tokenized: TokenizedCorpus, indices: Sequence[int], *, device: torch.device | str,
              start: tuple[int, str] | None = None) -> CaptureBatch:
    """``collate`` of one side; ``start``: shifted behind that token (a decoder's side)."""
    encodings = [tokenized.encodings[i] for i in indices]
    lengths = np.array([len(e.ids) for e in encodings], dtype=np.int64)
    batch, pos = len(encodings), int(lengths.max())
    input_ids = np.full((batch, pos), tokenized.pad_id, dtype=np.int64)
    attention_mask = np.zeros((batch, pos), dtype=np.int64)
    offsets = np.zeros((batch, pos, 2), dtype=np.int64)
    word_ids = np.full((batch, pos), -1, dtype=np.int64)
    special = np.zeros((batch, pos), dtype=bool)
    tokens = [list(e.tokens) for e in encodings]
    for row, (e, n) in enumerate(zip(encodings, lengths)):
        attention_mask[row, :n] = 1
        if start is None:
            input_ids[row, :n] = e.ids
            offsets[row, :n] = e.offsets
            word_ids[row, :n] = [-1 if w is None else w for w in e.word_ids]
            special[row, :n] = e.special_tokens_mask
        else:  # position 0 reads the start token, position i the piece i − 1
            input_ids[row, 0], input_ids[row, 1:n] = start[0], e.ids[:-1]
            offsets[row, 1:n] = e.offsets[:-1]
            word_ids[row, 1:n] = [-1 if w is None else w for w in e.word_ids[:-1]]
            special[row, 0], special[row, 1:n] = True, e.special_tokens_mask[:-1]
            tokens[row] = [start[1], *tokens[row][:-1]]

    corpus_indices = np.asarray(indices, dtype=np.int64)
    truncated = np.array([tokenized.full_lengths[i] > tokenized.lengths[i] for i in indices], dtype=bool)
    integers = _moved((input_ids, attention_mask, lengths, offsets, word_ids, corpus_indices), device)
    flags = _moved((special, truncated), device)
    return CaptureBatch(
        input_ids=integers[0], attention_mask=integers[1], lengths=integers[2], offsets=integers[3],
        word_ids=integers[4], special_tokens_mask=flags[0], corpus_indices=integers[5], truncated=flags[1],
        texts=[tokenized.texts[i] for i in indices], tokens=tokens,
    )


def _moved(arrays: Sequence[np.ndarray], device: torch.device | str) -> list[Tensor]:
    """``arrays`` (one dtype) on ``device`` in one copy: each copy to a GPU from ordinary host memory waits for
    the GPU to catch up, so a batch's inputs go as two copies (integers, flags) instead of eight."""
    flat = torch.from_numpy(np.concatenate([a.ravel() for a in arrays])).to(device)
    return [part.view(a.shape) for part, a in zip(flat.split([a.size for a in arrays]), arrays)]
