"""Which heads need the whole context: retrieval heads (Wu et al. 2024) and streaming heads
(DuoAttention, RazorAttention 2024) of one model, sized to fit it, run the same way by ``headlab
analyze`` and the report.

- Retrieval scores (``headlab.analysis.retrieval``) apply to causal language models only; for any
  other model ``ContextHeads.retrieval`` is None and ``reason`` says why.
- The streaming simulation (``headlab.analysis.streaming``) runs on both kinds.

Both run on the selected heads (``heads``, every head of the model by default; their own passes, like
the causal probes, whose costs scale with the selection), with the sizes of ``FULL`` or ``QUICK`` shrunk
to the model's position table; ``length`` replaces their text length (streaming chunks of that many
tokens, copy cases of that many tokens in all: the haystack fills what the needle, its copy and the
beginning-of-sequence token leave), shrunk the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
from torch import nn

from headlab.heads import HeadSelection
from headlab.models import HeadedModel, headed

__all__ = ["FULL", "QUICK", "ContextHeads", "context_heads", "copy_haystack", "plot_streaming"]


class _Sizes(TypedDict):
    needles: int
    needle_length: int
    haystack_length: int
    windows: tuple[int, ...]
    length: int
    texts: int
    sinks: int


# Settings of the two runs: a few seconds on a tiny model, under a minute for MiniLM on two cores.
FULL: _Sizes = dict(needles=24, needle_length=10, haystack_length=96, windows=(4, 8, 16, 32), length=96, texts=4,
                    sinks=4)
QUICK: _Sizes = dict(needles=8, needle_length=8, haystack_length=48, windows=(4, 16), length=64, texts=2, sinks=4)


@dataclass
class ContextHeads:
    """Retrieval scores (or why none) and the streaming simulation of one model.

    Attributes:
        retrieval: a ``RetrievalResult``, or None when the scores do not apply.
        reason: why ``retrieval`` is None (None when it ran).
        needle_length, haystack_length: tokens of each needle and of the text around it (the haystack of
            ``length`` tokens of copy case when a length was given).
        streaming: a ``StreamingResult``.
    """

    retrieval: Any | None
    reason: str | None
    needle_length: int
    haystack_length: int
    streaming: Any

    def to_dict(self) -> dict[str, Any]:
        return {"retrieval": None if self.retrieval is None else self.retrieval.to_dict(),
                "retrieval_not_applicable": self.reason,
                "needle_length": self.needle_length if self.reason is None else None,
                "haystack_length": self.haystack_length if self.reason is None else None,
                "streaming": self.streaming.to_dict()}


def context_heads(model: HeadedModel | nn.Module, corpus: Any = None, *, heads: HeadSelection = None,
                  length: int | None = None, quick: bool = False, seed: int = 0) -> ContextHeads:
    """Retrieval scores (causal language models) and the streaming simulation of the selected heads, with
    ``QUICK`` or ``FULL`` sizes shrunk to the model's position table.

    Args:
        model: a ``HeadedModel`` with a tokenizer (or an attached model whose handle has one).
        corpus: anything ``headlab.capture.load_corpus`` reads; None for the bundled corpus.
        heads: the heads to run (``headlab.heads.selection``); None for every head.
        length: tokens of each streaming chunk and of each copy case, ``>= 1``, shrunk to the model's
            position table; None for the sizes' own (a chunk of ``length``, a copy case around a haystack of
            ``haystack_length``).
        quick: the ``QUICK`` sizes.
        seed: where the needles are hidden.

    Raises:
        ValueError: a bad selection, or a length that is not an int >= 1 or (causal language models) cannot
            hold a needle and its copy.
        ShortCorpus: a corpus without room for a needle and its haystack or for the streaming chunks.
    """
    from headlab.analysis.retrieval import retrieval_scores
    from headlab.analysis.streaming import streaming_simulation
    from headlab.models.stream import has_logits
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
        raise ValueError(f"length={length!r}: expected an int >= 1")
    model = headed(model)
    settings = QUICK if quick else FULL
    limit = model.max_length or 10**9
    chunk = min(settings["length"] if length is None else length, limit)
    windows = [w for w in settings["windows"] if w < chunk] or [max(1, chunk // 4)]
    needle = settings["needle_length"]
    haystack = copy_haystack(model, None, quick=quick)
    retrieval, reason = None, None
    if not model.causal:
        reason = "it attends both ways"
    elif not has_logits(model):
        reason = "it is causal but has no language-model head, so its predictions cannot be read"
    else:
        haystack = copy_haystack(model, length, quick=quick)  # the same total the streaming chunks get
        retrieval = retrieval_scores(model, corpus=corpus, heads=heads, needles=settings["needles"],
                                     needle_length=needle, haystack_length=haystack, seed=seed)
    streaming = streaming_simulation(model, corpus=corpus, heads=heads, windows=windows, sinks=settings["sinks"],
                                     length=chunk, texts=settings["texts"])
    return ContextHeads(retrieval, reason, needle, haystack, streaming)


def copy_haystack(model: HeadedModel, length: int | None, *, quick: bool = False) -> int:
    """The haystack of ``context_heads``' copy cases: for a ``length``, what leaves room for a needle and its copy in
    that many tokens shrunk to the model's position table (``haystack_for``); else the sizes' own, shrunk to it.

    Raises:
        ValueError: a length that cannot hold a needle and its copy (what ``analyze`` checks before its capture).
    """
    from headlab.analysis.retrieval import haystack_for

    settings = QUICK if quick else FULL
    limit, needle = model.max_length or 10**9, settings["needle_length"]
    if length is None:
        return min(settings["haystack_length"], limit - 1 - 2 * needle)
    return haystack_for(model.tokenizer, length=min(length, limit), needle_length=needle)


def plot_streaming(result: Any, path: str | os.PathLike[str], *, title: str | None = None) -> Path:
    """Loss change against the window W (a ``StreamingResult``): the median and the largest single-head
    change, every selected head at once, the combined conversion, and the budget; a PNG. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = np.asarray(result.windows)
    single = np.stack([result.table[f"loss_change_w{x}"] for x in result.windows])  # (windows, heads)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(w, np.median(single, 1), marker="o", label="one head streaming (median)")
    ax.plot(w, single.max(1), marker="^", label="one head streaming (largest)")
    ax.plot(w, result.all_heads, marker="s", label="every selected head streaming")
    ax.plot(w, [c.loss_change for c in result.conversions], marker="D", label="the conversion (tolerant heads)")
    ax.axhline(result.budget, color="grey", linestyle="--", linewidth=1, label=f"budget {result.budget:g}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(w, [str(x) for x in w])
    ax.set_xlabel(f"window W (plus {result.sinks} sink tokens)")
    ax.set_ylabel("loss change")
    ax.set_yscale("symlog", linthresh=max(result.budget, 1e-4))
    changes = [*single.ravel(), *result.all_heads, *(c.loss_change for c in result.conversions)]
    if min(changes) >= 0:  # no negative axis when nothing got better
        ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
