"""The accumulator protocol: every accumulator of headlab follows it (methods, signatures, typed result),
``update`` takes one capture batch everywhere, and the merged accumulators of two halves of a corpus give
the result of one pass over the whole."""

from __future__ import annotations

import importlib
import inspect
import json
import math
import pkgutil
import typing

import numpy as np
import pytest
import torch

import headlab.analysis
import headlab.capture
from headlab.analysis import (
    Accumulator,
    AnalysisAccumulators,
    AudioStats,
    HeadSimilarity,
    Mergeable,
    PassAccumulators,
    PatchStats,
    RetrievalResult,
    RetrievalScores,
    SimilarityResult,
    SinkResult,
    SinkShare,
    StreamingChanges,
    StreamingStats,
    SurfaceStats,
    SyntaxAccuracy,
    SyntaxResult,
    TaxonomyStats,
    ValueWeighted,
)
from headlab.analysis.norms import out_projections
from headlab.analysis.per_head import HeadSums, PerHeadMeans
from headlab.analysis.retrieval import CopyCase
from headlab.capture import CaptureBatch, MeanZ, capture
from headlab.heads import HeadTable
from tests.support.minilm import minilm
from tests.support.text import ENGLISH

# class → the type its result() returns
ACCUMULATORS = {SurfaceStats: HeadTable, TaxonomyStats: HeadTable, HeadSimilarity: SimilarityResult,
                ValueWeighted: HeadTable, SinkShare: SinkResult, SyntaxAccuracy: SyntaxResult,
                MeanZ: dict[int, torch.Tensor], PatchStats: HeadTable, AudioStats: HeadTable}
MERGEABLE = {RetrievalScores: RetrievalResult, StreamingStats: StreamingChanges}  # fed other things than batches
BASES = {HeadSums, PerHeadMeans}  # shared state of the per-head accumulators, not used alone
STRUCTURES = {PassAccumulators}  # accumulators held by name
PROTOCOLS = {Accumulator, Mergeable}

TEXTS = ENGLISH


def _classes_with(method: str) -> set[type]:
    """Every class defined in headlab.analysis and headlab.capture that has ``method``."""
    found = set()
    for package in (headlab.analysis, headlab.capture):
        for info in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == module.__name__ and callable(getattr(cls, method, None)):
                    found.add(cls)
    return found


def test_every_class_that_merges_is_a_known_accumulator():
    # A new accumulator must be added here, and so checked against the protocol below.
    assert _classes_with("merge") == set(ACCUMULATORS) | set(MERGEABLE) | BASES | STRUCTURES | PROTOCOLS


@pytest.mark.parametrize("cls", list(ACCUMULATORS), ids=lambda c: c.__name__)
def test_each_accumulator_follows_the_protocol_and_types_its_result(cls):
    hints = typing.get_type_hints(cls.update)
    assert list(inspect.signature(cls.update).parameters) == ["self", "batch"] and hints["batch"] is CaptureBatch
    merge = inspect.signature(cls.merge).parameters
    assert list(merge) == ["self", "other"]
    result = inspect.signature(cls.result).parameters
    assert all(p.default is not p.empty for name, p in result.items() if name != "self")  # result() needs nothing
    assert typing.get_type_hints(cls.result)["return"] == ACCUMULATORS[cls]
    assert issubclass(cls, Accumulator) and issubclass(cls, Mergeable)


@pytest.mark.parametrize("cls", list(MERGEABLE), ids=lambda c: c.__name__)
def test_tallies_fed_other_things_merge_and_type_their_result_but_take_no_capture_batch(cls):
    assert list(inspect.signature(cls.merge).parameters) == ["self", "other"]
    assert typing.get_type_hints(cls.result)["return"] is MERGEABLE[cls]
    assert issubclass(cls, Mergeable)
    assert "Deprecated" in cls.update.__doc__  # for one release, an alias of its own verb (add_copies, measure)


