"""The per-head tables that ``headlab analyze`` prints and the report shows, each defined once.

A table is defined by one function from results to a ``DisplayTable``: its title, its columns
(header, and whether the column is numeric: right-aligned), which rows it shows and how every cell
is written. Two renderers draw any of them: ``to_rich`` for the terminal (a ``rich.table.Table``),
``to_html`` for the report (``headlab.report.html.table``: the title becomes the caption). Both
escape every cell and the title, so token text and relation labels can never become markup.

    roles_table(roles)                  heads by role
    classes_table(shares)               share of heads in each pattern class
    relations_table(syntax)             dependency relations: the best head against the best fixed offset
    sinks_table(value_weighted, sinks)  raw vs value-weighted attention on the sink tokens, top heads
    patches_table(surface)              an image model's heads by distance attended on the patch grid, nearest first
    retrieval_table(retrieval)          retrieval heads by score, top heads
    streaming_table(streaming)          streaming-head conversions per window

Heads are written ``L1 H2`` (``headlab.heads.head_label``), never as a number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headlab.report.html import Html, table

if TYPE_CHECKING:
    from rich.table import Table

    from headlab.analysis.retrieval import RetrievalResult
    from headlab.analysis.sinks import SinkResult
    from headlab.analysis.streaming import StreamingResult
    from headlab.analysis.syntax import SyntaxResult
    from headlab.heads import HeadTable

__all__ = ["TOP_HEADS", "Column", "DisplayTable", "classes_table", "patches_table", "relations_table",
           "retrieval_table", "roles_table", "share", "sinks_table", "streaming_table", "to_html", "to_rich"]

TOP_HEADS = 8  # rows of the tables that rank heads (sinks, retrieval)
MISSING = "–"  # a cell whose head has no value in that result


@dataclass(frozen=True)
class Column:
    """A column: its header, and whether its cells are numbers (right-aligned, tabular figures)."""

    header: str
    numeric: bool = False


@dataclass(frozen=True)
class DisplayTable:
    """A table as both renderers draw it.

    Attributes:
        title: what the table shows, in a sentence or two (the terminal's title, the report's caption).
        columns: the columns, in order.
        rows: the cells of each row, already written as text, one per column.

    Raises:
        ValueError: a row with another number of cells than there are columns.
    """

    title: str
    columns: tuple[Column, ...]
    rows: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(f"row {i} has {len(row)} cells, expected {len(self.columns)} "
                                 f"(columns {[c.header for c in self.columns]})")

    @property
    def headers(self) -> list[str]:
        return [column.header for column in self.columns]


def to_rich(shown: DisplayTable) -> Table:
    """The terminal's table (rich): numeric columns right-aligned, every text escaped from rich markup."""
    from rich.markup import escape
    from rich.table import Table

    out = Table(title=escape(shown.title))
    for column in shown.columns:
        out.add_column(escape(column.header), justify="right" if column.numeric else "left")
    for row in shown.rows:
        out.add_row(*(escape(cell) for cell in row))
    return out


def to_html(shown: DisplayTable) -> Html:
    """The report's table (``headlab.report.html.table``): the title as its caption, every text escaped."""
    return table(shown.headers, shown.rows, numeric_cols=[i for i, c in enumerate(shown.columns) if c.numeric],
                 caption=shown.title)


def share(x: float) -> str:
    """A share as a percentage: one decimal below 10% (``3.5%``), none above (``42%``)."""
    return f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def roles_table(roles: Mapping[tuple[int, int], tuple[str, ...]]) -> DisplayTable:
    """Each role and the heads that have it (``AnalysisResult.roles``), roles and heads in order."""
    from headlab.heads import head_label

    by_role: dict[str, list[str]] = {}
    for (layer, head), labels in sorted(roles.items()):
        for label in labels:
            by_role.setdefault(label, []).append(head_label(layer, head))
    return DisplayTable("Heads by role (thresholds: docs/analysis.md; L = layer, H = head, from 0)",
                        (Column("role"), Column("heads")),
                        tuple((label, ", ".join(members)) for label, members in sorted(by_role.items())))


