"""Synthetic tasks the experiments train on, drawn from a seeded ``torch.Generator``.

Axis legend:
    inputs   (batch, pos, field)   int64 symbols; a position holds one symbol per field
    targets  (batch, pos)          int64 class to predict at each position
    scored   (batch, pos)          bool: positions whose prediction is trained and scored

Each position of the recall tasks holds two symbols, a key and a value (the model embeds each
field with its own table and sums them), so one attention layer can look a key up and copy
its value. ``RecallTask`` needs one relation, many times (multi-query associative recall,
Arora et al. 2023); ``MixTask`` needs two relations at the same position at once, matching a
key and reading the previous position, which one softmax over the keys cannot do sharply.
``RepeatTask`` is the in-context copying that induction heads solve (Olsson et al. 2022).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

__all__ = ["Batch", "MixTask", "RecallTask", "RepeatTask", "Task"]


@dataclass(frozen=True)
class Batch:
    """One batch of a task.

    Attributes:
        inputs: ``(batch, pos, field)`` int64 symbols, field f in ``[0, vocab_sizes[f])``.
        targets: ``(batch, pos)`` int64 classes in ``[0, n_classes)`` (0 where not scored).
        scored: ``(batch, pos)`` bool, the positions whose prediction counts.
    """

    inputs: Tensor
    targets: Tensor
    scored: Tensor


class Task(Protocol):
    """What the training loop and the model need to know about a task."""

    @property
    def name(self) -> str:
        """The task's name."""

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        """Symbols per input field."""

    @property
    def n_classes(self) -> int:
        """Classes a target can take."""

    @property
    def seq_len(self) -> int:
        """Positions per sequence."""

    def sample(self, batch_size: int, *, generator: torch.Generator) -> Batch:
        """Draw ``batch_size`` sequences with ``generator``."""


def _check(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}={value!r} must be an int ≥ {low}")


def _check_context(task: RecallTask | MixTask) -> None:
    """The context fields of a key-value task are positive ints with enough distinct keys."""
    for field in ("n_keys", "n_values", "n_pairs", "n_queries"):
        _check(field, getattr(task, field), 1)
    if task.n_pairs > task.n_keys:
        raise ValueError(f"n_pairs={task.n_pairs} distinct keys need n_keys ≥ n_pairs, got n_keys={task.n_keys}")


