"""What heads are worth: gradient and ablation importance, and pruning curves (Michel et al. 2019).

Michel, Levy & Neubig 2019 ("Are Sixteen Heads Really Better than One?") score head h by
``I_h = Σ_batches |∂L/∂ξ_h|`` where ``ξ_h`` is a gate on the head's output held at 1, normalise
the scores per layer by their ℓ2 norm, and prune heads least important first. Here the gate is
each attention site's ``head_mask`` (``headlab.models.AttentionSite``); exact single-head ablation
(the loss increase when one head is masked) is the slow reference the gradient approximates to
first order.

Conventions:
    heads     ``(layer, head)`` pairs, layers in order, heads in each layer's current numbering.
    loss_fn   ``loss_fn(model, batch) -> scalar Tensor`` where ``model`` is the ``nn.Module``.
    metric_fn ``metric_fn(model) -> float``.

Task helpers for the two model kinds headlab loads: sentence similarity on the bundled pairs for
an encoder such as MiniLM (``embed``, ``pair_batches``, ``paraphrase_loss``,
``retrieval_metric``, ``fidelity_metric``) and next-token cross-entropy for a causal LM
(``lm_batches``, ``causal_lm_loss``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from headlab import display
from headlab.heads import HeadTable, head_label, intervening, mask
from headlab.models import HeadedModel, headed
from headlab.models.seq2seq import with_decoder

__all__ = [
    "ImportanceResult", "PruningCurve", "ablation_importance", "causal_lm_loss", "embed", "fidelity_metric",
    "gradient_importance", "lm_batches", "pair_batches", "paraphrase_loss", "plot_pruning_curve",
    "pruning_curve", "retrieval_metric", "spearman",
]

LossFn = Callable[[nn.Module, Any], Tensor]
MAX_LENGTH = 256  # pieces per sentence of the similarity tasks (the bundled pairs are far shorter)
LM_MAX_LENGTH = 128  # pieces per text of the next-token task
FLAT = 0.01  # a pruning curve that never moves more than this share of its unpruned value is flat


@dataclass(repr=False)
class ImportanceResult(display.Shown):
    """One score per head.

    Attributes:
        table: a row per head, columns ``score`` (normalised per layer (ℓ2) when ``normalized``) and
            ``raw`` (before normalisation).
        method: ``"gradient"`` or ``"ablation"``.
        normalized: whether ``score`` is per-layer normalised.
        batches: batches the scores sum over.
        seconds: wall time.
    """

    table: HeadTable
    method: str
    normalized: bool
    batches: int
    seconds: float

    def order(self) -> list[tuple[int, int]]:
        """Heads least important first by ``score`` (ties keep table order)."""
        return self.table.top("score", largest=False)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "normalized": self.normalized, "batches": self.batches,
                "seconds": self.seconds, **self.table.to_dict()}

    def _parts(self) -> list[str]:
        return [display.Html(self.table.html(["score"]))]

    def _title(self) -> str:
        return f"ImportanceResult: {self.method} importance of {len(self.table)} heads"

    def _facts(self) -> list[tuple[str, object]]:
        def named(heads: list[tuple[int, int]]) -> str:
            return ", ".join(f"{head_label(*h)} {display.short(self.table.value('score', *h))}" for h in heads)

        order = self.order()
        return [("most important", named(order[::-1][:3])), ("least important", named(order[:3])),
                ("score", "normalised per layer (ℓ2)" if self.normalized else "raw"),
                ("batches", self.batches), ("time", f"{self.seconds:.2f} s")]


def gradient_importance(
    model: HeadedModel | nn.Module, batches: Iterable[Any], loss_fn: LossFn, *, normalize: bool = True,
) -> ImportanceResult:
    """Michel et al.'s head importance: ``Σ_batches |∂loss/∂gate_h|`` at gate = 1.

    One forward and backward per batch, the absolute gradient taken per batch (as Michel et al.'s
    code does with a batch-mean loss). Only the gates' gradients are computed
    (``torch.autograd.grad``): parameters' ``.grad`` are left untouched. The model runs in eval
    mode; its mode and every module's ``head_mask`` are restored afterwards, on error too.

    Args:
        model: a ``HeadedModel`` or an attached model.
        batches: anything ``loss_fn`` takes, one item per forward.
        loss_fn: ``loss_fn(model, batch) -> scalar`` (differentiable).
        normalize: divide each layer's scores by their ℓ2 norm (Michel et al. §4.1).

    Returns:
        Scores per head.
    """
    start = time.perf_counter()
    handle = headed(model)
    gates = [torch.ones(n, dtype=handle.dtype, device=handle.device, requires_grad=True) for n in handle.n_heads]
    totals = [torch.zeros(n, dtype=torch.float64) for n in handle.n_heads]
    count = 0
    with intervening(handle) as sites, handle.running() as net:
        for site, gate in zip(sites, gates):
            site.head_mask = gate
        for batch in batches:
            loss = loss_fn(net, batch)
            grads = torch.autograd.grad(loss, gates, allow_unused=True)  # None: the loss does not reach a layer
            for total, grad in zip(totals, grads):
                if grad is not None:
                    total += grad.detach().abs().double().cpu()
            count += 1
    return _result(totals, "gradient", normalize, count, start)


def ablation_importance(
    model: HeadedModel | nn.Module, batches: Iterable[Any], loss_fn: LossFn, *, normalize: bool = False,
) -> ImportanceResult:
    """Exact single-head ablation: ``Σ_batches (loss with head h gated to 0 − loss)``.

    One forward per batch and head (plus one baseline), gating with ``head_mask`` so that the
    model's persistent interventions are untouched; a head already masked scores exactly 0.

    Args:
        model: a ``HeadedModel`` or an attached model.
        batches: anything ``loss_fn`` takes (iterated once; materialised).
        loss_fn: ``loss_fn(model, batch) -> scalar``.
        normalize: divide each layer's scores by their ℓ2 norm.

    Returns:
        Loss increases per head (negative where removing a head helps).
    """
    start = time.perf_counter()
    handle = headed(model)
    batches = list(batches)
    totals = [torch.zeros(n, dtype=torch.float64) for n in handle.n_heads]
    with intervening(handle) as sites, handle.running(grad=False) as net:
        for site in sites:  # the same code path (a gate of ones) for baseline and ablation
            site.head_mask = torch.ones(site.n_heads, dtype=handle.dtype, device=handle.device)
        for batch in batches:
            base = float(loss_fn(net, batch))
            for site, total in zip(sites, totals):
                ones = site.head_mask
                assert ones is not None  # the gate of ones set above
                for h in range(len(total)):
                    site.head_mask = ones.index_fill(0, torch.tensor([h], device=ones.device), 0.0)
                    total[h] += float(loss_fn(net, batch)) - base
                site.head_mask = ones
    return _result(totals, "ablation", normalize, len(batches), start)


def _result(totals: list[Tensor], method: str, normalize: bool, count: int, start: float) -> ImportanceResult:
    heads = [(i, h) for i, total in enumerate(totals) for h in range(len(total))]
    raw = torch.cat(totals).numpy()
    scores = torch.cat([t / (t.norm() + 1e-20) for t in totals]).numpy() if normalize else raw.copy()
    return ImportanceResult(table=HeadTable(heads, {"score": scores, "raw": raw}), method=method,
                            normalized=normalize, batches=count, seconds=time.perf_counter() - start)


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation; ties get their average rank (as ``scipy.stats.spearmanr``).

    Raises:
        ValueError: lengths differ or fewer than 2 values. A constant input gives NaN.
    """
    x, y = np.asarray(a, dtype=np.float64).ravel(), np.asarray(b, dtype=np.float64).ravel()
    if x.shape != y.shape or x.size < 2:
        raise ValueError(f"spearman needs two equally long sequences of ≥ 2 values, got {x.size} and {y.size}")
    rx, ry = _average_ranks(x), _average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denominator = np.sqrt((rx**2).sum() * (ry**2).sum())
    return float((rx * ry).sum() / denominator) if denominator > 0 else float("nan")