def classes_table(shares: Mapping[str, float]) -> DisplayTable:
    """One row: the share of heads in each pattern class (``AnalysisResult.summary()["class_shares"]``)."""
    return DisplayTable("Pattern classes (share of heads)", tuple(Column(name, numeric=True) for name in shares),
                        (tuple(f"{value:.0%}" for value in shares.values()),))


def relations_table(syntax: SyntaxResult) -> DisplayTable:
    """The ``TABLE_RELATIONS`` most frequent dependency relations (those ``analyze``'s headline may name): the
    attention head whose largest weight most often lands on the other end of the arc, against the best fixed
    offset; the title counts the rarer ones (in relations.csv)."""
    from headlab.analysis.sentences import TABLE_RELATIONS
    from headlab.heads import head_label

    shown = syntax.relations[:TABLE_RELATIONS]
    rows = []
    for rel in shown:
        direction, (layer, head), accuracy = rel.best
        reads = "dependent → syntactic head" if direction == "dep_to_head" else "syntactic head → dependent"
        rows.append((rel.relation, str(rel.count), head_label(layer, head), reads, f"{accuracy:.0%}",
                     f"{rel.baseline_accuracy:.0%}", f"{rel.baseline_offset:+d}"))
    more = len(syntax.relations) - len(shown)
    title = ("Dependency relations: the attention head whose largest weight most often lands on the other end of the "
             f"arc, against the best fixed offset (the {len(shown)} most frequent relations"
             + (f"; {more} rarer {'one is' if more == 1 else 'ones are'} in relations.csv)" if more else ")"))
    return DisplayTable(title, (Column("relation"), Column("arcs", numeric=True), Column("attention head"),
                                Column("from → to"), Column("accuracy", numeric=True),
                                Column("best offset's accuracy", numeric=True), Column("offset", numeric=True)),
                        tuple(rows))


def sinks_table(value_weighted: HeadTable, sinks: SinkResult) -> DisplayTable:
    """The ``TOP_HEADS`` heads with most raw attention on the sink tokens (the first position and the special
    tokens; ``ValueWeighted``'s table) against their value-weighted share (‖α f(x)‖) and the norms behind it,
    then ``SinkShare``'s numbers of each: its share on the first ``n_sink`` positions, whether it is a sink
    head, and the share it gains per doubling of the query position, in percentage points."""
    from headlab.analysis.sinks import SINK_HEAD_SHARE
    from headlab.heads import head_label

    vw, by_position = value_weighted, sinks.table
    rows = []
    for layer, head in vw.top("raw_sink", TOP_HEADS):
        cells = [head_label(layer, head), f"{vw.value('raw_sink', layer, head):.0%}",
                 f"{vw.value('weighted_sink', layer, head):.0%}", f"{vw.value('norm_first', layer, head):.2f}",
                 f"{vw.value('norm_other', layer, head):.2f}"]
        if (layer, head) in by_position.heads:
            raw, growth = by_position.value("raw_share", layer, head), by_position.value("raw_growth", layer, head)
            cells += [MISSING if math.isnan(raw) else f"{raw:.0%}",
                      "yes" if by_position.value("sink_head", layer, head) == 1 else "",
                      MISSING if math.isnan(growth) else f"{growth * 100:+.1f}"]
        else:
            cells += [MISSING] * 3
        rows.append(tuple(cells))
    first = "the first position" if sinks.n_sink == 1 else f"the first {sinks.n_sink} positions"
    title = (f"Attention on the sink tokens: raw vs value-weighted (‖α f(x)‖), the {len(rows)} heads with most raw "
             f"attention on the first and special tokens (L = layer, H = head, from 0); the last three columns count "
             f"{first} as sinks, over queries after them: a sink head puts ≥ {SINK_HEAD_SHARE:.0%} of its attention "
             f"on {first}")
    return DisplayTable(title, (Column("head"), Column("raw on sinks", numeric=True),
                                Column("value-weighted", numeric=True), Column("‖f(x)‖ first token", numeric=True),
                                Column("‖f(x)‖ other tokens", numeric=True), Column(f"raw on {first}", numeric=True),
                                Column("sink head", numeric=True), Column("points per doubling", numeric=True)),
                        tuple(rows))


