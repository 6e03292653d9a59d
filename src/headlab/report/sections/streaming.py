"""Retrieval heads and streaming heads of the report's model (``headlab.analysis.retrieval`` and
``headlab.analysis.streaming``).

- Retrieval heads (Wu et al. 2024), causal language models only: the share of teacher-forced copy
  steps at which a head's most-attended key is the token being copied and the model predicts it.
  For an encoder the section says why the score does not apply.
- Streaming heads (DuoAttention, RazorAttention), both model kinds: each head run with only the sink
  tokens and a window of W keys, W swept; the loss change, the heads that tolerate it, the memory
  a combined conversion saves; a plot of loss change against W.

Both are measured by ``headlab.analysis.context_heads`` (as ``headlab analyze`` measures them);
every sentence is generated from the measured results.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from headlab.display import format_bytes
from headlab.report.html import Html, escape, link
from headlab.report.section import ReportContext, Section
from headlab.report.tables import TOP_HEADS, retrieval_table, share, streaming_table, to_html

__all__ = ["SECTION", "TOP", "render_streaming", "retrieval_sentences", "streaming_sentences"]

TOP = TOP_HEADS  # retrieval heads in the table (headlab.report.tables)
ASSET_DIR = "assets/streaming"


def retrieval_sentences(result: Any | None, *, name: str, reason: str | None = None, needle_length: int = 0,
                        haystack_length: int = 0) -> list[str]:
    """What the retrieval scores say, in sentences made from ``result`` (or why there is none).

    Args:
        result: a ``RetrievalResult``, or None when the model is not causal.
        name: the model's short name.
        reason: why no result, when ``result`` is None.
        needle_length, haystack_length: tokens of each needle and of the haystack around it.
    """
    from headlab.analysis.retrieval import THRESHOLD
    from headlab.heads import head_label

    if result is None:
        return [f"Retrieval scores do not apply to {name}: {reason}. Wu et al. score a head while a causal model "
                "generates a copy of a needle from its context; an encoder reads the whole input at once and "
                "generates nothing, so there is no copy step to score."]
    table_ = result.table
    n_heads = len(table_)
    out = [f"Over {result.needles} needles of {needle_length} tokens, each hidden at a random depth in "
           f"{haystack_length} tokens of corpus text and then copied (teacher-forced), the model's top prediction "
           f"was the needle's next token at {result.copied} of {result.steps} copy steps "
           f"({share(result.copy_accuracy)})."]
    best = result.top(1)[0]
    best_score, best_attended = table_.value("score", *best), table_.value("attended", *best)
    found = result.retrieval_heads()
    if result.copied == 0:
        attender = table_.top("attended", 1)[0]
        out.append(f"The model never copies the needle, so no head can retrieve and every score is 0; the attention "
                   f"half of the test alone (the head's most-attended key is the token being copied) is passed most "
                   f"often by {head_label(*attender)}, at {share(table_.value('attended', *attender))} of the steps.")
    elif found:
        out.append(f"{len(found)} of {n_heads} heads ({share(len(found) / n_heads)}) score above {THRESHOLD}, Wu et "
                   f"al.'s threshold for a retrieval head; the highest is {head_label(*best)} at {best_score:.2f}: its "
                   f"most-attended key was the token being copied at {share(best_attended)} of the steps.")
    else:
        out.append(f"No head scores above {THRESHOLD} (Wu et al.'s threshold for a retrieval head); the highest is "
                   f"{head_label(*best)} at {best_score:.3f}.")
    return out


def streaming_sentences(result: Any, *, name: str) -> list[str]:
    """What the streaming simulation says, in sentences made from ``result`` (a ``StreamingResult``)."""
    from headlab.heads import head_label

    causal = result.kind == "causal"
    windows = ", ".join(str(w) for w in result.windows)
    kept = ("the W most recent keys (its own included)" if causal else
            "the keys within W positions on either side (|i − j| ≤ W, Longformer-style)")
    out = [f"Each head of {name} was run as a streaming head inside the model, keeping only the first {result.sinks} "
           f"tokens and {kept}, on {result.texts} corpus texts of {result.length} tokens, for W = {windows}; the "
           f"loss is the {result.loss}"
           + (f" ({result.base_loss:.3f} for the unrestricted model)." if causal else ".")]
    if not causal:
        out.append("An encoder keeps no key/value cache: what a window saves here is attention-score memory (the "
                   "query–key entries a head computes), not cache memory.")
    n_heads = len(result.table)
    for c in (result.conversions[0], result.conversions[-1]) if len(result.conversions) > 1 else result.conversions:
        what = (f"freeing {c.freed} of {c.units} key/value heads, which saves" if causal else "which saves")
        memory = "key/value cache" if causal else "attention-score memory"
        saving = (f"{share(c.saved_share)} of the {memory} of a {result.length}-token text "
                  f"({format_bytes(c.saved_bytes)} of {format_bytes(c.total_bytes)}), {share(c.limit_share)} as texts "
                  "grow long")
        if not c.heads:
            out.append(f"At W = {c.window}, {len(c.tolerant)} of {n_heads} heads change the loss by at most the budget "
                       f"of {result.budget:g} on their own, and none can be converted: nothing is saved.")
            continue
        out.append(f"At W = {c.window}, {len(c.tolerant)} of {n_heads} heads change the loss by at most the budget of "
                   f"{result.budget:g} on their own; converting the cheapest {len(c.heads)} of them together changes "
                   f"it by {c.loss_change:+.3g} (measured), {what} {saving}.")
    unsaved = [c for c in result.conversions if c.unsaved]
    if causal and unsaved:
        c = unsaved[0]
        out.append(f"Query heads share key/value heads here, and a key/value head is freed only when every query head "
                   f"reading it streams: at W = {c.window}, {c.unsaved} of the {len(c.heads)} converted heads save no "
                   "cache, because a head that keeps the whole context still reads their key/value head.")
    out.append(f"With every head streaming the loss changes by {result.all_heads[0]:+.3g} at W = {result.windows[0]} "
               f"and {result.all_heads[-1]:+.3g} at W = {result.windows[-1]}.")
    w = result.windows[0]
    z = result.table[f"z_change_w{w}"]
    low, high = result.table.heads[int(np.argmin(z))], result.table.heads[int(np.argmax(z))]
    out.append(f"At W = {w} the head whose output z changes least is {head_label(*low)} ({share(float(z.min()))} "
               f"of its norm); the most, {head_label(*high)} ({share(float(z.max()))}).")
    return out


def render_streaming(retrieval: list[str], retrieval_result: Any | None, streaming: Any, *, name: str,
                     plot_href: str | None = None, json_href: str | None = None) -> Html:
    """The fragment: retrieval sentences and top heads, streaming sentences, the per-window table, the plot
    (the tables: ``headlab.report.tables``, as ``headlab analyze`` prints them)."""
    links = ", ".join(link(h, t) for h, t in ((json_href, "streaming.json"), (plot_href, "streaming.png")) if h)
    parts = [f"<p>Two newer readings of what heads of <code>{escape(name)}</code> do: which heads copy a token "
             "from far back (retrieval heads, Wu et al. 2024), and which could keep only a few sink tokens and a "
             "window of recent ones (streaming heads: DuoAttention and RazorAttention, 2024), simulated exactly by "
             "restricting each head inside the model." + (f" Results: {links}." if links else "") + "</p>",
             "<h3>Retrieval heads</h3>"]
    parts += [f"<p>{escape(s)}</p>" for s in retrieval]
    if retrieval_result is not None and retrieval_result.copied:
        parts.append(to_html(retrieval_table(retrieval_result)))
    parts.append("<h3>Streaming heads</h3>")
    parts += [f"<p>{escape(s)}</p>" for s in streaming_sentences(streaming, name=name)]
    parts.append(to_html(streaming_table(streaming)))
    if plot_href is not None:
        parts.append(f'<p><img src="{escape(plot_href)}" alt="loss change against the window W: one head, every '
                     'head and the conversion" style="max-width:100%"></p>')
    return Html("".join(parts))


def render(ctx: ReportContext) -> str:
    from headlab.analysis.context_heads import context_heads, plot_streaming
    from headlab.report.provenance import model_name

    loaded = ctx.load_model()
    name = model_name(loaded.source)
    measured = context_heads(loaded, ctx.text, quick=ctx.quick, seed=ctx.seed)
    plot = plot_streaming(measured.streaming, ctx.assets_dir / "streaming" / "streaming.png",
                          title=f"{name}: loss change of streaming heads")
    document = {"model": loaded.source, **measured.to_dict()}
    json_href = ctx.write_file(f"{ASSET_DIR}/streaming.json", json.dumps(document, indent=1) + "\n")
    said = retrieval_sentences(measured.retrieval, name=name, reason=measured.reason,
                               needle_length=measured.needle_length, haystack_length=measured.haystack_length)
    return render_streaming(said, measured.retrieval, measured.streaming, name=name,
                            plot_href=f"{ASSET_DIR}/{plot.name}", json_href=json_href)


SECTION = Section(id="streaming", title="Retrieval and streaming heads", render=render)
