"""Retrieval heads: the heads that copy a token from far back in the context (Wu et al. 2024,
"Retrieval Head Mechanistically Explains Long-Context Factuality").

Wu et al. hide a needle in a haystack and let the model copy it out; while it generates token w, a
head *retrieves* when w is in the needle and the head's most-attended key holds that token in the
needle. A head's retrieval score is the share of the needle's tokens it retrieved; heads scoring
above 0.1 are the paper's retrieval heads. Here the copy is teacher-forced, so one forward scores
every step: the input is a haystack of corpus text with a needle span (also corpus text) inserted
at a random depth, followed by the needle again. Step i of the copy is the query at the copy's
token i − 1, which should predict needle token i (i = 1 … n − 1: the copy's first token has no cue,
so it is not a step). At that step a head

    attends   when its most-attended key (argmax, the first on ties) is a needle position holding
              needle token i (Wu et al. compare tokens: with distinct tokens, exactly position i);
    retrieves when it attends and the model's top prediction is needle token i.

``score`` = retrieved steps / steps, summed over needles (``RetrievalScores``: add_copies / merge /
result, a ``headlab.analysis.accumulator.Mergeable``). Only the selected heads' patterns are captured
and scored (``heads``: a ``headlab.heads.selection``), one row each; a copy case is sized by its haystack
or by its whole length (``length``: the haystack fills what the needle, its copy and the
beginning-of-sequence token leave), so long texts are needle-style copies of the chosen length.
Only causal models copy by generating: a bidirectional model is refused.

Axis legend:
    input_ids  (batch, pos)
    pattern    (batch, head, query_pos, key_pos): ``head`` runs over a layer's selected heads
    predicted  (batch, pos): the model's top next-token prediction after each position
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from headlab import display
from headlab.capture.corpus import ShortCorpus
from headlab.heads import HeadSelection, HeadTable, head_label, resolve
from headlab.models import HeadedModel, headed

__all__ = ["HAYSTACK_LENGTH", "THRESHOLD", "CopyCase", "RetrievalResult", "RetrievalScores", "copy_cases",
           "haystack_for", "retrieval_scores"]

THRESHOLD = 0.1  # Wu et al.'s retrieval heads score above this
HAYSTACK_LENGTH = 96  # retrieval_scores' haystack when neither haystack_length nor length is given


@dataclass(frozen=True)
class CopyCase:
    """One teacher-forced copy: ``input_ids`` holds the haystack with the needle inside, then the needle again.

    Attributes:
        input_ids: the whole input, ``(pos,)`` as a tuple.
        needle_start: position of the needle's first token inside the haystack.
        copy_start: position of the copy's first token (the input ends with the copy).
        length: tokens in the needle, ``>= 2``.
    """

    input_ids: tuple[int, ...]
    needle_start: int
    copy_start: int
    length: int

    def __post_init__(self) -> None:
        n, ids = self.length, self.input_ids
        if n < 2 or self.copy_start + n != len(ids) or not 0 <= self.needle_start <= self.copy_start - n:
            raise ValueError(f"a copy case needs a needle of >= 2 tokens ending before its copy, which ends the input; "
                             f"got length={n}, needle_start={self.needle_start}, copy_start={self.copy_start}, "
                             f"{len(ids)} tokens")
        if ids[self.needle_start:self.needle_start + n] != ids[self.copy_start:]:
            raise ValueError(f"the copy at {self.copy_start} is not the needle at {self.needle_start}")

    @property
    def needle(self) -> tuple[int, ...]:
        return self.input_ids[self.needle_start:self.needle_start + self.length]

    def steps(self) -> tuple[Tensor, Tensor, Tensor]:
        """The copy steps: ``(queries (n−1,), targets (n−1,), allowed (n−1, pos) bool)``; ``allowed[s, j]``
        is True when key j is a needle position holding step s's target."""
        needle = torch.tensor(self.needle)
        queries = torch.arange(self.copy_start, self.copy_start + self.length - 1)
        targets = needle[1:]
        allowed = torch.zeros(self.length - 1, len(self.input_ids), dtype=torch.bool)
        allowed[:, self.needle_start:self.needle_start + self.length] = targets[:, None] == needle[None, :]
        return queries, targets, allowed