def patches_table(surface: HeadTable) -> DisplayTable:
    """An image model's ``TOP_HEADS`` heads that look nearest on the patch grid (``PatchStats``' table,
    ``headlab.analysis.patches``): the mean distance attended among the patches, the share on [CLS] and on every
    special token, the entropy against uniform attention's."""
    from headlab.heads import head_label

    def cell(name: str, layer: int, head: int, fmt: str) -> str:
        if name not in surface.columns or math.isnan(value := surface.value(name, layer, head)):
            return MISSING
        return format(value, fmt)

    rows = tuple((head_label(layer, head), cell("patch_distance", layer, head, ".2f"),
                  cell("to_cls", layer, head, ".0%"), cell("to_special", layer, head, ".0%"),
                  f"{cell('entropy', layer, head, '.2f')} / {cell('uniform_entropy', layer, head, '.2f')}")
                 for layer, head in surface.top("patch_distance", TOP_HEADS, largest=False))
    title = (f"Heads on images, the {len(rows)} of {len(surface)} that look nearest: mean distance attended among the "
             "patches (Euclidean, in patches), the share from the patches on [CLS] and on every special token "
             "([CLS], [DIST], registers), entropy against uniform attention's (L = layer, H = head, from 0)")
    return DisplayTable(title, (Column("head"), Column("distance (patches)", numeric=True),
                                Column("to [CLS]", numeric=True), Column("to special tokens", numeric=True),
                                Column("entropy / uniform (nats)", numeric=True)), rows)


def retrieval_table(retrieval: RetrievalResult) -> DisplayTable:
    """The ``TOP_HEADS`` heads by retrieval score (Wu et al. 2024), with the share of copy steps at which each
    one's most-attended key is the token being copied."""
    from headlab.analysis.retrieval import THRESHOLD
    from headlab.heads import head_label

    scores = retrieval.table
    rows = tuple((str(rank), head_label(*head), f"{scores.value('score', *head):.3f}",
                  f"{scores.value('attended', *head):.3f}") for rank, head in enumerate(retrieval.top(TOP_HEADS), 1))
    title = (f"Retrieval heads (Wu et al. 2024): top {len(rows)} of {len(scores)} by score (> {THRESHOLD} is a "
             f"retrieval head); the model copies {retrieval.copied} of {retrieval.steps} steps")
    return DisplayTable(title, (Column("rank", numeric=True), Column("head"), Column("retrieval score", numeric=True),
                                Column("attends to the copied token", numeric=True)), rows)


def streaming_table(streaming: StreamingResult) -> DisplayTable:
    """One row per window W of the streaming simulation: the heads that tolerate W alone, those converted
    together within the loss budget, the measured loss change, the units freed and the memory saved."""
    unit = "key/value heads freed" if streaming.kind == "causal" else "heads windowed"
    rows = tuple((str(c.window), str(len(c.tolerant)), str(len(c.heads)), f"{c.loss_change:+.3g}",
                  f"{c.freed} / {c.units}", share(c.saved_share), share(c.limit_share))
                 for c in streaming.conversions)
    title = (f"Streaming heads: {streaming.sinks} sink tokens + a window of W keys; conversions within the loss "
             f"budget {streaming.budget:g} ({streaming.loss}), memory of the {streaming.memory}")
    return DisplayTable(title, (Column("W", numeric=True), Column("tolerant alone", numeric=True),
                                Column("converted", numeric=True), Column("loss change (measured)", numeric=True),
                                Column(unit, numeric=True), Column(f"saved at {streaming.length} tokens", numeric=True),
                                Column("saved, long texts", numeric=True)), rows)
