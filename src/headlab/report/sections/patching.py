"""Which heads carry a behaviour: exact activation patching and attribution patching (AtP) on the
report's model, side by side (``headlab.analysis.patching``).

The pair of inputs and the metric follow the model:

- a causal language model (its output has logits): an induction pair built from the model's own
  tokenizer. The clean input is a run of distinct tokens followed by the run again without its
  last token, so a model that copies (induction heads) predicts that last token next; the
  corrupted input changes the last token's first occurrence, so copying predicts another.
  Metric: ``logit(answer) − logit(wrong)`` at the last position.
- any other model (an encoder such as MiniLM; a causal model without a language-model head):
  ``CLEAN`` against ``CORRUPTED``, and the cosine similarity of the mean-pooled output to the
  clean text's.

Both methods run on every head of a pair a dozen tokens long, so ``--quick`` changes nothing
here. Every sentence of the section is generated from the two results.

Axis legend: input ids ``(batch, pos)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from headlab.report.html import Html, escape, link, table
from headlab.report.section import ReportContext, Section

if TYPE_CHECKING:
    from torch import nn

    from headlab.models import HeadedModel

__all__ = ["CLEAN", "CORRUPTED", "INDUCTION_TEXT", "RUN", "SECTION", "TOP", "Pair", "choose_pair", "render_patching",
           "sentences"]

CLEAN, CORRUPTED = "The cat sat on the mat.", "The dog sat on the mat."
INDUCTION_TEXT = "the cat sat on a big red mat while the dog ran"  # common words: one token each in most vocabularies
RUN = 6  # distinct tokens in the repeated run
TOP = 10  # heads in the table
CLOSE = 1.25  # AtP within this factor of the exact effect (either way) "agrees" on a head
ASSET_DIR = "assets/patching"


@dataclass(frozen=True)
class Pair:
    """A clean input, a corrupted one as long, and the metric that tells them apart.

    Attributes:
        clean, corrupted: input ids, ``(1, pos)``.
        metric: ``metric(output) -> scalar``; ``headlab.analysis.patching.Metric``.
        name: "logit-diff" or "similarity".
        definition: the metric in words.
        why: how the pair was built and why this metric, in words generated from its tokens.
    """

    clean: Any
    corrupted: Any
    metric: Any
    name: str
    definition: str
    why: str


def choose_pair(loaded: HeadedModel | nn.Module, *, clean: str = CLEAN, corrupted: str = CORRUPTED) -> Pair:
    """The pair and metric for ``loaded``: an induction pair with a logit difference for a causal
    language model, otherwise ``clean``/``corrupted`` with the similarity metric.

    Args:
        loaded: a ``HeadedModel`` (or an attached model).
        clean, corrupted: the texts of the similarity pair. When they tokenize to different
            lengths the corrupted input is the clean one with its first differing token swapped.

    Returns:
        The ``Pair``.

    Raises:
        ValueError: the tokenizer yields fewer than ``RUN + 1`` distinct tokens for
            ``INDUCTION_TEXT``, or the similarity texts tokenize alike up to the shorter one's end.
    """
    import torch

    from headlab.models import headed

    loaded = headed(loaded)  # the handle: an attached model's tokenizer is on it
    if not any(site.causal for site in loaded.sites):
        return _similarity_pair(loaded, clean, corrupted, "the model is an encoder (no next token to predict)")
    pair = _induction_pair(loaded)
    with torch.no_grad():
        output = loaded.model(input_ids=pair.clean.to(loaded.model.device))
    if getattr(output, "logits", None) is None:
        return _similarity_pair(loaded, clean, corrupted, "the model is causal but its output has no logits (no "
                                "language-model head), so no logit difference can be read")
    return pair


def _induction_pair(loaded: HeadedModel) -> Pair:
    import torch

    from headlab.analysis.patching import logit_difference

    tokenizer = loaded.tokenizer
    distinct = list(dict.fromkeys(tokenizer(INDUCTION_TEXT, add_special_tokens=False)["input_ids"]))
    if len(distinct) < RUN + 1:
        raise ValueError(f"{INDUCTION_TEXT!r} gives {len(distinct)} distinct tokens with this tokenizer; the "
                         f"induction pair needs {RUN + 1}")
    run, wrong = distinct[:RUN], distinct[RUN]
    answer = run[-1]
    prefix = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    clean = torch.tensor([prefix + run + run[:-1]])
    corrupted = torch.tensor([prefix + run[:-1] + [wrong] + run[:-1]])
    shown = tokenizer.convert_ids_to_tokens([answer, wrong])
    why = (f"The model is a causal language model, so the pair tests copying: the clean input is a run of {RUN} "
           f"tokens followed by the run again without its last token, so a model that copies (induction) predicts "
           f"{shown[0]!r} next; the corrupted input changes the first {shown[0]!r} into {shown[1]!r}, so copying "
           f"predicts {shown[1]!r}. Both are {clean.shape[1]} tokens long"
           f"{' (a beginning-of-sequence token first)' if prefix else ''}.")
    return Pair(clean, corrupted, logit_difference(answer, wrong), "logit-diff",
                f"logit({shown[0]!r}) − logit({shown[1]!r}) at the last position", why)


def _similarity_pair(loaded: HeadedModel, clean: str, corrupted: str, reason: str) -> Pair:
    from headlab.analysis.patching import text_metric

    tokenizer = loaded.tokenizer
    a = tokenizer(clean, return_tensors="pt")["input_ids"]
    b = tokenizer(corrupted, return_tensors="pt")["input_ids"]
    width = min(a.shape[1], b.shape[1])
    differ = (a[0, :width] != b[0, :width]).nonzero().flatten().tolist()
    if not differ:
        raise ValueError(f"{corrupted!r} tokenizes as {clean!r} does, or as a prefix or extension of it; there is no "
                         "token to patch between them")
    if a.shape == b.shape:
        changed = f"they differ in {len(differ)} of their {a.shape[1]} tokens"
    else:  # keep the clean length: swap the first token where the two tokenizations part
        swapped = a.clone()
        swapped[0, differ[0]] = b[0, differ[0]]
        b = swapped
        changed = (f"the two texts tokenize to different lengths, so the corrupted input is the clean one with "
                   f"token {differ[0]} swapped, {a.shape[1]} tokens each")
    metric, definition = text_metric(loaded, clean, name="similarity")
    why = (f"Similarity metric, because {reason}: the clean text is {clean!r}, the corrupted one {corrupted!r}; "
           f"{changed}.")
    return Pair(a, b, metric, "similarity", definition, why)


def sentences(exact: Any, attribution: Any, *, definition: str, top: int = TOP) -> list[str]:
    """The section's findings, each generated from the two results.

    Args:
        exact: ``activation_patching``'s ``PatchingResult``.
        attribution: ``attribution_patching``'s, on the same heads, pair and metric.
        definition: the metric in words.
        top: heads compared by the overlap of the two top lists.

    Returns:
        The sentences: the metric and its values, what an effect is, the cost of each method, their
        rank correlation, the overlap of their top heads and the top head's two values.
    """
    from headlab.analysis.importance import spearman
    from headlab.bench.results import format_seconds

    e, a = exact.table["effect"], attribution.table["effect"]
    n = len(e)
    gap = exact.clean_metric - exact.corrupted_metric
    out = [f"The metric is {definition}: {exact.clean_metric:.4g} on the clean input and "
           f"{exact.corrupted_metric:.4g} on the corrupted one, a gap of {gap:.4g}."
           + ("" if gap > 0 else " The clean input scores lower, so the model does not show the behaviour the "
              "pair tests; each effect below is still the head's change divided by this gap."),
           "A head's effect is the share of that gap it recovers when the corrupted run receives the head's output "
           "z (before W_O) from the clean run: 1 recovers all of it, 0 none, a negative effect widens it."]
    speed = exact.seconds / attribution.seconds
    faster = f"{speed:.0f}× faster" if speed >= 10 else (f"{speed:.1f}× faster" if speed >= 1 else
                                                          f"{1 / speed:.1f}× slower")
    out.append(f"One timed run each: exact activation patching ran {_passes(exact.forwards, 'forward')} (one per "
               f"head and the two baselines) in {format_seconds(exact.seconds)}; attribution patching (AtP, Kramár et "
               f"al. 2024) estimated all {n} heads from {_passes(attribution.forwards, 'forward')} and "
               f"{_passes(attribution.backwards, 'backward')} in {format_seconds(attribution.seconds)}, {faster}.")
    rho, rho_abs = spearman(e, a), spearman(np.abs(e), np.abs(a))
    verdict = ("the rankings mostly agree" if rho >= 0.8 else "the rankings agree only in part" if rho >= 0.5
               else "the rankings disagree: read AtP's table as a guess to check, not as a measurement")
    out.append(f"Over the {n} heads the two methods' effects have Spearman rank correlation {rho:.2f} "
               f"({rho_abs:.2f} for their magnitudes): {verdict}.")
    k = min(top, n)
    exact_top = exact.table.top("effect", k, absolute=True)
    atp_top = attribution.table.top("effect", k, absolute=True)
    shared = len(set(exact_top) & set(atp_top))
    flipped = sum(np.sign(exact.table.value("effect", *h)) != np.sign(attribution.table.value("effect", *h))
                  for h in exact_top)
    signs = ("AtP gives every one of them the exact method's sign" if flipped == 0 else
             f"AtP gives {flipped} of them the opposite sign")
    if k < n:
        out.append(f"Of the exact method's top {k} heads by |effect|, {shared} are in AtP's top {k}; {signs}.")
    else:
        out.append(f"Of all {n} heads, {signs}.")
    out.append(_top_head(exact, attribution))
    return out


def _top_head(exact: Any, attribution: Any) -> str:
    """The exact top head, AtP's estimate of it and AtP's rank for it."""
    from headlab.heads import head_label

    layer, head = exact.table.top("effect", 1, absolute=True)[0]
    e, a = exact.table.value("effect", layer, head), attribution.table.value("effect", layer, head)
    if np.sign(a) != np.sign(e):
        estimate = f"AtP estimates {a:+.3f}, the opposite sign"
    elif abs(a) > CLOSE * abs(e):
        estimate = f"AtP estimates {a:+.3f}, overestimating it {a / e:.2f}×"
    elif abs(a) * CLOSE < abs(e):
        estimate = f"AtP estimates {a:+.3f}, underestimating it ({a / e:.2f}× the exact effect)"
    else:
        estimate = f"AtP estimates {a:+.3f} ({a / e:.2f}× the exact effect)"
    ranked = attribution.table.top("effect", None, absolute=True)
    rank = ranked.index((layer, head)) + 1
    if rank == 1:
        where = "and ranks it first too"
    else:
        other = ranked[0]
        where = (f"and ranks it {_ordinal(rank)}; AtP's first is {head_label(*other)}, whose exact "
                 f"effect is {exact.table.value('effect', *other):+.3f}")
    return f"The exact method's top head is {head_label(layer, head)}, with effect {e:+.3f}; {estimate}, {where}."


def _passes(n: int, kind: str) -> str:
    return f"{n} {kind}" + ("" if n == 1 else "s")


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def render_patching(pair_text: tuple[str, str], why: str, exact: Any, attribution: Any, *, name: str,
                    definition: str, plot_href: str | None = None, json_href: str | None = None) -> Html:
    """The section's fragment: the pair, the findings, the top heads by both methods, the heatmaps.

    Args:
        pair_text: the clean and corrupted inputs as text (decoded tokens).
        why: how the pair was chosen (``Pair.why``).
        exact, attribution: the two ``PatchingResult``s.
        name: the model's short name.
        definition: the metric in words.
        plot_href, json_href: links to the heatmaps and the JSON, if written.

    Returns:
        The HTML fragment.
    """
    from headlab.heads import head_label

    links = ", ".join(link(h, t) for h, t in ((json_href, "patching.json"), (plot_href, "patching.png")) if h)
    parts = [f"<p>Which heads of <code>{escape(name)}</code> carry one behaviour: each head's output z is patched "
             "from a clean run into a corrupted one, exactly (one forward per head) and by attribution patching "
             f"(two forwards and one backward for every head). {escape(why)}"
             + (f" Per-head results: {links}." if links else "") + "</p>",
             f"<p>Clean: <code>{escape(pair_text[0])}</code><br>Corrupted: <code>{escape(pair_text[1])}</code></p>"]
    parts += [f"<p>{escape(s)}</p>" for s in sentences(exact, attribution, definition=definition)]
    ranked = attribution.table.top("effect", None, absolute=True)
    rows = []
    for i, (layer, head) in enumerate(exact.table.top("effect", TOP, absolute=True), 1):
        e, a = exact.table.value("effect", layer, head), attribution.table.value("effect", layer, head)
        rows.append([i, head_label(layer, head), f"{e:+.3f}", f"{a:+.3f}", f"{a / e:.2f}" if e else "—",
                     ranked.index((layer, head)) + 1])
    parts.append(table(["rank (exact)", "head", "exact effect", "AtP effect", "AtP / exact", "rank (AtP)"],
                       rows, numeric_cols=(0, 2, 3, 4, 5), caption=f"The top {len(rows)} heads by exact |effect|"))
    if plot_href is not None:
        parts.append(f'<p><img src="{escape(plot_href)}" alt="layer by head heatmaps of each head\'s effect, exact '
                     'patching beside attribution patching" style="max-width:100%"></p>')
    return Html("".join(parts))


def render(ctx: ReportContext) -> str:
    from headlab.analysis.importance import spearman
    from headlab.analysis.patching import activation_patching, attribution_patching, plot_patching
    from headlab.report.provenance import model_name

    loaded = ctx.load_model()
    pair = choose_pair(loaded)
    attribution_patching(loaded, pair.clean, pair.corrupted, pair.metric)  # warm-up: the first backward allocates
    exact = activation_patching(loaded, pair.clean, pair.corrupted, pair.metric)
    attribution = attribution_patching(loaded, pair.clean, pair.corrupted, pair.metric)
    texts = tuple(loaded.tokenizer.decode(ids[0]) for ids in (pair.clean, pair.corrupted))
    plot = plot_patching([exact, attribution], ctx.assets_dir / "patching" / "patching.png",
                         title=f"{model_name(loaded.source)}: {pair.definition}")
    e, a = exact.table["effect"], attribution.table["effect"]
    document = {"model": loaded.source, "clean": texts[0], "corrupted": texts[1],
                "clean_ids": pair.clean[0].tolist(), "corrupted_ids": pair.corrupted[0].tolist(),
                "metric": pair.definition, "metric_kind": pair.name,
                "results": [exact.to_dict(), attribution.to_dict()],
                "spearman": spearman(e, a), "spearman_abs": spearman(np.abs(e), np.abs(a))}
    json_href = ctx.write_file(f"{ASSET_DIR}/patching.json", json.dumps(document, indent=1) + "\n")
    return render_patching(texts, pair.why, exact, attribution, name=model_name(loaded.source),
                           definition=pair.definition, plot_href=f"{ASSET_DIR}/{plot.name}", json_href=json_href)


SECTION = Section(id="patching", title="Which heads carry a behaviour: patching", render=render)
