"""Which heads carry a behaviour: activation patching and attribution patching, per head.

Given a clean input, a corrupted one of the same shape and a metric of the model's output
(higher = more of the behaviour), each head h gets the metric's recovery when the corrupted run
receives h's z from the clean run (denoising; Meng et al. 2022, Wang et al. 2022):

    effect_h = (metric(corrupted, z_h ← clean z_h) − metric(corrupted)) / (metric(clean) − metric(corrupted))

- ``activation_patching``: exactly, one forward per head (plus the two baselines).
- ``attribution_patching`` (AtP; Nanda 2023, Kramár et al. 2024): the first-order estimate
  ``(z_clean − z_corrupted)_h · ∂metric/∂z_h`` at the corrupted run, for every head at once from
  two forwards and one backward.

Axis legend: z ``(batch, head, query_pos, d_head_v)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from headlab import display
from headlab.capture.cache import Cache, run_with_cache
from headlab.heads import HeadTable, head_label
from headlab.heads.scoped import intervening, patched
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel
from headlab.models.handle import Inputs, given_tokenizer

Metric = Callable[[Any], Tensor]  # the model's output -> a scalar tensor (differentiable for AtP)

__all__ = ["Metric", "PatchingResult", "activation_patching", "attribution_patching", "embedding_similarity",
           "logit_difference", "plot_patching"]


@dataclass(repr=False)
class PatchingResult(display.Shown):
    """Per-head patching effects.

    Attributes:
        method: "activation" (exact) or "attribution" (AtP estimate).
        table: columns ``effect`` (the normalised recovery above) and ``change`` (the metric's
            change, unnormalised), one row per patched head.
        clean_metric, corrupted_metric: the metric on the two unpatched runs.
        forwards, backwards: passes run.
        seconds: wall time.
    """

    method: str
    table: HeadTable
    clean_metric: float
    corrupted_metric: float
    forwards: int
    backwards: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "clean_metric": self.clean_metric, "corrupted_metric": self.corrupted_metric,
                "forwards": self.forwards, "backwards": self.backwards, "seconds": self.seconds,
                "heads": self.table.to_dict()}

    def _parts(self) -> list[str]:
        return [display.Html(self.table.html(["effect"]))]

    def _title(self) -> str:
        return f"PatchingResult: {self.method} patching of {len(self.table)} heads"

    def _facts(self) -> list[tuple[str, object]]:
        largest = [f"{head_label(*h)} {display.short(self.table.value('effect', *h))}"
                   for h in self.table.top("effect", 3, absolute=True)]
        clean, corrupted = display.short(self.clean_metric), display.short(self.corrupted_metric)
        return [("largest |effect|", ", ".join(largest)), ("metric", f"clean {clean}, corrupted {corrupted}"),
                ("passes", f"{self.forwards} forwards, {self.backwards} backwards, {self.seconds:.2f} s")]


def activation_patching(model: HeadedModel | nn.Module, clean: Inputs, corrupted: Inputs, metric: Metric, *,
                        heads: HeadSelection = None, tokenizer: Any = None,
                        progress: Callable[[int, int], None] | None = None) -> PatchingResult:
    """Patch each head's clean z into the corrupted run, one head at a time, and measure the metric.

    Args:
        model: a ``HeadedModel`` or an attached model.
        clean, corrupted: inputs of the same shape (texts, a forward's keyword arguments or a tensor:
            ``HeadedModel.inputs``).
        metric: ``metric(output) -> scalar``; higher means more of the behaviour.
        heads: the heads to patch (``headlab.heads.selection``); None for all.
        tokenizer: deprecated: the handle holds the tokenizer (``headlab.attach(model, tokenizer=...)``).
        progress: called as ``progress(done, total)`` after each head.

    Returns:
        A ``PatchingResult`` with method "activation".

    Raises:
        ValueError: inputs of different shapes, or clean and corrupted runs that score the same
            (the effect would divide by zero).
    """
    start = time.perf_counter()
    handle = given_tokenizer(model, tokenizer, "activation_patching")
    clean_run, corrupted_inputs, selection = _prepare(handle, clean, corrupted, heads)
    net = handle.model
    pairs = [(layer, h) for layer, hs in selection.items() for h in hs]
    with torch.no_grad():
        clean_metric = float(metric(clean_run.output))
        corrupted_metric = float(metric(net(**corrupted_inputs)))
        scale = _denominator(clean_metric, corrupted_metric)
        changes = []
        for done, (layer, h) in enumerate(pairs, 1):
            with patched(handle, {layer: [h]}, clean_run):
                changes.append(float(metric(net(**corrupted_inputs))) - corrupted_metric)
            if progress is not None:
                progress(done, len(pairs))
    changes_array = np.asarray(changes)
    return PatchingResult("activation", HeadTable(pairs, {"effect": changes_array / scale, "change": changes_array}),
                          clean_metric, corrupted_metric, forwards=2 + len(pairs), backwards=0,
                          seconds=time.perf_counter() - start)


def attribution_patching(model: HeadedModel | nn.Module, clean: Inputs, corrupted: Inputs, metric: Metric, *,
                         heads: HeadSelection = None, tokenizer: Any = None) -> PatchingResult:
    """Estimate every head's patching effect from two forwards and one backward (AtP).

    Args:
        model, clean, corrupted, metric, heads, tokenizer: as ``activation_patching``; the metric
            must be differentiable.

    Returns:
        A ``PatchingResult`` with method "attribution".

    Raises:
        ValueError: as ``activation_patching``; also a metric that does not depend on any head.
    """
    start = time.perf_counter()
    handle = given_tokenizer(model, tokenizer, "attribution_patching")
    clean_run, corrupted_inputs, selection = _prepare(handle, clean, corrupted, heads)
    clean_metric = float(metric(clean_run.output))
    with intervening(handle) as sites:
        # An additive zero on every patched layer's z: its gradient is ∂metric/∂z at the corrupted run.
        deltas = {}
        for layer in selection:
            z = clean_run["z", layer, selection[layer][0]]  # (batch, query_pos, d_head_v)
            deltas[layer] = torch.zeros(z.shape[0], sites[layer].n_heads, *z.shape[1:], dtype=z.dtype,
                                        device=z.device, requires_grad=True)
            sites[layer].delta = deltas[layer]
        corrupted_run = run_with_cache(handle, corrupted_inputs, take="z", heads=selection, grad=True)
        value = metric(corrupted_run.output)
        if not value.requires_grad:
            raise ValueError("the metric does not depend on the model's heads (no gradient): attribution patching "
                             "needs a differentiable metric of the output")
        grads = torch.autograd.grad(value, [deltas[layer] for layer in selection], allow_unused=True)
    corrupted_metric = float(value.detach())
    scale = _denominator(clean_metric, corrupted_metric)
    pairs, estimates = [], []
    for (layer, hs), grad in zip(selection.items(), grads):
        for h in hs:
            difference = clean_run["z", layer, h] - corrupted_run["z", layer, h].detach()  # (batch, q, d_head_v)
            estimate = 0.0 if grad is None else float((difference * grad[:, h]).sum())
            pairs.append((layer, h))
            estimates.append(estimate)
    estimates_array = np.asarray(estimates)
    return PatchingResult("attribution", HeadTable(pairs, {"effect": estimates_array / scale,
                                                           "change": estimates_array}),
                          clean_metric, corrupted_metric, forwards=2, backwards=1, seconds=time.perf_counter() - start)


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
    """One (layer × head) heatmap of ``effect`` per result, side by side, as a PNG."""
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
    fig.colorbar(image, ax=fig.axes, label="effect (share of the clean − corrupted gap)")
    if title:
        fig.suptitle(title, fontsize="small")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def _prepare(model: HeadedModel, clean: Inputs, corrupted: Inputs,
             heads: HeadSelection) -> tuple[Cache, dict[str, Any], dict[int, list[int]]]:
    """The clean run's z, the corrupted run's inputs (checked against the clean ones) and the selection."""
    selection = model.heads(heads)
    clean_run = run_with_cache(model, clean, take="z", heads=selection)
    corrupted_inputs = model.inputs(corrupted)
    a, b = _shape(clean_run.inputs), _shape(corrupted_inputs)
    if a != b:
        raise ValueError(f"clean and corrupted inputs must have the same shape to patch between them: clean {a},"
                         f" corrupted {b} (batch, tokens); reword one so both have as many tokens")
    return clean_run, corrupted_inputs, selection


def _shape(inputs: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape of a forward's first tensor argument (the input ids of a transformers model)."""
    first = inputs["input_ids"] if "input_ids" in inputs else next(v for v in inputs.values() if isinstance(v, Tensor))
    return tuple(first.shape)


