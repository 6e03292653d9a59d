"""Which heads find syntactic relations (Clark et al. 2019, "What Does BERT Look At?", §4.2).

Axis legend:
    pattern        (batch, head, query_pos, key_pos)   pieces, from ``CaptureBatch``
    word pattern   (batch, head, query_word, key_word) spaCy tokens and special tokens as units
    counts         (relation, head_slot)               head_slot runs over the captured
                                                       (layer, head) pairs, in ``head_slots`` order

For every dependency arc (dependent → its syntactic head, labelled with its relation) and every
head, the head's word-level attention from the dependent is reduced to its argmax over the
item's words (special tokens [CLS]/[SEP] excluded, as in Clark et al.); the head is right when
that word is the syntactic head ("dependent → head"). Separately, the head word's argmax is
checked against the dependent ("head → dependent"). The baseline, as in the paper, predicts
for each relation the head at the relation's most common fixed offset from the dependent
(best offset within ``-max_offset…max_offset`` words).

Parsing (``headlab.analysis.parses``): each corpus item is parsed whole with spaCy (items may hold
several sentences). Arcs
never cross spaCy's sentence boundaries, but the argmax runs over all words of the item, which
is slightly harder than Clark et al.'s one-sentence inputs. Root tokens (no head) and spaCy's
whitespace tokens are left out. spaCy tokens are aligned to the model's pieces with
``word_ids_from_spans``: a piece belongs to the token that holds its first character that is not
whitespace (a byte-level BPE piece "Ġcat" spans " cat"), so "don't" → spaCy "do" "n't" gets pieces
"don" | "'" "t". An item with a piece outside every spaCy token is skipped whole and counted in
``skipped["items_unaligned"]``. An arc whose dependent or head got no piece (e.g. "cannot" is one
piece but two spaCy tokens, or the item was truncated) is skipped and counted in
``skipped["arcs_without_pieces"]``; an item with no arc at all is skipped and counted in
``skipped["items_without_arcs"]``.

Relations with fewer than ``min_count`` evaluated arcs (default 20, the level at which a
best-of-72-heads accuracy stops being mostly noise on the bundled corpus) are left out of
``SyntaxResult.relations`` but stay in ``per_head``.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headlab.analysis.parses import DEFAULT_PIPELINE, Parse, parse_texts
from headlab.analysis.scratch import Scratch
from headlab.capture.batch import SOURCE, CaptureBatch
from headlab.capture.words import WordMap, batch_word_ids_from_spans, word_units
from headlab.heads import HeadTable
from headlab.models import HeadedModel

__all__ = ["RelationAccuracy", "SyntaxAccuracy", "SyntaxResult", "syntax_accuracy"]

@dataclass(frozen=True)
class RelationAccuracy:
    """The best heads for one relation and the fixed-offset baseline.

    Attributes:
        relation: the dependency label (spaCy's scheme, e.g. ``"nsubj"``, ``"pobj"``).
        count: arcs evaluated.
        dep_to_head: ``(layer, head)`` whose argmax from the dependent is most often the head.
        dep_to_head_accuracy: its accuracy.
        head_to_dep: ``(layer, head)`` whose argmax from the head word is most often the dependent.
        head_to_dep_accuracy: its accuracy.
        baseline_offset: the best fixed offset (head position − dependent position, in words).
        baseline_accuracy: how often the head sits at that offset.
    """

    relation: str
    count: int
    dep_to_head: tuple[int, int]
    dep_to_head_accuracy: float
    head_to_dep: tuple[int, int]
    head_to_dep_accuracy: float
    baseline_offset: int
    baseline_accuracy: float

    @property
    def best(self) -> tuple[str, tuple[int, int], float]:
        """``(direction, (layer, head), accuracy)`` over both directions."""
        if self.head_to_dep_accuracy > self.dep_to_head_accuracy:
            return "head_to_dep", self.head_to_dep, self.head_to_dep_accuracy
        return "dep_to_head", self.dep_to_head, self.dep_to_head_accuracy

    def to_dict(self) -> dict[str, Any]:
        direction, (layer, head), accuracy = self.best
        return {
            "relation": self.relation, "count": self.count,
            "dep_to_head_layer": self.dep_to_head[0], "dep_to_head_head": self.dep_to_head[1],
            "dep_to_head_accuracy": self.dep_to_head_accuracy,
            "head_to_dep_layer": self.head_to_dep[0], "head_to_dep_head": self.head_to_dep[1],
            "head_to_dep_accuracy": self.head_to_dep_accuracy,
            "best_direction": direction, "best_layer": layer, "best_head": head, "best_accuracy": accuracy,
            "baseline_offset": self.baseline_offset, "baseline_accuracy": self.baseline_accuracy,
        }


@dataclass
class SyntaxResult:
    """Per relation, the best heads and the baseline; per head, every relation's accuracy.

    Attributes:
        relations: relations with at least ``min_count`` arcs, most frequent first.
        head_slots: the captured ``(layer, head)`` pairs, in the accumulator's order.
        per_head: ``{relation: HeadTable}``, a row per head of ``head_slots``, columns ``dep_to_head`` and
            ``head_to_dep``: accuracies for every relation seen, however rare.
        counts: arcs evaluated per relation.
        min_count: the threshold used for ``relations``.
        items: items evaluated (at least one arc).
        arcs: arcs evaluated, over all relations.
        skipped: ``{"items_without_arcs": n, "arcs_without_pieces": n, "items_unaligned": n}``
            (an unaligned item has a piece outside every spaCy token; it is skipped whole and
            counted there only).
    """

    relations: list[RelationAccuracy]
    head_slots: list[tuple[int, int]]
    per_head: dict[str, HeadTable]
    counts: dict[str, int]
    min_count: int
    items: int
    arcs: int
    skipped: dict[str, int] = field(default_factory=dict)

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per reported relation (the columns of ``relations.csv``)."""
        return [r.to_dict() for r in self.relations]

    def to_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write ``rows()`` to ``path`` (conventionally ``relations.csv``); returns the path."""
        path = Path(path)
        columns = list(RelationAccuracy("", 0, (0, 0), 0.0, (0, 0), 0.0, 0, 0.0).to_dict())
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows(self.rows())
        return path

    def to_dict(self) -> dict[str, Any]:
        return {
            "relations": self.rows(), "head_slots": [list(s) for s in self.head_slots], "counts": dict(self.counts),
            "min_count": self.min_count, "items": self.items, "arcs": self.arcs, "skipped": dict(self.skipped),
        }


class SyntaxAccuracy:
    """Counts, per relation and captured head, how often the head's argmax finds the arc.

    Args:
        parses: ``{corpus index: Parse}`` (or a sequence indexed by corpus index) for the
            items the batches will carry; None parses each batch's ``texts`` when it arrives.
        pipeline: the spaCy pipeline used when ``parses`` is None.
        max_offset: the baseline's offsets run over ``-max_offset…max_offset`` (0 excluded).
    """

    def __init__(
        self, parses: Mapping[int, Parse] | Sequence[Parse] | None = None, *,
        pipeline: str = DEFAULT_PIPELINE, max_offset: int = 10,
    ) -> None:
        if max_offset < 1:
            raise ValueError(f"max_offset must be at least 1; got {max_offset}")
        self.parses = parses
        self.pipeline = pipeline
        self.max_offset = max_offset
        self.head_slots: list[tuple[int, int]] = []
        self.labels: list[str] = []  # relations in the order of the rows below
        self._rows: dict[str, int] = {}  # relation → its row
        self.dep_to_head = torch.zeros(0, 0, dtype=torch.int64)  # (relation, head_slot) correct
        self.head_to_dep = torch.zeros(0, 0, dtype=torch.int64)
        self.counts = torch.zeros(0, dtype=torch.int64)  # (relation,) arcs evaluated
        self.offsets: dict[str, Counter[int]] = {}  # relation → head − dependent → arcs
        self.items = 0
        self.skipped: Counter[str] = Counter({"items_without_arcs": 0, "arcs_without_pieces": 0, "items_unaligned": 0})
        self._scratch = Scratch()

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch; every captured layer must carry patterns. A batch of pairs gives its encoder's layers
        alone (``CaptureBatch.view``): the parses are the sources', and a relation holds within one text."""
        view = batch.view(SOURCE, SOURCE)
        if view is None or not view.layers:
            return
        batch = view
        slots = [(layer, h) for layer, taken in sorted(batch.layers.items()) for h in taken.heads]
        self._check_slots(slots)
        parses = self._parses(batch)
        # items without a word keep -1 everywhere; an item with a piece outside every spaCy token is skipped whole
        rows = [row for row, parse in enumerate(parses) if parse.spans]
        word_ids = torch.full_like(batch.word_ids, -1)
        aligned = [True] * len(parses)
        if rows:
            index = torch.tensor(rows, device=batch.offsets.device)
            found, orphans = batch_word_ids_from_spans(
                batch.offsets[index], batch.lengths[index].tolist(), [parses[row].spans for row in rows],
                special_tokens_mask=batch.special_tokens_mask[index], texts=[batch.texts[row] for row in rows])
            for row, lost in zip(rows, orphans):
                aligned[row] = not lost
            self.skipped["items_unaligned"] += aligned.count(False)
            kept = [i for i, row in enumerate(rows) if aligned[row]]
            word_ids[index[kept]] = found[kept].to(word_ids.device)
        # a token with no piece must not become a unit: word_units numbers units by position
        units, _ = word_units(word_ids, batch.attention_mask)
        predicted = torch.zeros(len(batch), len(slots), int(units.max()) + 1, dtype=torch.long)  # (batch, slot, unit)
        for items, pos in batch.length_groups():  # each run of items as its own shorter block
            best = self._best_keys(batch, units[items, :pos], word_ids[items, :pos], items)
            predicted[items, :, : best.shape[-1]] = best
        self._add_arcs(parses, aligned, predicted, units.cpu(), word_ids.cpu())

    def _best_keys(self, batch: CaptureBatch, units: Tensor, word_ids: Tensor, items: slice) -> Tensor:
        """``(items, head_slot, unit)``: every captured head's heaviest word unit from each query unit, for the
        batch's ``items`` (``units``/``word_ids`` cut to their longest item)."""
        pos = units.shape[1]
        words = WordMap(units)  # once per run of items, applied to every layer
        is_word = torch.zeros(len(units), words.n_units, dtype=torch.bool, device=units.device)
        real_word = (units >= 0) & (word_ids >= 0)
        is_word[real_word.nonzero()[:, 0], units[real_word]] = True  # special tokens stay False
        predictions = []  # per layer (items, head, query_unit)
        for layer, taken in sorted(batch.layers.items()):
            if taken.pattern is None:
                raise ValueError(f"layer {layer} was captured without patterns; capture with take=('pattern',)")
            pattern = taken.pattern[items, :, :pos, :pos].float()

            def workspace(shape: tuple[int, ...], like: Tensor = pattern) -> Tensor:
                return self._scratch.take(shape, dtype=like.dtype, device=like.device)

            predictions.append(words.best_keys(pattern, keys=is_word, workspace=workspace))
        return torch.cat(predictions, dim=1).cpu()

    def merge(self, other: SyntaxAccuracy) -> SyntaxAccuracy:
        """Fold another accumulator's counts into this one; returns self."""
        if not other.head_slots:
            return self
        self._check_slots(other.head_slots)
        rows = torch.tensor([self._label(label) for label in other.labels], dtype=torch.long)
        # Added out of place: counts made inside capture's inference mode cannot be changed in place outside it.
        self.dep_to_head = self.dep_to_head.index_add(0, rows, other.dep_to_head)
        self.head_to_dep = self.head_to_dep.index_add(0, rows, other.head_to_dep)
        self.counts = self.counts.index_add(0, rows, other.counts)
        for label in other.labels:
            self.offsets.setdefault(label, Counter()).update(other.offsets.get(label, Counter()))
        self.items += other.items
        self.skipped.update(other.skipped)
        return self

    def result(self, *, min_count: int = 20) -> SyntaxResult:
        """Best heads and baseline per relation with at least ``min_count`` arcs.

        Raises:
            ValueError: no arc was evaluated (nothing parseable, or no batch seen).
        """
        if int(self.counts.sum()) == 0:
            raise ValueError(f"no dependency arc was evaluated: {self._skips()}")
        per_head, relations = {}, []
        order = sorted(range(len(self.labels)), key=lambda i: (-int(self.counts[i]), self.labels[i]))
        for i in order:
            label, count = self.labels[i], int(self.counts[i])
            if count == 0:
                continue
            d2h = (self.dep_to_head[i].double() / count).numpy()
            h2d = (self.head_to_dep[i].double() / count).numpy()
            per_head[label] = HeadTable(self.head_slots, {"dep_to_head": d2h, "head_to_dep": h2d})
            if count < min_count:
                continue
            offset, hits = _best_offset(self.offsets[label], self.max_offset)
            relations.append(RelationAccuracy(
                relation=label, count=count,
                dep_to_head=self.head_slots[int(d2h.argmax())], dep_to_head_accuracy=float(d2h.max()),
                head_to_dep=self.head_slots[int(h2d.argmax())], head_to_dep_accuracy=float(h2d.max()),
                baseline_offset=offset, baseline_accuracy=hits / count,
            ))
        return SyntaxResult(
            relations=relations, head_slots=list(self.head_slots), per_head=per_head,
            counts={label: int(self.counts[i]) for i, label in enumerate(self.labels)}, min_count=min_count,
            items=self.items, arcs=int(self.counts.sum()), skipped=dict(self.skipped),
        )

    def _skips(self) -> str:
        """What was left out, in words (for the error when nothing was evaluated)."""
        what = {
            "items_unaligned": "items whose pieces do not line up with spaCy's words (a piece outside every word)",
            "items_without_arcs": "items without an arc that has a piece at both ends",
            "arcs_without_pieces": "arcs with a word that got no piece of its own (merged with another word, or "
                                   "cut by truncation)",
        }
        said = [f"{text}: {self.skipped[key]}" for key, text in what.items() if self.skipped[key]]
        return "; ".join(said) if said else "no batch with a parsed item was seen"

    def _parses(self, batch: CaptureBatch) -> list[Parse]:
        if self.parses is None:
            return parse_texts(batch.texts, pipeline=self.pipeline)
        missing = [int(i) for i in batch.corpus_indices if int(i) not in _keys(self.parses)]
        if missing:
            raise KeyError(f"no parse for corpus indices {missing[:10]}; parse the same corpus the capture runs")
        return [self.parses[int(i)] for i in batch.corpus_indices]

    def _add_arcs(self, parses: Sequence[Parse], aligned: Sequence[bool], predicted: Tensor, units: Tensor,
                  word_ids: Tensor) -> None:
        """Score the arcs of a batch's aligned items: ``predicted`` (batch, head_slot, unit) is each head's
        argmax unit; ``units``/``word_ids`` (batch, pos) on the CPU. Every arc of the batch at once: an arc
        is scored where both its words have a piece, each word by the unit of its first piece."""
        rows = [row for row, ok in enumerate(aligned) if ok]
        if not rows:
            return
        sizes = [len(parses[row].heads) for row in rows]
        width = max(max(sizes), int(word_ids.max()) + 1)
        # each spaCy token's unit, -1 for a token without a piece: units grow with position, so the least unit of
        # a token's pieces is its first piece's (pieces of no token land in the spare last column)
        unit_of = torch.full((len(parses), width + 1), torch.iinfo(torch.int64).max)
        unit_of.scatter_reduce_(1, torch.where(word_ids >= 0, word_ids, width), units, "amin")
        unit_of = unit_of.masked_fill_(unit_of == torch.iinfo(torch.int64).max, -1)[:, :width]
        row = torch.repeat_interleave(torch.tensor(rows), torch.tensor(sizes))  # one entry per token
        dep = torch.cat([torch.arange(n) for n in sizes])
        head = torch.tensor([h for r in rows for h in parses[r].heads], dtype=torch.int64)
        arc = head != dep  # roots point to themselves
        dep_unit, head_unit = unit_of[row, dep], unit_of[row, head]
        kept = arc & (dep_unit >= 0) & (head_unit >= 0)
        self.skipped["arcs_without_pieces"] += int(arc.sum()) - int(kept.sum())
        with_arcs = torch.bincount(row[kept], minlength=len(parses))[rows] > 0
        self.skipped["items_without_arcs"] += int((~with_arcs).sum())
        self.items += int(with_arcs.sum())
        index = kept.nonzero()[:, 0]
        if not len(index):
            return
        relations = [r for i in rows for r in parses[i].labels]
        relations = [relations[i] for i in index.tolist()]
        ids = {r: self._label(r) for r in dict.fromkeys(relations)}  # new relations in order of first arc
        label = torch.tensor([ids[r] for r in relations])
        row, dep, head, dep_unit, head_unit = row[index], dep[index], head[index], dep_unit[index], head_unit[index]
        self.dep_to_head.index_add_(0, label, (predicted[row, :, dep_unit] == head_unit[:, None]).long())
        self.head_to_dep.index_add_(0, label, (predicted[row, :, head_unit] == dep_unit[:, None]).long())
        self.counts.index_add_(0, label, torch.ones_like(label))
        # each relation's head − dependent offsets (in spaCy tokens), counted per distinct (relation, offset)
        span = 2 * width - 1  # offsets run over −(width − 1) … width − 1
        keys, hits = torch.unique(label * span + (head - dep + width - 1), return_counts=True)
        for key, n in zip(keys.tolist(), hits.tolist()):
            self.offsets[self.labels[key // span]][key % span - width + 1] += n

    def _label(self, label: str) -> int:
        if label not in self.offsets:
            self.offsets[label] = Counter()
        if label in self._rows:
            return self._rows[label]
        self._rows[label] = len(self.labels)
        self.labels.append(label)
        grow = torch.zeros(1, len(self.head_slots), dtype=torch.int64)
        self.dep_to_head = torch.cat([self.dep_to_head, grow])
        self.head_to_dep = torch.cat([self.head_to_dep, grow])
        self.counts = torch.cat([self.counts, torch.zeros(1, dtype=torch.int64)])
        return len(self.labels) - 1

    def _check_slots(self, slots: Sequence[tuple[int, int]]) -> None:
        if not self.head_slots:
            self.head_slots = list(slots)
            self.dep_to_head = torch.zeros(len(self.labels), len(slots), dtype=torch.int64)
            self.head_to_dep = torch.zeros(len(self.labels), len(slots), dtype=torch.int64)
        elif list(slots) != self.head_slots:
            raise ValueError(f"captured heads {list(slots)[:6]}… differ from the accumulated {self.head_slots[:6]}…")


def _keys(parses: Mapping[int, Parse] | Sequence[Parse]) -> Any:
    return parses.keys() if isinstance(parses, Mapping) else range(len(parses))


def _best_offset(offsets: Counter[int], max_offset: int) -> tuple[int, int]:
    """``(offset, arcs at it)``: the most common nonzero offset within ±max_offset (ties: nearest, then left)."""
    candidates = [(n, o) for o, n in offsets.items() if 0 < abs(o) <= max_offset]
    if not candidates:
        return 0, 0
    n, o = max(candidates, key=lambda c: (c[0], -abs(c[1]), -c[1]))
    return o, n


def syntax_accuracy(
    model: HeadedModel | nn.Module, corpus: Any = None, *, pipeline: str = DEFAULT_PIPELINE, min_count: int = 20,
    max_offset: int = 10, **capture_options: Any,
) -> SyntaxResult:
    """Parse ``corpus`` with spaCy, capture every head's patterns and score them on the parses.

    Args:
        model: a ``HeadedModel`` with a tokenizer (or an attached model whose handle has one).
        corpus: as ``capture`` takes it; None for the bundled corpus.
        pipeline: an installed spaCy pipeline with a parser.
        min_count: relations with fewer arcs are left out of ``relations``.
        max_offset: the baseline's offset range.
        capture_options: passed to ``capture`` (layers, heads, batch_tokens, progress, ...).

    Returns:
        The ``SyntaxResult``.

    Raises:
        ImportError: spaCy or the pipeline is missing.
        ValueError: no arc could be evaluated.
    """
    from headlab.capture.corpus import load_corpus
    from headlab.capture.run import capture

    corpus = load_corpus(corpus)
    accumulator = SyntaxAccuracy(parse_texts(corpus.texts, pipeline=pipeline), max_offset=max_offset)
    capture(model, corpus=corpus, take=("pattern",), consumers=[accumulator], **capture_options)
    return accumulator.result(min_count=min_count)
