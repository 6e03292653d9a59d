"""Which heads carry a behaviour: activation patching and attribution patching, per head and per position.

Given a clean input, a corrupted one of the same shape and a metric of the model's output
(higher = more of the behaviour), each head h gets the metric's recovery when the corrupted run
receives h's z from the clean run (denoising; Meng et al. 2022, Wang et al. 2022):

    effect_h = (metric(corrupted, z_h ← clean z_h) − metric(corrupted)) / (metric(clean) − metric(corrupted))

or, noising (``direction="noise"``), the share of that gap lost when the clean run receives h's corrupted z:

    effect_h = (metric(clean) − metric(clean, z_h ← corrupted z_h)) / (metric(clean) − metric(corrupted))

Either is 1 where the head carries the whole difference and 0 where it carries none. ``take`` patches
another of the head's tensors (q; k and v per key/value head; its pattern), ``positions`` some positions
only, or each position in turn (a (head × position) grid): ``headlab.analysis.positions``.

- ``activation_patching``: exactly, one forward per head (per head and position), plus the two baselines.
- ``attribution_patching`` (AtP; Nanda 2023, Kramár et al. 2024): the first-order estimate
  ``(x_source − x_base)_h · ∂metric/∂x_h`` at the run receiving the values (the corrupted run when
  denoising), summed over d and the batch at each position, for every head at once from two forwards
  and one backward.

Axis legend: z ``(batch, head, query_pos, d_head_v)``; an estimate's ``x`` is z, q, k or v.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from headlab import display
from headlab.analysis.positions import (
    EACH,
    PatchRuns,
    PositionGrid,
    Where,
    estimates,
    plot_positions,
    prepare,
    replace,
    row_label,
    save_effects,
    values_of,
    zero_delta,
)
from headlab.capture.cache import run_with_cache
from headlab.heads import HeadTable
from headlab.heads.scoped import intervening
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel
from headlab.models.handle import Inputs, given_tokenizer
from headlab.models.images import takes_pixels
from headlab.models.stream import has_logits

Metric = Callable[[Any], Tensor]  # the model's output -> a scalar tensor (differentiable for AtP)

__all__ = ["Metric", "PatchingResult", "activation_patching", "attribution_patching", "embedding_similarity",
           "logit_difference", "plot_patching"]


@dataclass(repr=False)
class PatchingResult(display.Shown):
    """Per-head patching effects, over the positions patched together or at each position.

    Attributes:
        method: "activation" (exact) or "attribution" (AtP estimate).
        table: columns ``effect`` (the normalised recovery, or loss when noising, above) and ``change``
            (the metric's change, unnormalised), one row per patched head (per key/value head for k and
            v); with ``positions="each"``, each row's cell of largest |effect| and its ``position``.
        clean_metric, corrupted_metric: the metric on the two unpatched runs.
        forwards, backwards: passes run.
        seconds: wall time.
        take: the head tensor patched: "z", "q", "k", "v" or "pattern".
        direction: "denoise" (the corrupted run received clean values) or "noise" (the reverse).
        positions: the positions patched together; None: every position; "each": one at a time.
        grid: with ``positions="each"``, the (head × position) effects; else None.
    """

    method: str
    table: HeadTable
    clean_metric: float
    corrupted_metric: float
    forwards: int
    backwards: int
    seconds: float
    take: str = "z"
    direction: str = "denoise"
    positions: Where = None
    grid: PositionGrid | None = None

    def to_dict(self) -> dict[str, Any]:
        document = {"method": self.method, "take": self.take, "direction": self.direction,
                    "positions": self.positions, "unit": "kv_head" if self.take in ("k", "v") else "head",
                    "clean_metric": self.clean_metric, "corrupted_metric": self.corrupted_metric,
                    "forwards": self.forwards, "backwards": self.backwards, "seconds": self.seconds,
                    "heads": self.table.to_dict()}
        if self.grid is not None:
            document["grid"] = self.grid.to_dict()
        return document

    def _parts(self) -> list[str]:
        return [display.Html(self.table.html(["effect"]) if self.grid is None else self.grid.html())]

    def _title(self) -> str:
        what = "key/value heads" if self.take in ("k", "v") else "heads"
        at = "" if self.grid is None else f" at each of {self.grid.n_positions} positions"
        return f"PatchingResult: {self.method} patching of {len(self.table)} {what}{at}"

    def _facts(self) -> list[tuple[str, object]]:
        if self.grid is None:
            largest = [f"{row_label(*h, self.take)} {display.short(self.table.value('effect', *h))}"
                       for h in self.table.top("effect", 3, absolute=True)]
        else:
            labels = self.grid.labels()
            largest = [f"{row_label(layer, head, self.take)} @ {labels[p]} "
                       f"{display.short(self.grid.value('effect', layer, head, p))}"
                       for layer, head, p in self.grid.top(3)]
        where = (f"positions {display.runs(self.positions)}" if isinstance(self.positions, list)
                 else "each position" if self.positions == EACH else "every position")
        how = "corrupted run ← clean values" if self.direction == "denoise" else "clean run ← corrupted values"
        clean, corrupted = display.short(self.clean_metric), display.short(self.corrupted_metric)
        return [("largest |effect|", ", ".join(largest)), ("patched", f"{self.take} at {where}; {self.direction} "
                                                                      f"({how})"),
                ("metric", f"clean {clean}, corrupted {corrupted}"),
                ("passes", f"{self.forwards} forwards, {self.backwards} backwards, {self.seconds:.2f} s")]


def activation_patching(model: HeadedModel | nn.Module, clean: Inputs, corrupted: Inputs, metric: Metric, *,
                        heads: HeadSelection = None, positions: Sequence[int] | str | None = None, take: str = "z",
                        direction: str = "denoise", tokenizer: Any = None,
                        progress: Callable[[int, int], None] | None = None) -> PatchingResult:
    """Patch each head's tensor from one run into the other, one head at a time, and measure the metric.

    Args:
        model: a ``HeadedModel`` or an attached model.
        clean, corrupted: inputs of the same shape (texts, a forward's keyword arguments or a tensor:
            ``HeadedModel.inputs``).
        metric: ``metric(output) -> scalar``; higher means more of the behaviour.
        heads: the query heads to patch (``headlab.heads.selection``); None for all. For k and v, the
            key/value heads they read, each once.
        positions: None: every position at once; a list of positions (negative from the end) patched
            together; "each": every position separately, a (head × position) ``grid``. Positions index
            the (padded) inputs, the same in every item of the batch: query positions for z, q and
            pattern, key positions for k and v.
        take: "z" (the head's output before the output projection), "q", "k", "v" (k and v are a
            key/value head's: with grouped-query attention, patching them patches what every query head
            of the group reads; a row per key/value head), or "pattern" (the head's attention weights
            at the chosen query positions come from the other run: there z = that pattern @ this run's v).
        direction: "denoise": the corrupted run receives the clean values; "noise": the clean run
            receives the corrupted ones (effect: the share of the clean − corrupted gap lost).
        tokenizer: deprecated: the handle holds the tokenizer (``headlab.attach(model, tokenizer=...)``).
        progress: called as ``progress(done, total)`` after each patched forward.

    Returns:
        A ``PatchingResult`` with method "activation": ``2 + heads × (1, or positions with "each")``
        forwards.

    Raises:
        ValueError: inputs of different shapes; clean and corrupted runs that score the same (the effect
            would divide by zero); an unknown take or direction; positions that are not None, "each" or a
            list of ints, out of range for the inputs' length, or repeated.
    """
    start = time.perf_counter()
    handle = given_tokenizer(model, tokenizer, "activation_patching")
    runs = prepare(handle, clean, corrupted, heads, take=take, direction=direction, positions=positions)
    net = handle.model
    with torch.no_grad():
        source_metric = float(metric(runs.source.output))
        # A pattern patch makes z from this run's v: the only change in the layer is the patched head's weights.
        base = run_with_cache(handle, runs.base_inputs, take="v", heads=runs.readers) if take == "pattern" else None
        base_metric = float(metric(net(**runs.base_inputs) if base is None else base.output))
        _denominator(*runs.clean_and_corrupted(source_metric, base_metric))
        slots: list[list[int] | None] = ([[p] for p in range(runs.length)] if runs.where == EACH
                                         else [runs.where if isinstance(runs.where, list) else None])
        total, changes = len(runs.units) * len(slots), []
        for unit in runs.units:
            values = values_of(take, unit, runs.source, base, handle.sites[unit.layer])  # (batch, 1, positions, d)
            for slot in slots:
                with intervening(handle) as sites:
                    replace(sites[unit.layer], take, unit, values, slot)
                    changes.append(float(metric(net(**runs.base_inputs))) - base_metric)
                if progress is not None:
                    progress(len(changes), total)
    return _result("activation", runs, np.asarray(changes), source_metric, base_metric, forwards=2 + total,
                   backwards=0, start=start)


def attribution_patching(model: HeadedModel | nn.Module, clean: Inputs, corrupted: Inputs, metric: Metric, *,
                         heads: HeadSelection = None, positions: Sequence[int] | str | None = None, take: str = "z",
                         direction: str = "denoise", tokenizer: Any = None) -> PatchingResult:
    """Estimate every head's patching effect from two forwards and one backward (AtP).

    Per head and position p the estimate is ``Σ_batch Σ_d (x_source − x_base)[p] · ∂metric/∂x[p]`` at
    the base run (the corrupted one when denoising, the clean one when noising), x the head's ``take``;
    a list of positions sums its positions, None sums them all, so the estimates of ``"each"`` add up to
    the whole-sequence one.

    Args:
        model, clean, corrupted, metric, heads, positions, direction, tokenizer: as
            ``activation_patching``; the metric must be differentiable.
        take: "z", "q", "k" or "v" (gradients through additive zeros on them; k and v per key/value head).

    Returns:
        A ``PatchingResult`` with method "attribution".

    Raises:
        ValueError: as ``activation_patching``; also a metric that does not depend on any head, and
            ``take="pattern"`` (no first-order estimate here: patch patterns with ``activation_patching``).
    """
    start = time.perf_counter()
    handle = given_tokenizer(model, tokenizer, "attribution_patching")
    if take == "pattern":
        raise ValueError("take='pattern' has no attribution estimate here (it would need the gradient with respect "
                         "to the attention weights); patch patterns exactly with activation_patching, or take "
                         "'z', 'q', 'k' or 'v'")
    runs = prepare(handle, clean, corrupted, heads, take=take, direction=direction, positions=positions)
    source_metric = float(metric(runs.source.output))
    with intervening(handle) as sites:
        # An additive zero on every patched layer's tensor: its gradient is ∂metric/∂x at the base run.
        deltas: dict[int, Tensor] = {}
        for unit in runs.units:
            if unit.layer not in deltas:
                deltas[unit.layer] = zero_delta(sites[unit.layer], take, runs.source[take, unit.layer, unit.reader])
        base_run = run_with_cache(handle, runs.base_inputs, take=take, heads=runs.readers, grad=True)
        value = metric(base_run.output)
        if not value.requires_grad:
            raise ValueError("the metric does not depend on the model's heads (no gradient): attribution patching "
                             "needs a differentiable metric of the output")
        grads = dict(zip(deltas, torch.autograd.grad(value, list(deltas.values()), allow_unused=True)))
    base_metric = float(value.detach())
    _denominator(*runs.clean_and_corrupted(source_metric, base_metric))
    changes: list[float] = []
    for unit in runs.units:
        grad = grads[unit.layer]
        # (batch, positions, d): the source's values minus the base run's
        difference = runs.source[take, unit.layer, unit.reader] - base_run[take, unit.layer, unit.reader].detach()
        changes.extend(estimates(difference, None if grad is None else grad[:, unit.head], runs.where))
    return _result("attribution", runs, np.asarray(changes), source_metric, base_metric, forwards=2, backwards=1,
                   start=start)


def _result(method: str, runs: PatchRuns, changes: np.ndarray, source_metric: float, base_metric: float, *,
            forwards: int, backwards: int, start: float) -> PatchingResult:
    """The result of ``changes`` (one per unit, or per unit and position with "each")."""
    clean_metric, corrupted_metric = runs.clean_and_corrupted(source_metric, base_metric)
    scale = _denominator(clean_metric, corrupted_metric)
    effects = changes / scale if runs.direction == "denoise" else -changes / scale  # the share lost, noising
    grid = runs.grid(effects, changes)
    table = (HeadTable([(unit.layer, unit.head) for unit in runs.units], {"effect": effects, "change": changes})
             if grid is None else grid.peaks())
    return PatchingResult(method, table, clean_metric, corrupted_metric, forwards=forwards, backwards=backwards,
                          seconds=time.perf_counter() - start, take=runs.take, direction=runs.direction,
                          positions=runs.where, grid=grid)


def logit_difference(answer: int, wrong: int, *, position: int = -1) -> Metric:
    """A metric for language models: mean over the batch of ``logits[answer] − logits[wrong]`` at ``position``.

    Args:
        answer, wrong: token ids.
        position: the query position read (default the last; inputs are unpadded).
    """
    def metric(output: Any) -> Tensor:
        logits = output.logits[:, position]  # (batch, vocab)
        return (logits[:, answer] - logits[:, wrong]).mean()

    return metric


def embedding_similarity(reference: Tensor) -> Metric:
    """A metric for encoders: cosine similarity of the mean-pooled last hidden state to ``reference``.

    Args:
        reference: ``(batch, d_model)`` or ``(d_model,)``, e.g. the clean run's pooled embedding.
    """
    def metric(output: Any) -> Tensor:
        pooled = output.last_hidden_state.mean(dim=1)  # (batch, d_model)
        return torch.nn.functional.cosine_similarity(pooled, reference.to(pooled), dim=-1).mean()

    return metric


def plot_patching(results: Sequence[PatchingResult], path: str | Path, *, title: str = "") -> Path:
    """One (layer × head) heatmap of ``effect`` per result, side by side, as a PNG; results of
    ``positions="each"`` draw one (head × position) heatmap each, tokens on the x axis (``plot_positions``).

    Raises:
        ValueError: results of ``positions="each"`` mixed with others.
    """
    grids = [r.grid for r in results]
    if any(g is not None for g in grids):
        if any(g is None for g in grids):
            raise ValueError("plot results of positions='each' apart from whole-sequence ones: one (head × position) "
                             "figure, or one (layer × head) figure")
        return plot_positions([(f"{r.method} patching of {r.take}", r.grid) for r in results if r.grid is not None],
                              path, title=title)
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(results), 3.6), layout="constrained")
    limit = max(float(np.nanmax(np.abs(r.table["effect"]))) for r in results) or 1.0
    for i, result in enumerate(results):
        ax = fig.add_subplot(1, len(results), i + 1)
        image = ax.imshow(result.table.grid("effect"), cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(result.table.layers)), [str(layer) for layer in result.table.layers])
        ax.set_title(f"{result.method} patching")
    return save_effects(fig, image, path, title=title)


def _denominator(clean_metric: float, corrupted_metric: float) -> float:
    """``metric(clean) − metric(corrupted)``, refused when it cannot normalise (the runs score alike)."""
    gap = clean_metric - corrupted_metric
    if not abs(gap) > 1e-9 * max(1.0, abs(clean_metric)):
        raise ValueError(f"the clean and corrupted runs score the same ({clean_metric:.6g} and {corrupted_metric:.6g}):"
                         " there is no behaviour to attribute; choose a corruption that changes the metric")
    return gap


def default_metric(model: HeadedModel) -> str:
    """The metric a model's kind means when none is named: ``logit-diff`` for a causal language model (a causal
    layer and logits), ``similarity`` for any other (an encoder, an encoder-decoder or a causal model without a
    language-model head: its hidden states)."""
    return "logit-diff" if any(site.causal for site in model.sites) and has_logits(model) else "similarity"


def text_metric(model: HeadedModel, clean: str, *, name: str | None = None, answer: str | None = None,
                wrong: str | None = None) -> tuple[Metric, str]:
    """The metric a command line means: ``logit-diff`` (causal LMs) or ``similarity`` (encoders).

    Args:
        model: a ``HeadedModel`` with a tokenizer (it turns answers into ids).
        clean: the clean text (``similarity`` compares with its pooled embedding).
        name: "logit-diff", "similarity", or None for the model's kind (``default_metric``).
        answer, wrong: for "logit-diff", the token the clean text predicts next and the one the
            corrupted text does; each must be one token of the model's vocabulary.

    Returns:
        ``(metric, description)``.

    Raises:
        ValueError: an unknown name, a logit difference without two one-token answers, or a
            model without logits.
    """
    name = name or default_metric(model)
    if name == "similarity":
        reference = run_with_cache(model, clean, take="z", heads={0: [0]}).output.last_hidden_state.mean(dim=1)
        what = "image" if takes_pixels(model.model) else "text"
        return embedding_similarity(reference), f"cosine similarity of the mean-pooled output to the clean {what}'s"
    if name != "logit-diff":
        raise ValueError(f"metric {name!r}; expected 'logit-diff' (language models) or 'similarity' (any model)")
    if answer is None or wrong is None:
        raise ValueError("the logit-diff metric needs --answer (the clean text's next token) and --wrong "
                         "(the corrupted text's)")
    if not has_logits(model):
        raise ValueError(f"the logit-diff metric needs logits; {model.architecture} outputs hidden states (no "
                         "language-model head): use the similarity metric, or a causal language model")
    ids = []
    for option, token in (("--answer", answer), ("--wrong", wrong)):
        pieces = model.tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(pieces) != 1:
            raise ValueError(f"{option}={token!r} is {len(pieces)} tokens for this tokenizer; give one token "
                             "(a leading space often matters)")
        ids.append(pieces[0])
    return logit_difference(*ids), f"logit({answer!r}) − logit({wrong!r}) at the last position"