def _denominator(clean_metric: float, corrupted_metric: float) -> float:
    """``metric(clean) − metric(corrupted)``, refused when it cannot normalise (the runs score alike)."""
    gap = clean_metric - corrupted_metric
    if not abs(gap) > 1e-9 * max(1.0, abs(clean_metric)):
        raise ValueError(f"the clean and corrupted runs score the same ({clean_metric:.6g} and {corrupted_metric:.6g}):"
                         " there is no behaviour to attribute; choose a corruption that changes the metric")
    return gap


def text_metric(model: HeadedModel, clean: str, *, name: str | None = None, answer: str | None = None,
                wrong: str | None = None) -> tuple[Metric, str]:
    """The metric a command line means: ``logit-diff`` (causal LMs) or ``similarity`` (encoders).

    Args:
        model: a ``HeadedModel`` with a tokenizer (it turns answers into ids).
        clean: the clean text (``similarity`` compares with its pooled embedding).
        name: "logit-diff", "similarity", or None for the model's kind (causal: logit-diff).
        answer, wrong: for "logit-diff", the token the clean text predicts next and the one the
            corrupted text does; each must be one token of the model's vocabulary.

    Returns:
        ``(metric, description)``.

    Raises:
        ValueError: an unknown name, a logit difference without two one-token answers, or a
            model without logits.
    """
    causal = any(site.causal for site in model.sites)
    name = name or ("logit-diff" if causal else "similarity")
    if name == "similarity":
        reference = run_with_cache(model, clean, take="z", heads={0: [0]}).output.last_hidden_state.mean(dim=1)
        return embedding_similarity(reference), "cosine similarity of the mean-pooled output to the clean text's"
    if name != "logit-diff":
        raise ValueError(f"metric {name!r}; expected 'logit-diff' (language models) or 'similarity' (any model)")
    if answer is None or wrong is None:
        raise ValueError("the logit-diff metric needs --answer (the clean text's next token) and --wrong "
                         "(the corrupted text's)")
    ids = []
    for option, token in (("--answer", answer), ("--wrong", wrong)):
        pieces = model.tokenizer(token, add_special_tokens=False)["input_ids"]
        if len(pieces) != 1:
            raise ValueError(f"{option}={token!r} is {len(pieces)} tokens for this tokenizer; give one token "
                             "(a leading space often matters)")
        ids.append(pieces[0])
    return logit_difference(*ids), f"logit({answer!r}) − logit({wrong!r}) at the last position"