def _average_ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_x)) + 1]
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x))
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = (s + e + 1) / 2  # mean of the 1-based ranks s+1 … e
    return ranks


@dataclass(repr=False)
class PruningCurve(display.Shown):
    """A metric as heads are removed, least important first.

    Attributes:
        fractions: fraction of all heads removed at each step (0 first).
        removed: heads removed at each step.
        values: the metric at each step.
    """

    fractions: list[float]
    removed: list[int]
    values: list[float]

    def flat(self, tolerance: float = FLAT) -> bool:
        """Whether the metric never moves more than ``tolerance`` × |its unpruned value| (or ``tolerance``
        when that value is 0): the task cannot tell the heads apart, and the curve says nothing about them."""
        scale = abs(self.values[0]) or 1.0
        return max(self.values) - min(self.values) <= tolerance * scale

    def to_dict(self) -> dict[str, Any]:
        return {"fractions": self.fractions, "removed": self.removed, "values": self.values, "flat": self.flat()}

    def _parts(self) -> list[str]:
        rows = [[removed, f"{fraction:.0%}", value] for removed, fraction, value in
                zip(self.removed, self.fractions, self.values)]
        return [display.table(["heads removed", "share", "metric"], rows)]

    def _title(self) -> str:
        removed = max(self.fractions, default=0)
        return f"PruningCurve: {len(self.values)} steps, up to {removed:.0%} of the heads removed"

    def _facts(self) -> list[tuple[str, object]]:
        if not self.values:
            return [("metric", "–")]
        flat = " (flat: the task cannot tell the heads apart)" if self.flat() else ""
        return [("metric", f"{display.short(self.values[0])} → {display.short(self.values[-1])}{flat}")]


