"""Which heads carry a behaviour: exact activation patching and attribution patching (AtP) on the
report's model, side by side (``headlab.analysis.patching``).

The pair of inputs and the metric follow the model (``choose_pair``): induction pairs and a logit
difference for a causal language model, sentence pairs and the similarity of the pooled output
for any other; among the candidates the section takes the pair whose clean and corrupted runs the
metric tells furthest apart (the largest gap).

A head's effect is its change of the metric divided by the clean − corrupted gap. Below
``MIN_GAP`` that share means nothing (one head can move the metric by more than the whole gap),
so the section shows each head's raw change instead and says why.

Both methods run once on every head of a pair a dozen tokens long, so ``--quick`` changes
nothing here. Every sentence of the section is generated from the two results, except how fast
each method is: one timed run is not a measurement, so that is read from the bench's interleaved
rounds in benchmarks/RESULTS.json (``speed_sentences``), and said to be missing when the bench has
no row for the model.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from headlab.report.html import Html, code, escape, link, table
from headlab.report.section import ReportContext, Section
from headlab.report.sections._patching_pair import RUN, choose_pair, similarity_candidates

if TYPE_CHECKING:
    from headlab.bench.records import Comparison, SuiteResult

__all__ = ["MIN_GAP", "RUN", "SECTION", "TOP", "bench_rows", "choose_pair", "normalised", "render_patching",
           "sentences", "similarity_candidates", "speed_sentences"]

TOP = 10  # heads in the table
CLOSE = 1.25  # AtP within this factor of the exact effect (either way) "agrees" on a head
# The smallest clean − corrupted gap, in the metric's own units, at which effects are shown as shares of it. Both
# metrics here are of order one: a cosine similarity (1 on the clean input) and a logit difference (a gap of 0.1
# changes the odds of the answer over the wrong token by about 10%). Below it, a single head's patch moves the
# metric by as much as the whole gap, so the share is noise divided by a small number (effects of ±2 on a gap of
# 0.01), not a part of a behaviour; a negative gap would read every share backwards.
MIN_GAP = 0.1
ASSET_DIR = "assets/patching"
BENCH_AREA = "patching"  # the bench area whose rows time both methods (headlab.bench.patching)


def normalised(result: Any) -> bool:
    """Whether a ``PatchingResult``'s effects (shares of the clean − corrupted gap) mean anything: the gap is at
    least ``MIN_GAP``. When not, the section shows each head's ``change`` of the metric instead."""
    return result.clean_metric - result.corrupted_metric >= MIN_GAP


