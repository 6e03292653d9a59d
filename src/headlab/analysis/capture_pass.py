"""The accumulators of ``analyze``'s capture pass, by name, and the factory both engines make them with.

    AnalysisAccumulators(*, causal, parses=None, row_fraction=..., W_O=None)   the factory (pickles)
        (shard=None) -> PassAccumulators
    PassAccumulators(surface, taxonomy, similarity, value_weighted=None, sinks=None, syntax=None)

One capture pass (patterns, and v for value-weighted attention and the sink share) feeds every
accumulator of ``PassAccumulators`` at once. The local engine makes them once for the whole corpus and
hands ``capture`` its accumulators (``list(parts)``: the present ones, in field order); the Ray engine
(``headlab.capture.distributed``) calls the factory on each worker per shard, and the driver merges
the shards' ``PassAccumulators`` field by field (``merge``). Fields are named, never unpacked by
position: a part that is not made (no W_O, no parses) is None.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from headlab.analysis.norms import ValueProjections, ValueWeighted
from headlab.analysis.similarity import HeadSimilarity
from headlab.analysis.sinks import CAUSAL_SINK_TOKENS, ENCODER_SINK_TOKENS, SinkShare
from headlab.analysis.surface import SurfaceStats
from headlab.analysis.taxonomy import TaxonomyStats

if TYPE_CHECKING:
    from headlab.analysis.accumulator import Accumulator
    from headlab.analysis.syntax import SyntaxAccuracy
    from headlab.capture import Shard

__all__ = ["SIMILARITY_ROW_FRACTION", "AnalysisAccumulators", "PassAccumulators"]

SIMILARITY_ROW_FRACTION = 0.02  # similarity reads this share of each batch's real query rows


@dataclass(frozen=True, eq=False)
class PassAccumulators:
    """The accumulators of one capture pass, by name; None where a part is not made.

    Iterating gives the accumulators that are there, in field order (what ``capture`` is handed as
    its consumers); ``merge`` folds another pass's accumulators into these, field by field.

    Attributes:
        surface: ``SurfaceStats``.
        taxonomy: ``TaxonomyStats``, or None (patterns in row blocks, which it cannot read).
        similarity: ``HeadSimilarity``.
        value_weighted: ``ValueWeighted`` (with W_O), else None.
        sinks: ``SinkShare`` (with W_O), else None.
        syntax: ``SyntaxAccuracy`` (with parses), else None.
    """

    surface: SurfaceStats
    taxonomy: TaxonomyStats | None
    similarity: HeadSimilarity
    value_weighted: ValueWeighted | None = None
    sinks: SinkShare | None = None
    syntax: SyntaxAccuracy | None = None
    _present: tuple[Accumulator[Any], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Made once: capture iterates the parts on every batch.
        parts = tuple(getattr(self, f.name) for f in fields(self) if f.init and getattr(self, f.name) is not None)
        object.__setattr__(self, "_present", parts)

    def __iter__(self) -> Iterator[Accumulator[Any]]:
        return iter(self._present)

    def __len__(self) -> int:
        return len(self._present)

    def names(self) -> list[str]:
        """The names of the parts that are there, in field order (``surface``, ``taxonomy``, ...)."""
        return [f.name for f in fields(self) if f.init and getattr(self, f.name) is not None]

    def merge(self, other: PassAccumulators) -> PassAccumulators:
        """Fold ``other``'s accumulators into these, field by field; returns self.

        Raises:
            ValueError: ``other`` has other parts, or a part refuses to merge (other settings or heads).
        """
        if other.names() != self.names():
            raise ValueError(f"cannot merge a pass of {', '.join(other.names())} into one of {', '.join(self.names())}")
        for mine, theirs in zip(self._present, other._present):
            mine.merge(theirs)
        return self


class AnalysisAccumulators:
    """The factory of ``analyze``'s capture pass: fresh ``PassAccumulators`` for the whole corpus or one shard.

    One definition for both engines: the local engine calls it once with no shard, the Ray engine
    once per shard on the workers (so it pickles: plain data and tensors, no model, no spaCy pipeline).

    Args:
        causal: the model's attention is causal (``headlab.analysis.surface.is_causal``).
        parses: syntax's parse of every corpus item, in corpus order, made on the driver (spaCy never
            runs on a worker), or None for no syntax accumulator.
        row_fraction: similarity's sample, a share of each batch's real query rows (``HeadSimilarity``).
        W_O: ``{layer: (n_heads, d_head_v, d_model)}`` (``headlab.analysis.norms.out_projections``) to add
            value-weighted attention and the sink share by position; None: neither. Kept (and shipped
            to Ray workers) as their ``ValueProjections``: the same norms, d_head_v wide, shared by both.
        blocks: the patterns will come in row blocks (``headlab.capture.blocks``): the parts that need whole
            patterns (the taxonomy; syntax, whose parses are then refused) are not made.

    Attributes:
        take: what the capture pass must take for these accumulators: ``("pattern", "v")`` with W_O,
            else ``("pattern",)``.

    Calling it:
        ``accumulators(shard=None)`` → ``PassAccumulators``: surface and similarity always, the taxonomy but in
        row blocks, value_weighted and sinks with W_O, syntax with parses. For a ``Shard`` the similarity sample
        starts at the shard's first batch (the rows one process draws for those batches) and syntax
        holds the shard's parses under the shard's local corpus indices.
    """

    def __init__(self, *, causal: bool, parses: list[Any] | None = None,
                 row_fraction: float | None = SIMILARITY_ROW_FRACTION,
                 W_O: dict[int, Any] | None = None, blocks: bool = False) -> None:
        if blocks and parses is not None:
            raise ValueError("syntax needs whole patterns, and blocks=True hands them in row blocks: pass parses=None")
        self.causal, self.parses, self.row_fraction, self.blocks = causal, parses, row_fraction, blocks
        self.projections = None if W_O is None else ValueProjections(W_O)  # d_model / d_head_v times smaller
        self.take = ("pattern",) if W_O is None else ("pattern", "v")

    def __call__(self, shard: Shard | None = None) -> PassAccumulators:
        similarity = HeadSimilarity(row_fraction=self.row_fraction)
        if shard is not None:
            similarity.batches_seen = shard.first_batch
        weighted = sinks = syntax = None
        if self.projections is not None:
            n_sink = CAUSAL_SINK_TOKENS if self.causal else ENCODER_SINK_TOKENS
            weighted, sinks = ValueWeighted(self.projections), SinkShare(n_sink=n_sink, W_O=self.projections)
        if self.parses is not None:
            from headlab.analysis.syntax import SyntaxAccuracy

            syntax = SyntaxAccuracy(self.parses if shard is None else [self.parses[i] for i in shard.items])
        taxonomy = None if self.blocks else TaxonomyStats(causal=self.causal)
        return PassAccumulators(surface=SurfaceStats(causal=self.causal), taxonomy=taxonomy,
                                similarity=similarity, value_weighted=weighted, sinks=sinks, syntax=syntax)
