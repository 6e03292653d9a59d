"""What every metric over a corpus is: an accumulator, ``update(batch)`` / ``merge(other)`` / ``result()``.

    Mergeable[R]     merge(other) -> self, result() -> R: sums that add, across batches, shards or processes
    Accumulator[R]   a Mergeable fed capture batches: update(batch: CaptureBatch) -> None

``update`` means one thing everywhere: add one ``headlab.capture.CaptureBatch`` (what ``capture`` hands
its consumers). Tallies fed something else (``RetrievalScores`` counts copy cases, ``StreamingStats``
runs its own forwards) are ``Mergeable`` with a verb of their own (``add_copies``, ``measure``), so
that nothing passes for a capture consumer that is not one.

``merge`` folds another accumulator of the same type and settings into this one and returns it
(``self``); the merged accumulators of the two halves of a corpus give the result of one pass over
the whole (float64 sums: up to rounding). ``result`` reads the sums without changing them; an
accumulator that saw no batch raises ``ValueError`` there.

The accumulators of ``headlab analyze``'s capture pass: ``SurfaceStats`` (``HeadTable``),
``TaxonomyStats`` (``HeadTable``), ``HeadSimilarity`` (``SimilarityResult``), ``ValueWeighted``
(``HeadTable``), ``SinkShare`` (``SinkResult``), ``SyntaxAccuracy`` (``SyntaxResult``), held by name in
``headlab.analysis.capture_pass.PassAccumulators``; ``headlab.capture.MeanZ`` (``{layer: mean z}``)
is one too. Both protocols are structural (``runtime_checkable``: ``isinstance`` checks the methods
are there, not their signatures; tests/analysis/test_accumulator.py checks those).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    from typing_extensions import Self

    from headlab.capture.batch import CaptureBatch

__all__ = ["Accumulator", "Mergeable"]

R_co = TypeVar("R_co", covariant=True)


@runtime_checkable
class Mergeable(Protocol[R_co]):
    """Sums that merge by adding and read out as a result of type ``R_co``."""

    def merge(self, other: Self) -> Self:
        """Fold ``other`` (same type and settings) into this one; returns self.

        Raises:
            ValueError: another type, other settings or other heads.
        """
        ...

    def result(self) -> R_co:
        """The result of every batch added or merged so far.

        Raises:
            ValueError: nothing was added.
        """
        ...


@runtime_checkable
class Accumulator(Mergeable[R_co], Protocol[R_co]):
    """A ``Mergeable`` fed the batches of ``headlab.capture.capture`` (a capture consumer)."""

    def update(self, batch: CaptureBatch) -> None:
        """Add one capture batch (its layers carry what the accumulator reads: patterns, v, ...)."""
        ...