def pruning_curve(
    model: HeadedModel | nn.Module,
    order: Sequence[tuple[int, int]] | ImportanceResult,
    metric_fn: Callable[[Any], float],
    *,
    step: float = 0.1,
) -> PruningCurve:
    """Mask heads in ``order`` in steps of ``step`` of all heads and evaluate ``metric_fn`` each time.

    Masking (``headlab.heads.mask``) stands in for pruning: outputs are the same (tested in
    ``heads``) and it is cheap to undo. Every layer's interventions are put back exactly as they
    were afterwards, on error too.

    Args:
        model: a ``HeadedModel`` or an attached model; ``metric_fn`` receives it as given.
        order: heads least important first (all of them, or a prefix), or an ``ImportanceResult``.
        metric_fn: ``metric_fn(model) -> float``.
        step: fraction of the model's heads removed per step, in (0, 1].

    Returns:
        Fractions 0, step, 2·step … up to 1 (or all of ``order``) and the metric at each.

    Raises:
        ValueError: step is out of range.
    """
    if not 0 < step <= 1:
        raise ValueError(f"step={step!r} must be in (0, 1]")
    heads = order.order() if isinstance(order, ImportanceResult) else [(layer, h) for layer, h in order]
    handle = headed(model)
    sites = handle.sites
    n_total = sum(site.n_heads for site in sites)
    saved = [(site.scale, site.shift) for site in sites]
    counts = sorted({min(len(heads), round(k * step * n_total)) for k in range(int(np.ceil(1 / step - 1e-9)) + 1)})
    fractions, removed, values = [], [], []
    try:
        for k in counts:
            for site, (scale_, shift) in zip(sites, saved):
                site.set_affine(scale_, shift)
            if k:
                mask(handle, heads[:k])
            fractions.append(k / n_total)
            removed.append(k)
            values.append(float(metric_fn(model)))
    finally:
        for site, (scale_, shift) in zip(sites, saved):
            site.set_affine(scale_, shift)
    return PruningCurve(fractions=fractions, removed=removed, values=values)


def plot_pruning_curve(
    curves: PruningCurve | dict[str, PruningCurve], path: str | os.PathLike[str], *, metric: str = "metric",
) -> Path:
    """Plot one or several (labelled) pruning curves to a PNG; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {"": curves} if isinstance(curves, PruningCurve) else curves
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, curve in curves.items():
        ax.plot(np.asarray(curve.fractions) * 100, curve.values, marker="o", label=label or None)
    ax.set_xlabel("heads masked (%), least important first")
    ax.set_ylabel(metric)
    if any(curves):
        ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# --- sentence similarity (encoders such as MiniLM) ------------------------------------------------

def _mean_pool(net: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Mean of the last hidden states over real tokens, L2-normalised (sentence-transformers'
    all-MiniLM-L6-v2 recipe); differentiable. An encoder-decoder's decoder reads the source shifted
    (``headlab.models.seq2seq``) and its positions are pooled. Returns ``(batch, d_model)``."""
    kwargs = with_decoder(net, {"input_ids": input_ids, "attention_mask": attention_mask})
    hidden = net(**kwargs).last_hidden_state  # (batch, pos, d_model)
    weights = kwargs.get("decoder_attention_mask", attention_mask).to(hidden.dtype)[..., None]
    pooled = (hidden * weights).sum(1) / weights.sum(1).clamp_min(1e-9)
    return F.normalize(pooled, dim=-1)


def _encode(tokenizer: Any, texts: Sequence[str], device: torch.device, max_length: int | None = MAX_LENGTH) -> dict:
    encoded = tokenizer(list(texts), padding=True, truncation=max_length is not None, max_length=max_length,
                        return_tensors="pt")
    return {"input_ids": encoded["input_ids"].to(device), "attention_mask": encoded["attention_mask"].to(device)}


def embed(model: HeadedModel | nn.Module, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 64,
          max_length: int = MAX_LENGTH) -> Tensor:
    """Sentence embeddings: mean pooling over real tokens, then L2 normalisation.

    Args:
        max_length: longer texts are cut to this many pieces (special tokens included).

    Returns:
        ``(len(texts), d_model)`` unit vectors (no gradient).
    """
    handle = headed(model)
    net, device = handle.model, handle.device
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            encoded = _encode(tokenizer, texts[start:start + batch_size], device, max_length)
            out.append(_mean_pool(net, **encoded))
    return torch.cat(out)