@dataclass(repr=False)
class RetrievalResult(display.Shown):
    """Retrieval scores per head over a set of needles.

    Attributes:
        table: a row per selected head; ``score`` (retrieved steps / steps), ``attended`` (steps whose
            top key was the copied token / steps), ``retrieved`` (a count).
        needles: needles run.
        steps: copy steps over all needles.
        copied: steps where the model's top prediction was the needle token.
        seconds: wall time (0 for a result built by hand).
    """

    table: HeadTable
    needles: int
    steps: int
    copied: int
    seconds: float = 0.0

    @property
    def copy_accuracy(self) -> float:
        """Share of the steps the model copies right (top-1), NaN without steps."""
        return self.copied / self.steps if self.steps else float("nan")

    def top(self, k: int | None = None) -> list[tuple[int, int]]:
        """The ``k`` heads with the highest score (all with None)."""
        return self.table.top("score", k)

    def retrieval_heads(self, threshold: float = THRESHOLD) -> list[tuple[int, int]]:
        """Heads scoring above ``threshold`` (Wu et al.'s 0.1), highest first."""
        return [h for h in self.top() if self.table.value("score", *h) > threshold]

    def to_dict(self) -> dict[str, Any]:
        return {"needles": self.needles, "steps": self.steps, "copied": self.copied,
                "copy_accuracy": None if not self.steps else self.copy_accuracy, "threshold": THRESHOLD,
                "retrieval_heads": [list(h) for h in self.retrieval_heads()], "seconds": self.seconds,
                **self.table.to_dict()}

    def _parts(self) -> list[str]:
        return [display.Html(self.table.html(["score"]))]

    def _title(self) -> str:
        return f"RetrievalResult: retrieval scores of {len(self.table)} heads over {self.needles} needles"

    def _facts(self) -> list[tuple[str, object]]:
        found = self.retrieval_heads()
        named = ", ".join(f"{head_label(*h)} {display.short(self.table.value('score', *h))}" for h in found[:4])
        return [(f"retrieval heads (score > {THRESHOLD})", f"{len(found)}" + (f": {named}" if named else "")
                 + (" …" if len(found) > 4 else "")),
                ("copy accuracy", f"{display.short(self.copy_accuracy)} of {self.steps:,} steps"),
                ("time", f"{self.seconds:.2f} s")]


class RetrievalScores:
    """Counts of retrieving and attending steps per head, mergeable across needles and workers.

    A ``Mergeable[RetrievalResult]`` (``headlab.analysis.accumulator``) fed copy cases with ``add_copies``,
    not a capture consumer: its batches are the copy cases' own forwards.

    Args:
        n_heads: query heads of each layer, in layer order.
        heads: the heads to count (``headlab.heads.selection``, layers by index); None for every head.

    Attributes:
        selection: ``{layer: sorted heads}`` counted.
        retrieved, attended: ``{layer: (len(selection[layer]),)}`` step counts.

    Raises:
        TypeError / ValueError: a malformed selection, or a layer or head ``n_heads`` does not have.
    """

    def __init__(self, n_heads: Sequence[int], *, heads: HeadSelection = None) -> None:
        self.n_heads = [int(n) for n in n_heads]
        self.selection = resolve(heads, self.n_heads)
        self.retrieved = {layer: np.zeros(len(hs), dtype=np.int64) for layer, hs in self.selection.items()}
        self.attended = {layer: np.zeros(len(hs), dtype=np.int64) for layer, hs in self.selection.items()}
        self.needles = self.steps = self.copied = 0
        self.seconds = 0.0

    def add_copies(self, cases: Sequence[CopyCase], patterns: Mapping[int, Tensor], predicted: Tensor) -> None:
        """Count one batch of copies.

        Args:
            cases: the batch's copy cases, one per row, all as long as the batch.
            patterns: ``{layer: (batch, head, query_pos, key_pos)}`` for every selected layer, its head axis
                the layer's selected heads in order (every head of it without a selection).
            predicted: ``(batch, pos)`` the model's top prediction after each position.

        Raises:
            ValueError: a selected layer missing, or shapes that do not match the cases or the selection.
        """
        missing = sorted(set(self.selection) - set(patterns))
        if missing:
            raise ValueError(f"patterns of layers {missing} are missing; these scores count layers "
                             f"{sorted(self.selection)}")
        if predicted.shape[0] != len(cases):
            raise ValueError(f"predicted has {predicted.shape[0]} rows for {len(cases)} copy cases")
        for b, case in enumerate(cases):
            queries, targets, allowed = case.steps()
            ok = predicted[b, queries].cpu() == targets  # (steps,)
            for layer, hs in self.selection.items():
                pattern = patterns[layer][b]  # (head, query_pos, key_pos): the selected heads
                if pattern.shape != (len(hs), len(case.input_ids), len(case.input_ids)):
                    raise ValueError(f"layer {layer}'s pattern has shape {tuple(pattern.shape)}; this case and the "
                                     f"heads {hs} need {(len(hs), len(case.input_ids), len(case.input_ids))}")
                top = pattern[:, queries].argmax(-1).cpu()  # (head, steps): the most-attended key
                hit = allowed[torch.arange(len(queries))[None, :], top]  # (head, steps)
                self.attended[layer] += hit.sum(1).numpy()
                self.retrieved[layer] += (hit & ok[None, :]).sum(1).numpy()
            self.steps += len(queries)
            self.copied += int(ok.sum())
            self.needles += 1

    def update(self, cases: Sequence[CopyCase], patterns: Mapping[int, Tensor], predicted: Tensor) -> None:
        """Deprecated name of ``add_copies`` (``update`` means one capture batch); removed in the next release."""
        warnings.warn("RetrievalScores.update is deprecated: use RetrievalScores.add_copies (update takes one capture "
                      "batch, headlab.analysis.accumulator)", DeprecationWarning, stacklevel=2)
        self.add_copies(cases, patterns, predicted)

    def merge(self, other: RetrievalScores) -> RetrievalScores:
        """Add ``other``'s counts (same model geometry, same selection) into this one; returns self.

        Raises:
            ValueError: other layers or heads, or another selection.
        """
        if other.n_heads != self.n_heads:
            raise ValueError(f"cannot merge retrieval scores of heads {other.n_heads} into {self.n_heads}")
        if other.selection != self.selection:
            raise ValueError(f"cannot merge retrieval scores of the heads {other.selection} into scores of the heads "
                             f"{self.selection}: the selections differ")
        for mine, theirs in ((self.retrieved, other.retrieved), (self.attended, other.attended)):
            for layer in mine:
                mine[layer] += theirs[layer]
        self.needles += other.needles
        self.steps += other.steps
        self.copied += other.copied
        self.seconds += other.seconds
        return self

    def result(self) -> RetrievalResult:
        """The scores per selected head of every copy counted so far (0 for every head before any copy)."""
        heads = [(layer, h) for layer, hs in self.selection.items() for h in hs]
        retrieved = np.concatenate(list(self.retrieved.values()))
        attended = np.concatenate(list(self.attended.values()))
        steps = max(self.steps, 1)
        return RetrievalResult(HeadTable(heads, {"score": retrieved / steps, "attended": attended / steps,
                                                 "retrieved": retrieved}),
                               self.needles, self.steps, self.copied, self.seconds)