def test_the_old_names_warn_and_give_what_the_new_ones_give():
    case = CopyCase(input_ids=(5, 1, 2, 3, 9, 1, 2, 3), needle_start=1, copy_start=5, length=3)
    patterns = {0: torch.zeros(1, 2, 8, 8)}
    patterns[0][0, 0, 5, 2] = patterns[0][0, 0, 6, 3] = 1.0  # head 0 looks at the token being copied
    predicted = torch.tensor([[0, 0, 0, 0, 0, 2, 3, 0]])
    new, old = RetrievalScores([2]), RetrievalScores([2])
    new.add_copies([case], patterns, predicted)
    with pytest.warns(DeprecationWarning, match="use RetrievalScores.add_copies"):
        old.update([case], patterns, predicted)
    assert old.result().to_dict() == new.result().to_dict() and new.result().table["retrieved"].tolist() == [2, 0]

    stats = object.__new__(StreamingStats)  # the aliases only hand over: no model needed to check them
    seen = []
    stats.measure, stats.result = seen.append, lambda: "the result"
    with pytest.warns(DeprecationWarning, match="use StreamingStats.measure"):
        stats.update({"input_ids": None})
    with pytest.warns(DeprecationWarning, match="use StreamingStats.result"):
        assert stats.changes() == "the result"
    assert seen == [{"input_ids": None}]


# ---- two halves merged = one pass, for every capture accumulator and for analyze's named structure


def _parses(texts):
    try:
        from headlab.analysis.parses import load_pipeline, parse_texts

        load_pipeline()
        return parse_texts(texts)
    except (ImportError, OSError):
        return None


class _Halves:
    """Hands every batch to ``whole``, and the first ``cut`` batches to ``first``, the rest to ``second``
    (whose similarity sample starts where the first half's ended, as a shard's does)."""

    def __init__(self, whole, first, second, cut):
        self.parts, self.cut, self.seen = (whole, first, second), cut, 0

    def update(self, batch):
        whole, first, second = self.parts
        for part in whole:
            part.update(batch)
        half = first if self.seen < self.cut else second
        if self.seen == self.cut:
            second[0].batches_seen = first[0].batches_seen
        for part in half:
            part.update(batch)
        self.seen += 1


def _plain(value):
    """A result as plain numbers (``to_dict()``, tensors as lists), for comparing two of them."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "to_dict"):
        return _plain(value.to_dict())
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.tolist()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _close(ours, theirs, where=""):
    if isinstance(ours, dict):
        assert list(ours) == list(theirs), where
        for key in ours:
            _close(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _close(a, b, f"{where}[{i}]")
    elif isinstance(ours, float) and isinstance(theirs, float):
        assert (math.isnan(ours) and math.isnan(theirs)) or ours == pytest.approx(theirs, rel=1e-12, abs=1e-12), where
    else:
        assert ours == theirs, where


def test_two_halves_merged_give_one_pass_for_every_accumulator():
    model = minilm()
    parses = _parses(TEXTS)
    factory = AnalysisAccumulators(causal=False, parses=parses, row_fraction=0.5, W_O=out_projections(model))

    def made():  # analyze's pass, then MeanZ (similarity first: _Halves sets its sample's start)
        parts = factory()
        return [parts.similarity, *(p for p in parts if p is not parts.similarity), MeanZ()], parts

    (whole, _), (first, first_pass), (second, second_pass) = made(), made(), made()
    n_batches = capture(model, corpus=TEXTS, take=("pattern",), max_batch_size=2, progress=False).batches
    capture(model, corpus=TEXTS, take=("pattern", "v", "z"), consumers=[_Halves(whole, first, second, n_batches // 2)],
            max_batch_size=2, progress=False)
    assert n_batches >= 4 and second[0].batches_seen == whole[0].batches_seen

    assert first_pass.merge(second_pass) is first_pass  # the named structure merges field by field
    assert first[-1].merge(second[-1]) is first[-1]  # MeanZ
    kinds = {type(p) for p in first}
    # PatchStats reads images and AudioStats recordings, not this text pass: tests/analysis/test_patches.py and
    # test_frames.py merge their halves
    assert kinds == set(ACCUMULATORS) - {PatchStats, AudioStats} - ({SyntaxAccuracy} if parses is None else set())
    for merged, single in zip(first, whole):
        if isinstance(merged, SyntaxAccuracy):
            a, b = merged.result(min_count=1), single.result(min_count=1)
        else:
            a, b = merged.result(), single.result()
        _close(json.loads(json.dumps(_plain(a))), json.loads(json.dumps(_plain(b))), type(merged).__name__)


def test_a_pass_refuses_to_merge_one_of_other_parts():
    W_O = {0: torch.randn(2, 3, 6)}
    with pytest.raises(ValueError, match="cannot merge a pass of surface, taxonomy, similarity into one of surface, "
                                         "taxonomy, similarity, value_weighted, sinks"):
        AnalysisAccumulators(causal=False, W_O=W_O)().merge(AnalysisAccumulators(causal=False)())