def pair_batches(tokenizer: Any, pairs: Sequence[Any], *, batch_size: int = 32, device: str = "cpu",
                 max_length: int = MAX_LENGTH) -> list[dict]:
    """Tokenised batches of sentence pairs for ``paraphrase_loss``.

    Args:
        pairs: objects with ``sentence_a`` and ``sentence_b`` (``headlab.data.pairs.Pair``), or 2-tuples.
        max_length: longer sentences are cut to this many pieces (special tokens included).
    """
    texts = [(p.sentence_a, p.sentence_b) if hasattr(p, "sentence_a") else tuple(p) for p in pairs]
    return [
        {"a": _encode(tokenizer, [a for a, _ in texts[s:s + batch_size]], torch.device(device), max_length),
         "b": _encode(tokenizer, [b for _, b in texts[s:s + batch_size]], torch.device(device), max_length)}
        for s in range(0, len(texts), batch_size)
    ]


def paraphrase_loss(net: nn.Module, batch: dict, *, scale: float = 20.0) -> Tensor:
    """In-batch contrastive loss over paraphrase pairs: cross-entropy of ``scale · cos(a_i, b_j)``
    with each ``a_i``'s own ``b_i`` as the target and the batch's other ``b_j`` as negatives.

    This is the loss all-MiniLM-L6-v2 was trained with (sentence-transformers'
    MultipleNegativesRankingLoss, scale 20). The simpler ``1 − cos(a_i, b_i)`` is not used:
    a model that maps every sentence to one vector minimises it, so removing heads (which
    pushes embeddings together) often *lowers* it and ablation scores turn negative.
    """
    a, b = _mean_pool(net, **batch["a"]), _mean_pool(net, **batch["b"])  # (batch, d_model) unit vectors
    scores = scale * a @ b.T  # (batch, batch)
    return F.cross_entropy(scores, torch.arange(len(scores), device=scores.device))


def retrieval_metric(tokenizer: Any, pairs: Sequence[Any], *, max_length: int = MAX_LENGTH) -> Callable[[Any], float]:
    """A ``metric_fn``: pair-retrieval accuracy. For each paraphrase pair's ``sentence_a``, is its
    ``sentence_b`` the nearest (cosine) among every pair's ``sentence_b``?

    On the bundled pairs shared words alone find most partners, so the accuracy may not move
    while heads are masked (``PruningCurve.flat``)."""
    a_texts = [p.sentence_a for p in pairs if p.label == "paraphrase"]
    targets = torch.tensor([i for i, p in enumerate(pairs) if p.label == "paraphrase"])
    b_texts = [p.sentence_b for p in pairs]

    def accuracy(model: Any) -> float:
        a = embed(model, tokenizer, a_texts, max_length=max_length)
        scores = a @ embed(model, tokenizer, b_texts, max_length=max_length).T  # (paraphrases, pairs)
        return float((scores.argmax(-1) == targets).double().mean())

    return accuracy


def fidelity_metric(model: HeadedModel | nn.Module, tokenizer: Any, texts: Sequence[str], *,
                    max_length: int = MAX_LENGTH) -> Callable[[Any], float]:
    """A ``metric_fn``: mean cosine of each text's embedding to the embedding the model gives it
    *now* (call this before masking anything: the unpruned reference)."""
    reference = embed(model, tokenizer, texts, max_length=max_length)

    def fidelity(current: Any) -> float:
        return float((embed(current, tokenizer, texts, max_length=max_length) * reference).sum(-1).mean())

    return fidelity


# --- next-token prediction (causal LMs) -----------------------------------------------------------

def lm_batches(tokenizer: Any, texts: Sequence[str], *, batch_size: int = 8, max_length: int = LM_MAX_LENGTH,
               device: str = "cpu") -> list[dict]:
    """Tokenised, right-padded batches for ``causal_lm_loss``."""
    if tokenizer.pad_token is None:  # GPT-2-style tokenizers have none; padding is masked out anyway
        tokenizer.pad_token = tokenizer.eos_token
    return [_encode(tokenizer, texts[s:s + batch_size], torch.device(device), max_length)
            for s in range(0, len(texts), batch_size)]


def causal_lm_loss(net: nn.Module, batch: dict) -> Tensor:
    """Mean next-token cross-entropy over real tokens (padding excluded)."""
    logits = net(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (batch, pos, vocab)
    targets = batch["input_ids"][:, 1:].masked_fill(batch["attention_mask"][:, 1:] == 0, -100)
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
