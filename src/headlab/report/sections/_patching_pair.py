"""The patching section's clean and corrupted inputs and its metric, chosen among candidates by the
gap the metric puts between them (``choose_pair``):

- a causal language model (its output has logits): induction pairs built from the model's own
  tokenizer. A clean input is a run of distinct tokens followed by the run again without its
  last token, so a model that copies (induction heads) predicts that last token next; its
  corrupted input changes the last token's first occurrence, so copying predicts another. The
  candidates are every run of ``RUN`` consecutive distinct tokens of ``INDUCTION_TEXT`` with every
  other of its tokens as the changed one. Metric: ``logit(answer) − logit(wrong)`` at the last
  position.
- any other model (an encoder such as MiniLM; a causal model without a language-model head):
  ``CLEAN`` against ``CORRUPTED`` and the bundled near-miss sentence pairs (``headlab.data.pairs``),
  and the cosine similarity of the mean-pooled output to the clean text's. Pairs whose two texts
  tokenize to the same length are preferred: the others are patched with one token swapped.

Axis legend: input ids ``(batch, pos)``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from torch import Tensor, nn

    from headlab.models import HeadedModel

__all__ = ["CLEAN", "CORRUPTED", "INDUCTION_TEXT", "RUN", "Pair", "choose_pair", "similarity_candidates"]

CLEAN, CORRUPTED = "The cat sat on the mat.", "The dog sat on the mat."
INDUCTION_TEXT = "the cat sat on a big red mat while the dog ran"  # common words: one token each in most vocabularies
RUN = 6  # distinct tokens in the repeated run


@dataclass(frozen=True)
class Pair:
    """A clean input, a corrupted one as long, and the metric that tells them apart.

    Attributes:
        clean, corrupted: input ids, ``(1, pos)``.
        metric: ``metric(output) -> scalar``; ``headlab.analysis.patching.Metric``.
        name: "logit-diff" or "similarity".
        definition: the metric in words.
        why: how the pair was built and chosen and why this metric, in words generated from its tokens.
        gaps: the clean − corrupted gap of every candidate scored, the pair's being the largest.
    """

    clean: Any
    corrupted: Any
    metric: Any
    name: str
    definition: str
    why: str
    gaps: tuple[float, ...]


def similarity_candidates() -> list[tuple[str, str]]:
    """The (clean, corrupted) texts the similarity pair is chosen from: ``CLEAN``/``CORRUPTED``, then the
    bundled near-miss pairs (the same words but a few, a different meaning)."""
    from headlab.data.pairs import load_pairs

    return [(CLEAN, CORRUPTED)] + [(p.sentence_a, p.sentence_b) for p in load_pairs(labels=("near-miss",))]


def choose_pair(loaded: HeadedModel | nn.Module, *, candidates: Sequence[tuple[str, str]] | None = None) -> Pair:
    """The pair and metric for ``loaded``: the induction pair with the largest logit-difference gap for a causal
    language model, otherwise the candidate texts with the largest similarity gap.

    Args:
        loaded: a ``HeadedModel`` (or an attached model).
        candidates: (clean, corrupted) texts for the similarity metric; None: ``similarity_candidates()``.
            Texts that tokenize to different lengths are patched with the clean input's first differing token
            swapped, and only when no candidate tokenizes to equal lengths.

    Returns:
        The ``Pair``.

    Raises:
        ValueError: the tokenizer yields fewer than ``RUN + 1`` distinct tokens for ``INDUCTION_TEXT``, or
            every similarity candidate tokenizes alike up to the shorter text's end.
    """
    from headlab.models import headed
    from headlab.models.stream import has_logits

    loaded = headed(loaded)  # the handle: an attached model's tokenizer is on it
    texts = similarity_candidates() if candidates is None else list(candidates)
    if not any(site.causal for site in loaded.sites):
        return _similarity_pair(loaded, texts, "the model is an encoder (no next token to predict)")
    if not has_logits(loaded):
        return _similarity_pair(loaded, texts, "the model is causal but its output has no logits (no "
                                "language-model head), so no logit difference can be read")
    return _induction_pair(loaded)


def _induction_pair(loaded: HeadedModel) -> Pair:
    import torch

    from headlab.analysis.patching import logit_difference

    tokenizer = loaded.tokenizer
    distinct = list(dict.fromkeys(tokenizer(INDUCTION_TEXT, add_special_tokens=False)["input_ids"]))
    if len(distinct) < RUN + 1:
        raise ValueError(f"{INDUCTION_TEXT!r} gives {len(distinct)} distinct tokens with this tokenizer; the "
                         f"induction pair needs {RUN + 1}")
    prefix = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]
    runs = [distinct[start:start + RUN] for start in range(len(distinct) - RUN)]
    candidates = [(run, wrong) for run in runs for wrong in distinct if wrong not in run]
    clean = torch.tensor([prefix + run + run[:-1] for run, _ in candidates])  # (candidates, pos)
    corrupted = torch.tensor([prefix + run[:-1] + [wrong] + run[:-1] for run, wrong in candidates])
    answers = torch.tensor([[run[-1], wrong] for run, wrong in candidates])  # (candidates, 2)
    scores = []
    with loaded.running(grad=False) as net:
        for ids in (clean, corrupted):
            read = net(**loaded.inputs(ids)).logits[:, -1].float().cpu().gather(1, answers)  # (candidates, 2)
            scores.append(read[:, 0] - read[:, 1])  # logit(answer) − logit(wrong), as logit_difference reads it
    gaps = (scores[0] - scores[1]).tolist()
    best = int(np.argmax(gaps))
    run, wrong = candidates[best]
    answer = run[-1]
    shown = tokenizer.convert_ids_to_tokens([answer, wrong])
    why = (f"The model is a causal language model, so the pair tests copying: the clean input is a run of {RUN} "
           f"tokens followed by the run again without its last token, so a model that copies (induction) predicts "
           f"{shown[0]!r} next; the corrupted input changes the first {shown[0]!r} into {shown[1]!r}, so copying "
           f"predicts {shown[1]!r}. Both are {clean.shape[1]} tokens long"
           f"{' (a beginning-of-sequence token first)' if prefix else ''}. {_chosen(gaps, best)}")
    return Pair(clean[best:best + 1], corrupted[best:best + 1], logit_difference(answer, wrong), "logit-diff",
                f"logit({shown[0]!r}) − logit({shown[1]!r}) at the last position", why, tuple(gaps))


@dataclass(frozen=True)
class _Texts:
    """A similarity candidate as input ids ``(1, pos)`` each, and how they differ in words."""

    clean_text: str
    corrupted_text: str
    clean: Tensor
    corrupted: Tensor
    changed: str
    swapped: bool


def _tokenized(tokenizer: Any, clean: str, corrupted: str) -> _Texts:
    a = tokenizer(clean, return_tensors="pt")["input_ids"]
    b = tokenizer(corrupted, return_tensors="pt")["input_ids"]
    width = min(a.shape[1], b.shape[1])
    differ = (a[0, :width] != b[0, :width]).nonzero().flatten().tolist()
    if not differ:
        raise ValueError(f"{corrupted!r} tokenizes as {clean!r} does, or as a prefix or extension of it; there is no "
                         "token to patch between them")
    if a.shape == b.shape:
        return _Texts(clean, corrupted, a, b, f"they differ in {len(differ)} of their {a.shape[1]} tokens", False)
    swapped = a.clone()  # keep the clean length: swap the first token where the two tokenizations part
    swapped[0, differ[0]] = b[0, differ[0]]
    return _Texts(clean, corrupted, a, swapped, f"the two texts tokenize to different lengths, so the corrupted input "
                  f"is the clean one with token {differ[0]} swapped, {a.shape[1]} tokens each", True)


def _similarity_pair(loaded: HeadedModel, candidates: list[tuple[str, str]], reason: str) -> Pair:
    import torch

    from headlab.analysis.patching import text_metric

    tokenized, refused = [], []
    for clean, corrupted in candidates:
        try:
            tokenized.append(_tokenized(loaded.tokenizer, clean, corrupted))
        except ValueError as err:
            refused.append(str(err))
    if not tokenized:
        raise ValueError("; ".join(refused))
    pool = [t for t in tokenized if not t.swapped] or tokenized  # whole words: a swapped token may cut one
    gaps = [0.0] * len(pool)
    by_length: dict[int, list[int]] = {}
    for i, texts in enumerate(pool):
        by_length.setdefault(texts.clean.shape[1], []).append(i)
    with loaded.running(grad=False) as net:
        for rows in by_length.values():  # one forward per length: clean rows, then corrupted rows
            ids = torch.cat([pool[i].clean for i in rows] + [pool[i].corrupted for i in rows])
            pooled = net(**loaded.inputs(ids)).last_hidden_state.mean(dim=1)  # (2·rows, d_model), as the metric pools
            clean, corrupted = pooled.split(len(rows))
            similarity = torch.nn.functional.cosine_similarity(corrupted, clean, dim=-1)
            for i, s in zip(rows, similarity.tolist()):
                gaps[i] = 1.0 - s  # the clean run's similarity to itself is 1
    best = int(np.argmax(gaps))
    chosen = pool[best]
    metric, definition = text_metric(loaded, chosen.clean_text, name="similarity")
    unscored = [f"{n} whose texts {what}" for n, what in ((len(tokenized) - len(pool), "tokenize to different lengths"),
                                                         (len(refused), "tokenize alike")) if n]
    why = (f"Similarity metric, because {reason}: the clean text is {chosen.clean_text!r}, the corrupted one "
           f"{chosen.corrupted_text!r}; {chosen.changed}. {_chosen(gaps, best)}"
           + (f" Not scored: {' and '.join(unscored)} of {len(candidates)} candidates." if unscored else ""))
    return Pair(chosen.clean, chosen.corrupted, metric, "similarity", definition, why, tuple(gaps))


def _chosen(gaps: Sequence[float], best: int) -> str:
    """How the pair was chosen among the candidates, from their gaps."""
    if len(gaps) == 1:
        return "It is the only candidate pair scored."
    others = sorted((g for i, g in enumerate(gaps) if i != best), reverse=True)
    return (f"Of {len(gaps)} candidate pairs it has the largest clean − corrupted gap of the metric, {gaps[best]:.4g} "
            f"(the next largest {others[0]:.4g}, the median {float(np.median(gaps)):.4g}).")