def sentences(exact: Any, attribution: Any, *, definition: str, top: int = TOP) -> list[str]:
    """The section's findings, each generated from the two results.

    Args:
        exact: ``activation_patching``'s ``PatchingResult``.
        attribution: ``attribution_patching``'s, on the same heads, pair and metric.
        definition: the metric in words.
        top: heads compared by the overlap of the two top lists.

    Returns:
        The sentences: the metric and its values, what a head's value is (its effect, a share of the gap, or
        its raw change where the gap is under ``MIN_GAP``), the passes of each method, their rank correlation,
        the overlap of their top heads and the top head's two values.
    """
    from headlab.analysis.importance import spearman

    column = _column(exact)
    e, a = exact.table[column], attribution.table[column]
    n = len(e)
    gap = exact.clean_metric - exact.corrupted_metric
    said = (f"The metric is {definition}: {exact.clean_metric:.4g} on the clean input and "
            f"{exact.corrupted_metric:.4g} on the corrupted one, a gap of {gap:.4g}.")
    patched = "when the corrupted run receives the head's output z (before W_O) from the clean run"
    if column == "effect":
        out = [said, f"A head's effect is the share of that gap it recovers {patched}: 1 recovers all of it, 0 none, "
                     "a negative effect widens it."]
    else:
        why = (" The clean input scores lower, so the model does not show the behaviour the pair tests and a share "
               "of the gap would read backwards." if gap <= 0 else
               f" A gap under {MIN_GAP:g} is too small for shares of it to mean anything: one head's patch can move "
               "the metric by as much as the whole gap.")
        out = [said + why, f"So each head is given by its change: how far the metric moves {patched}, in the metric's "
                           "own units (positive raises it), not divided by the gap."]
    out.append(f"Exact activation patching ran {_passes(exact.forwards, 'forward')} (one per head and the two "
               f"baselines); attribution patching (AtP, Kramár et al. 2024) estimated all {n} heads from "
               f"{_passes(attribution.forwards, 'forward')} and {_passes(attribution.backwards, 'backward')}.")
    rho, rho_abs = spearman(e, a), spearman(np.abs(e), np.abs(a))
    verdict = ("the rankings mostly agree" if rho >= 0.8 else "the rankings agree only in part" if rho >= 0.5
               else "the rankings disagree: read AtP's table as a guess to check, not as a measurement")
    out.append(f"Over the {n} heads the two methods' {column}s have Spearman rank correlation {rho:.2f} "
               f"({rho_abs:.2f} for their magnitudes): {verdict}.")
    k = min(top, n)
    exact_top = exact.table.top(column, k, absolute=True)
    atp_top = attribution.table.top(column, k, absolute=True)
    shared = len(set(exact_top) & set(atp_top))
    flipped = sum(np.sign(exact.table.value(column, *h)) != np.sign(attribution.table.value(column, *h))
                  for h in exact_top)
    signs = ("AtP gives every one of them the exact method's sign" if flipped == 0 else
             f"AtP gives {flipped} of them the opposite sign")
    if k < n:
        out.append(f"Of the exact method's top {k} heads by |{column}|, {shared} are in AtP's top {k}; {signs}.")
    else:
        out.append(f"Of all {n} heads, {signs}.")
    out.append(_top_head(exact, attribution, column))
    return out


def _column(exact: Any) -> str:
    """The table column the section shows: "effect" when the gap normalises, else "change"."""
    return "effect" if normalised(exact) else "change"


def _shown(value: float, column: str) -> str:
    return f"{value:+.3f}" if column == "effect" else f"{value:+.3g}"


def _top_head(exact: Any, attribution: Any, column: str) -> str:
    """The exact top head, AtP's estimate of it and AtP's rank for it."""
    from headlab.heads import head_label

    layer, head = exact.table.top(column, 1, absolute=True)[0]
    e, a = exact.table.value(column, layer, head), attribution.table.value(column, layer, head)
    if np.sign(a) != np.sign(e):
        estimate = f"AtP estimates {_shown(a, column)}, the opposite sign"
    elif abs(a) > CLOSE * abs(e):
        estimate = f"AtP estimates {_shown(a, column)}, overestimating it {a / e:.2f}×"
    elif abs(a) * CLOSE < abs(e):
        estimate = f"AtP estimates {_shown(a, column)}, underestimating it ({a / e:.2f}× the exact {column})"
    else:
        estimate = f"AtP estimates {_shown(a, column)} ({a / e:.2f}× the exact {column})"
    ranked = attribution.table.top(column, None, absolute=True)
    rank = ranked.index((layer, head)) + 1
    if rank == 1:
        where = "and ranks it first too"
    else:
        other = ranked[0]
        where = (f"and ranks it {_ordinal(rank)}; AtP's first is {head_label(*other)}, whose exact "
                 f"{column} is {_shown(exact.table.value(column, *other), column)}")
    return (f"The exact method's top head is {head_label(layer, head)}, with {column} {_shown(e, column)}; "
            f"{estimate}, {where}.")