def _count(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name}={value!r}: expected an int >= {least}")
    return value


def haystack_for(tokenizer: Any, *, length: int, needle_length: int) -> int:
    """Tokens of haystack in a copy case ``length`` tokens long: what the needle, its copy and the
    beginning-of-sequence token (when the tokenizer has one) leave.

    Raises:
        ValueError: a size out of range, or a ``length`` that cannot hold the needle twice.
    """
    _count("length", length, 1)
    _count("needle_length", needle_length, 2)
    bos = int(getattr(tokenizer, "bos_token_id", None) is not None)
    if length < bos + 2 * needle_length:
        raise ValueError(f"length={length} cannot hold a needle of {needle_length} tokens and its copy"
                         f"{' after a beginning-of-sequence token' if bos else ''}: expected >= "
                         f"{bos + 2 * needle_length}")
    return length - bos - 2 * needle_length


def copy_cases(tokenizer: Any, texts: Sequence[str], *, needles: int, needle_length: int,
               haystack_length: int | None = None, length: int | None = None, seed: int = 0) -> list[CopyCase]:
    """Copy cases from a corpus: a needle span and a haystack span of its text, the needle inserted at a
    random depth, the needle repeated at the end; a beginning-of-sequence token first when the tokenizer has one.

    The corpus texts are tokenized without special tokens and joined into one stream; the needle and
    the haystack are disjoint spans of it.

    Args:
        tokenizer: a Hugging Face tokenizer.
        texts: the corpus.
        needles: cases to make, ``>= 1``.
        needle_length: tokens per needle, ``>= 2``.
        haystack_length: tokens of haystack around each needle, ``>= 0``; or
        length: tokens of each whole case (``haystack_for``): give exactly one of the two.
        seed: seeds the spans and depths.

    Returns:
        ``needles`` cases, each ``[bos] + haystack[:d] + needle + haystack[d:] + needle`` long.

    Raises:
        ValueError: a size out of range, both or neither of ``haystack_length`` and ``length``, or a
            ``length`` that cannot hold the needle twice.
        ShortCorpus: a corpus too short for one needle and one haystack (a ``ValueError``).
    """
    _count("needles", needles, 1)
    _count("needle_length", needle_length, 2)
    if (haystack_length is None) == (length is None):
        raise ValueError(f"copy cases take exactly one of haystack_length and length; got "
                         f"haystack_length={haystack_length!r}, length={length!r}")
    if length is not None:
        haystack_length = haystack_for(tokenizer, length=length, needle_length=needle_length)
    haystack_length = _count("haystack_length", haystack_length, 0)
    stream = [i for text in texts for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    if len(stream) < needle_length + haystack_length:
        raise ShortCorpus(f"the corpus has {len(stream)} tokens; a needle of {needle_length} and a haystack of "
                         f"{haystack_length} need {needle_length + haystack_length}")
    bos = [] if getattr(tokenizer, "bos_token_id", None) is None else [tokenizer.bos_token_id]
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(needles):
        # Needle and haystack cut out of one window of the stream (the needle at a random place): they never overlap.
        window = int(rng.integers(0, len(stream) - needle_length - haystack_length + 1))
        cut = int(rng.integers(0, haystack_length + 1))
        span = stream[window:window + needle_length + haystack_length]
        needle, haystack = span[cut:cut + needle_length], span[:cut] + span[cut + needle_length:]
        depth = int(rng.integers(0, haystack_length + 1))
        ids = bos + haystack[:depth] + needle + haystack[depth:] + needle
        cases.append(CopyCase(tuple(ids), len(bos) + depth, len(ids) - needle_length, needle_length))
    return cases


def retrieval_scores(model: HeadedModel | nn.Module, *, corpus: Any = None, heads: HeadSelection = None,
                     needles: int = 32, needle_length: int = 12, haystack_length: int | None = None,
                     length: int | None = None, batch_size: int = 8, seed: int = 0) -> RetrievalResult:
    """Wu et al.'s retrieval score of the selected heads of a causal language model, on copies built from a corpus.

    Only the selected heads' patterns are captured: the cost of a forward's patterns scales with the selection.

    Args:
        model: a ``HeadedModel`` of a causal language model (its output has logits) with a tokenizer.
        corpus: anything ``headlab.capture.load_corpus`` reads; None for the bundled corpus.
        heads: the heads to score (``headlab.heads.selection``); None for every head.
        needles, needle_length, seed: see ``copy_cases``.
        haystack_length, length: see ``copy_cases``: at most one; neither gives ``HAYSTACK_LENGTH`` tokens of haystack.
        batch_size: copies per forward, ``>= 1``.

    Returns:
        The scores, a row per selected head.

    Raises:
        ValueError: a bidirectional model (an encoder does not copy by generating), a model without
            logits or tokenizer, a bad selection, sizes out of range, or inputs longer than the model takes.
    """
    from headlab.capture import load_corpus, run_with_cache

    start = time.perf_counter()
    model = headed(model)
    if not model.causal:
        raise ValueError(f"retrieval scores need a causal language model; {model.source} attends both ways (an "
                         "encoder sees the whole input at once and does not copy a needle by generating it)")
    if model.tokenizer is None:
        raise ValueError(f"{model.source} has no tokenizer; copy cases are built from text")
    _count("batch_size", batch_size, 1)
    limit = model.max_length
    if limit is not None and isinstance(length, int) and length > limit:
        raise ValueError(f"length={length}: {model.source} takes at most {limit} tokens")
    selection = model.heads(heads)
    if haystack_length is None and length is None:
        haystack_length = HAYSTACK_LENGTH
    cases = copy_cases(model.tokenizer, load_corpus(corpus).texts, needles=needles, needle_length=needle_length,
                       haystack_length=haystack_length, length=length, seed=seed)
    if limit is not None and len(cases[0].input_ids) > limit:
        raise ValueError(f"a copy case is {len(cases[0].input_ids)} tokens; {model.source} takes {limit}: lower "
                         f"haystack_length={haystack_length} or needle_length={needle_length}")
    scores = RetrievalScores([site.n_heads for site in model.sites], heads=selection)
    for first in range(0, len(cases), batch_size):
        batch = cases[first:first + batch_size]
        cache = run_with_cache(model, torch.tensor([c.input_ids for c in batch]), take="pattern", heads=selection)
        logits = getattr(cache.output, "logits", None)
        if logits is None:
            raise ValueError(f"{model.source}'s output has no logits (no language-model head): the model's "
                             "prediction of the copied token cannot be read")
        patterns = {layer: torch.stack([cache["pattern", layer, h] for h in hs], 1)  # (batch, head, query, key)
                    for layer, hs in selection.items()}
        scores.add_copies(batch, patterns, logits.argmax(-1))
    scores.seconds = time.perf_counter() - start
    return scores.result()