def _context(n_keys: int, n_values: int, n_pairs: int, n_queries: int, batch_size: int,
             generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """Distinct keys with random values for the context, and query keys drawn from the context.

    Returns:
        keys ``(batch, n_pairs)``, values ``(batch, n_pairs)``, query slots ``(batch, n_queries)``
        (indices into the context).
    """
    _check("batch_size", batch_size, 1)
    scores = torch.rand(batch_size, n_keys, generator=generator)
    keys = scores.argsort(dim=1)[:, :n_pairs]  # a random n_pairs-subset of keys per sequence
    values = torch.randint(n_values, (batch_size, n_pairs), generator=generator)
    slots = torch.randint(n_pairs, (batch_size, n_queries), generator=generator)
    return keys, values, slots


@dataclass(frozen=True)
class RecallTask:
    """Multi-query associative recall: n_pairs (key, value) positions, then n_queries positions
    holding a key of the context (value field empty); the target at a query is that key's value.

    Fields: key in ``[0, n_keys]`` (``n_keys`` = empty), value in ``[0, n_values]`` (``n_values`` =
    empty). Scored: the query positions.
    """

    n_keys: int = 16
    n_values: int = 16
    n_pairs: int = 8
    n_queries: int = 8
    name: str = "recall"

    def __post_init__(self) -> None:
        _check_context(self)

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        return (self.n_keys + 1, self.n_values + 1)

    @property
    def n_classes(self) -> int:
        return self.n_values

    @property
    def seq_len(self) -> int:
        return self.n_pairs + self.n_queries

    def sample(self, batch_size: int, *, generator: torch.Generator) -> Batch:
        keys, values, slots = _context(self.n_keys, self.n_values, self.n_pairs, self.n_queries, batch_size,
                                       generator)
        query_keys, answers = keys.gather(1, slots), values.gather(1, slots)
        empty = torch.full_like(query_keys, self.n_values)
        inputs = torch.stack([torch.cat([keys, query_keys], 1), torch.cat([values, empty], 1)], dim=-1)
        targets = torch.cat([torch.zeros_like(keys), answers], 1)
        scored = torch.cat([torch.zeros_like(keys, dtype=torch.bool), torch.ones_like(slots, dtype=torch.bool)], 1)
        return Batch(inputs=inputs, targets=targets, scored=scored)


@dataclass(frozen=True)
class MixTask:
    """Match a key and copy the previous position, at the same query position.

    Like ``RecallTask``, but every query position also holds a random value, and the target at a
    query is the pair (value of the matching context key, value held by the previous position),
    as the single class ``matched · n_values + previous``. Scored: the query positions.
    """

    n_keys: int = 8
    n_values: int = 4
    n_pairs: int = 6
    n_queries: int = 6
    name: str = "mix"

    def __post_init__(self) -> None:
        _check_context(self)

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        return (self.n_keys, self.n_values)

    @property
    def n_classes(self) -> int:
        return self.n_values * self.n_values

    @property
    def seq_len(self) -> int:
        return self.n_pairs + self.n_queries

    def sample(self, batch_size: int, *, generator: torch.Generator) -> Batch:
        keys, values, slots = _context(self.n_keys, self.n_values, self.n_pairs, self.n_queries, batch_size,
                                       generator)
        query_values = torch.randint(self.n_values, slots.shape, generator=generator)
        all_values = torch.cat([values, query_values], 1)
        previous = all_values[:, self.n_pairs - 1 : -1]  # value field of the position before each query
        answers = values.gather(1, slots) * self.n_values + previous
        inputs = torch.stack([torch.cat([keys, keys.gather(1, slots)], 1), all_values], dim=-1)
        targets = torch.cat([torch.zeros_like(keys), answers], 1)
        scored = torch.cat([torch.zeros_like(keys, dtype=torch.bool), torch.ones_like(slots, dtype=torch.bool)], 1)
        return Batch(inputs=inputs, targets=targets, scored=scored)


@dataclass(frozen=True)
class RepeatTask:
    """Next-token prediction on ``[BOS] + r + r + filler``: r is a span of distinct random tokens
    of random length in ``[min_span, max_span]``, the filler random tokens up to ``length`` positions.

    The second copy starts at a different offset in every sequence, so no fixed positional rule
    predicts it: the model must find where the current token occurred before and copy the token
    that followed (an induction head). One field: tokens in ``[0, vocab]``, ``vocab`` = BOS.
    Scored: positions of the second copy whose next token is also in it (``span − 1`` per
    sequence); the target is the next token.
    """

    vocab: int = 32
    length: int = 32
    min_span: int = 5
    max_span: int = 12
    name: str = "repeat"

    def __post_init__(self) -> None:
        _check("min_span", self.min_span, 2)
        _check("max_span", self.max_span, self.min_span)
        _check("vocab", self.vocab, self.max_span)
        _check("length", self.length, 1 + 2 * self.max_span)

    @property
    def bos(self) -> int:
        """The BOS symbol."""
        return self.vocab

    @property
    def vocab_sizes(self) -> tuple[int, ...]:
        return (self.vocab + 1,)

    @property
    def n_classes(self) -> int:
        return self.vocab

    @property
    def seq_len(self) -> int:
        return self.length

    def sample(self, batch_size: int, *, generator: torch.Generator) -> Batch:
        _check("batch_size", batch_size, 1)
        T = self.length
        tokens = torch.randint(self.vocab, (batch_size, T), generator=generator)
        spans = torch.randint(self.min_span, self.max_span + 1, (batch_size,), generator=generator)
        distinct = torch.rand(batch_size, self.vocab, generator=generator).argsort(dim=1)  # a permutation per row
        pos = torch.arange(T)[None, :]
        first = (pos >= 1) & (pos <= spans[:, None])  # positions 1 .. span
        second = (pos > spans[:, None]) & (pos <= 2 * spans[:, None])  # positions span+1 .. 2·span
        offset = torch.where(second, pos - spans[:, None], pos) - 1  # index into r
        span_tokens = distinct.gather(1, offset.clamp(0, self.vocab - 1))
        tokens = torch.where(first | second, span_tokens, tokens)
        tokens[:, 0] = self.bos
        targets = torch.zeros_like(tokens)
        targets[:, :-1] = tokens[:, 1:]
        scored = second & (pos < 2 * spans[:, None])  # the next token is in the second copy too
        return Batch(inputs=tokens[..., None], targets=torch.where(scored, targets, 0), scored=scored)