def _passes(n: int, kind: str) -> str:
    return f"{n} {kind}" + ("" if n == 1 else "s")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def speed_sentences(runs: Mapping[str, SuiteResult], model: str, *, source: str) -> list[str]:
    """How fast AtP is against the exact method on ``model``, as ``headlab bench`` measured it.

    One timed run of each method is not a measurement (the machine's load changes the seconds from run to run),
    so the section states the bench's ratio: both methods timed in one interleaved group, the median of its
    rounds, its noise, and when the rounds cannot tell the two apart.

    Args:
        runs: device → the latest stored bench run (``headlab.bench.results.read_results``); may be empty.
        model: the model as the bench names it in a row's case (``headlab.bench.capture.model_name``).
        source: the results file as the page names it.

    Returns:
        One sentence per device whose "patching" area has a row for ``model``, or one sentence saying there is
        none (no speed is stated then).
    """
    from headlab.bench.results import DEVICES, format_seconds, inconclusive, noise

    out = []
    for device, run, row in bench_rows(runs, model):
        verdict = ("within noise: the rounds do not say which is faster" if inconclusive(row) else
                   f"{row.speedup:.0f}× faster" if row.speedup >= 10 else
                   f"{row.speedup:.1f}× faster" if row.speedup >= 1 else f"{row.ratio:.1f}× slower")
        out.append(f"Speed, read from {source} (not measured by this report: {run.command}, {run.started}, "
                   f"{DEVICES.get(device, device)}, {run.machine.get('cpu', 'an unnamed CPU')}): on the bench's "
                   f"pair ({row.case}), timed in one interleaved group ({run.plan.rounds} rounds, median), "
                   f"{row.contender} took {format_seconds(row.contender_time.median)} and {row.peer} "
                   f"{format_seconds(row.peer_time.median)}: ratio {row.ratio:.3f} (noise {noise(row):.0%}), "
                   f"{verdict}.")
    if not out:
        out.append(f"Speed: {source} holds no patching row for {model}, so none is stated here; one timed run of "
                   "each method is not a measurement. headlab bench times both in interleaved rounds (on the "
                   "default model, or on another given as its argument).")
    return out


def bench_rows(runs: Mapping[str, SuiteResult], model: str) -> list[tuple[str, SuiteResult, Comparison]]:
    """``(device, run, row)`` for every row of the bench's patching area (``headlab.bench.patching``) whose case
    is ``model``'s: its name as the bench writes it, then " · " and the pair's size."""
    return [(device, run, row) for device, run in runs.items() for area in run.areas if area.name == BENCH_AREA
            for row in area.rows if row.case.startswith(f"{model} · ")]


def render_patching(pair_text: tuple[str, str], why: str, exact: Any, attribution: Any, *, name: str,
                    definition: str, speed: Sequence[str] = (), plot_href: str | None = None,
                    json_href: str | None = None) -> Html:
    """The section's fragment: the pair, the findings, the speed, the top heads by both methods, the heatmaps.

    Args:
        pair_text: the clean and corrupted inputs as text (decoded tokens).
        why: how the pair was chosen (``Pair.why``).
        exact, attribution: the two ``PatchingResult``s.
        name: the model's short name.
        definition: the metric in words.
        speed: ``speed_sentences``' sentences.
        plot_href, json_href: links to the heatmaps and the JSON, if written.

    Returns:
        The HTML fragment.
    """
    from headlab.heads import head_label

    column = _column(exact)
    links = ", ".join(link(h, t) for h, t in ((json_href, "patching.json"), (plot_href, "patching.png")) if h)
    parts = [f"<p>Which heads of {code(name)} carry one behaviour: each head's output z is patched "
             "from a clean run into a corrupted one, exactly (one forward per head) and by attribution patching "
             f"(two forwards and one backward for every head). {escape(why)}"
             + (f" Per-head results: {links}." if links else "") + "</p>",
             f"<p>Clean: <code>{escape(pair_text[0])}</code><br>Corrupted: <code>{escape(pair_text[1])}</code></p>"]
    parts += [f"<p>{escape(s)}</p>" for s in [*sentences(exact, attribution, definition=definition), *speed]]
    ranked = attribution.table.top(column, None, absolute=True)
    rows = []
    for i, (layer, head) in enumerate(exact.table.top(column, TOP, absolute=True), 1):
        e, a = exact.table.value(column, layer, head), attribution.table.value(column, layer, head)
        rows.append([i, head_label(layer, head), _shown(e, column), _shown(a, column), f"{a / e:.2f}" if e else "—",
                     ranked.index((layer, head)) + 1])
    parts.append(table(["rank (exact)", "head", f"exact {column}", f"AtP {column}", "AtP / exact", "rank (AtP)"],
                       rows, numeric_cols=(0, 2, 3, 4, 5), caption=f"The top {len(rows)} heads by exact |{column}|"))
    if plot_href is not None:
        parts.append(f'<p><img src="{escape(plot_href)}" alt="layer by head heatmaps of each head\'s effect, exact '
                     'patching beside attribution patching" style="max-width:100%"></p>')
    elif column == "change":
        parts.append("<p class=\"note\">No heatmap: it would colour the heads by their share of a gap too small "
                     "to share.</p>")
    return Html("".join(parts))


def _results_named() -> tuple[dict[str, Any], str, str | None]:
    """The stored bench runs, the file as the page names it (relative to the working directory when inside
    it), and its path for the provenance paragraph (None when there is no file)."""
    from headlab.bench.results import read_results
    from headlab.report.sections.bench import find_results

    path = find_results()
    if path is None:
        return {}, "benchmarks/RESULTS.json (absent)", None
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    return read_results(path), str(shown), str(path)


def render(ctx: ReportContext) -> str:
    from headlab.analysis.importance import spearman
    from headlab.analysis.patching import activation_patching, attribution_patching, plot_patching
    from headlab.bench.capture import model_name as bench_name
    from headlab.report.provenance import ReadSource, model_name, record_source
    from headlab.report.sections.bench import measured

    loaded = ctx.load_model()
    pair = choose_pair(loaded)
    exact = activation_patching(loaded, pair.clean, pair.corrupted, pair.metric)
    attribution = attribution_patching(loaded, pair.clean, pair.corrupted, pair.metric)
    texts = tuple(loaded.tokenizer.decode(ids[0]) for ids in (pair.clean, pair.corrupted))
    runs, shown, path = _results_named()
    speed = speed_sentences(runs, bench_name(loaded), source=shown)
    read = {device: run for device, run, _ in bench_rows(runs, bench_name(loaded))}
    if path is not None and read:
        record_source(ctx, ReadSource(section=SECTION.title, path=path,
                                      measured="; ".join(measured(run) for run in read.values())))
    plot = None
    if normalised(exact):  # the heatmaps colour heads by effect, a share of the gap
        plot = plot_patching([exact, attribution], ctx.assets_dir / "patching" / "patching.png",
                             title=f"{model_name(loaded.source)}: {pair.definition}")
    column = _column(exact)
    e, a = exact.table[column], attribution.table[column]
    document = {"model": loaded.source, "clean": texts[0], "corrupted": texts[1],
                "clean_ids": pair.clean[0].tolist(), "corrupted_ids": pair.corrupted[0].tolist(),
                "metric": pair.definition, "metric_kind": pair.name, "candidate_gaps": list(pair.gaps),
                "min_gap": MIN_GAP, "shown": column, "results": [exact.to_dict(), attribution.to_dict()],
                "spearman": spearman(e, a), "spearman_abs": spearman(np.abs(e), np.abs(a)), "speed": speed}
    json_href = ctx.write_file(f"{ASSET_DIR}/patching.json", json.dumps(document, indent=1) + "\n")
    return render_patching(texts, pair.why, exact, attribution, name=model_name(loaded.source),
                           definition=pair.definition, speed=speed,
                           plot_href=None if plot is None else f"{ASSET_DIR}/{plot.name}", json_href=json_href)


SECTION = Section(id="patching", title="Which heads carry a behaviour: patching", render=render)
