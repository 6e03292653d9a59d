"""Edge patching, exact, and edge attribution patching (EAP, EAP-IG), its estimate from a few passes.

An edge sender → receiver (``headlab.circuits.graph``) carries what the sender adds to the stream
into what the receiver reads. **Edge patching** measures it exactly: the corrupted run, in which the
receiver alone reads the stream plus the sender's clean − corrupted difference,

    score(s → r) = metric(corrupted, r reads x_r + (a_s(clean) − a_s(corrupted))) − metric(corrupted)

with ``a_s`` the sender's result (or, for the input, the stream before the first layer) and ``x_r``
the stream the receiver reads. The receiver's q, k or v come from its own stream by the model's own
norm, projections and positions (``headlab.circuits.inputs``); one forward per edge.

**EAP** (Syed et al. 2023) estimates every edge at once, to first order, at the corrupted run:

    score(s → r) ≈ (a_s(clean) − a_s(corrupted)) · ∂metric/∂x_r

where ∂metric/∂x_r is the gradient reaching the stream through receiver r's input only: the gradient
at r's q (or k, v) carried back to the stream through the model's own norm and projection modules
(``headlab.circuits.gradients``: by the projections' own weights, a head's rows each). One clean forward,
one corrupted forward and backward, and the products: the cost does not grow with the edges.

**EAP-IG** (Hanna et al. 2024) averages the gradient over ``steps`` points between the corrupted and
the clean input (every embedding's output interpolated, at the midpoints α = (k − ½)/steps), which
follows the metric where a single gradient does not.

Senders add to the stream as they do in a pre-norm residual model (GPT-2, LLaMA, …): the edge adds
the difference to the receiver's stream as it is. In a post-norm model (BERT) a head's output is
normalised before later layers read it; the edge still adds it unnormalised (say so when you read a
BERT's edges: compare edges into one layer, not their absolute sizes).

Axis legend:
    stream, gradient  (batch, pos, d_model)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from headlab.circuits.gradients import projection_calls, receiver_gradients
from headlab.circuits.graph import (
    INPUT,
    OUTPUT,
    ROLES,
    Edge,
    EdgeScores,
    check_edges,
    graph_edges,
    graph_senders,
    receiving,
)
from headlab.circuits.inputs import own_inputs
from headlab.circuits.runs import Metric, Run, difference, interpolated, prepare
from headlab.heads.scoped import intervening
from headlab.layer.taps import Tap, TapOutput
from headlab.models import AttentionSite, HeadedModel, headed
from headlab.models.handle import Inputs
from headlab.models.stream import Stream

METHODS = ("eap", "eap-ig")

__all__ = ["METHODS", "edge_attribution", "edge_patching"]


def edge_patching(model: HeadedModel, clean: Inputs, corrupted: Inputs, metric: Metric, *,
                  edges: Sequence[Edge] | None = None, roles: Sequence[str] = ROLES, output: bool = True,
                  progress: Callable[[int, int], None] | None = None) -> EdgeScores:
    """Score edges exactly: one corrupted forward per edge, the edge carrying the clean value (see the module
    docstring).

    Args:
        model: a ``HeadedModel`` or an attached model.
        clean, corrupted: inputs of the same shape (``HeadedModel.inputs``).
        metric: ``metric(output) -> scalar``; higher means more of the behaviour.
        edges: the edges to score; None for every edge of the graph (``graph_edges(model, roles=,
            output=)``).
        roles, output: the receivers of the whole graph, when ``edges`` is None.
        progress: called as ``progress(done, total)`` after each edge.

    Returns:
        ``EdgeScores`` with method "edge patching".

    Raises:
        ValueError: inputs of different shapes, runs that score the same, or an edge the model does not have.
    """
    start = time.perf_counter()
    handle = headed(model)
    stream, clean_run, corrupted_run = prepare(handle, clean, corrupted, metric)
    edges = list(graph_edges(handle, roles=roles, output=output) if edges is None else edges)
    check_edges(handle, edges)
    net, scores = handle.model, []
    with handle.running(grad=False):
        for done, edge in enumerate(edges, 1):
            added = difference(clean_run, corrupted_run, edge.sender)
            scores.append(float(metric(_with_edge(handle, stream, net, corrupted_run, edge, added)))
                          - corrupted_run.metric)
            if progress is not None:
                progress(done, len(edges))
    return EdgeScores("edge patching", edges, np.asarray(scores), clean_run.metric, corrupted_run.metric,
                      forwards=2 + len(edges), backwards=0, seconds=time.perf_counter() - start)


def edge_attribution(model: HeadedModel, clean: Inputs, corrupted: Inputs, metric: Metric, *,
                     method: str = "eap", steps: int = 5, roles: Sequence[str] = ROLES,
                     output: bool = True) -> EdgeScores:
    """Estimate every edge's score from gradients: EAP, or EAP with integrated gradients (see the module docstring).

    Args:
        model: a ``HeadedModel`` or an attached model.
        clean, corrupted: inputs of the same shape.
        metric: a differentiable ``metric(output) -> scalar``.
        method: "eap" or "eap-ig".
        steps: EAP-IG's points between the corrupted and clean inputs (ignored by EAP).
        roles, output: the receivers scored (every edge into them).

    Returns:
        ``EdgeScores`` with method "eap" or "eap-ig" (``details["steps"]`` for EAP-IG).

    Raises:
        ValueError: an unknown method, steps < 1, inputs of different shapes, runs that score the same, or
            a metric without a gradient.
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r}; expected one of {METHODS}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}; expected a positive int")
    start = time.perf_counter()
    handle = headed(model)
    stream, clean_run, corrupted_run = prepare(handle, clean, corrupted, metric, take=("result",))
    edges = graph_edges(handle, roles=roles, output=output)
    alphas = [0.0] if method == "eap" else [(k + 0.5) / steps for k in range(steps)]
    senders = graph_senders(handle)
    # what each sender sends differently, (senders, batch · pos · d_model); the runs' results are not needed after
    sent = torch.cat([difference(clean_run, corrupted_run, INPUT).flatten()[None], *(
        (clean_run.results[site.layer] - corrupted_run.results[site.layer]).transpose(0, 1).flatten(1)
        for site in handle.sites)])  # the input, then every head in layer order
    for run in (clean_run, corrupted_run):
        run.results.clear()
    # receiver group (layer, role) or OUTPUT -> (senders, receivers): the products, summed over the steps; each
    # step's gradients are multiplied as they come and let go, never kept for every receiver at once
    products: dict[tuple[int, str] | str, Tensor] = {}
    apart: dict[int, bool] = {}  # each layer's heads checked apart once, at the first step
    for alpha in alphas:
        _receiver_products(handle, stream, clean_run, corrupted_run, metric, alpha, roles, sent, products, apart)
    row = {s: i for i, s in enumerate(senders)}
    scores = np.zeros(len(edges))
    mean = {key: (value / len(alphas)).double().cpu().numpy() for key, value in products.items()}
    for i, edge in enumerate(edges):
        if edge.receiver == OUTPUT:
            scores[i] = mean[OUTPUT][row[edge.sender], 0]
        else:
            layer, head, role = receiving(edge.receiver)
            scores[i] = mean[(layer, role)][row[edge.sender], head]
    passes = len(alphas)
    return EdgeScores(method, edges, scores, clean_run.metric, corrupted_run.metric,
                      forwards=2 + passes, backwards=passes, seconds=time.perf_counter() - start,
                      details={"steps": steps} if method == "eap-ig" else None)


def _receiver_products(model: HeadedModel, stream: Stream, clean: Run, corrupted: Run, metric: Metric,
                       alpha: float, roles: Sequence[str], sent: Tensor,
                       products: dict[tuple[int, str] | str, Tensor], apart: dict[int, bool]) -> None:
    """One forward and backward at the corrupted run (its embeddings moved ``alpha`` of the way to the clean
    run's): the gradient reaching each receiver's stream through its input alone, multiplied with what each
    sender sends differently (``sent``, ``(senders, batch · pos · d_model)``) and added into ``products``
    (``{(layer, role): (senders, heads), OUTPUT: (senders, 1)}``).
    """
    sites = model.sites
    streams: dict[int | str, Tensor] = {}
    taken: dict[int, dict[str, Tensor]] = {}

    with intervening(model), model.running(grad=True) as net:
        deltas: dict[int, dict[str, Tensor]] = {}
        for site in sites:
            batch, positions, _ = corrupted.streams[0].shape
            like = corrupted.streams[0]
            deltas[site.layer] = {}
            for role in roles:
                heads = site.n_heads if role == "q" else site.n_kv_heads
                d = site.d_head if role in ("q", "k") else site.d_head_v
                deltas[site.layer][role] = torch.zeros(batch, heads, positions, d, dtype=like.dtype,
                                                       device=like.device, requires_grad=True)
            site.input_deltas = dict(deltas[site.layer])
            site.tap = _taking(taken, site, roles)
        with interpolated(model, clean, corrupted, alpha), stream.hooked(record=streams), \
                projection_calls(sites) as calls:
            value = metric(net(**corrupted.inputs))
        if not value.requires_grad:
            raise ValueError("the metric does not depend on the model's heads (no gradient): edge attribution needs a "
                             "differentiable metric of the output")
        wrt = [deltas[s.layer][r] for s in sites for r in roles]
        grads = torch.autograd.grad(value, [*wrt, streams["final"]], retain_graph=True, allow_unused=True)
        final = grads[-1]
        if final is not None:
            _add(products, OUTPUT, sent @ final.detach().reshape(-1, 1).to(sent.dtype))
        by_site = iter(grads[:-1])
        for site in sites:
            at_inputs = {role: next(by_site) for role in roles}
            for role, gradient in receiver_gradients(site, streams[site.layer], taken[site.layer], at_inputs,
                                                     calls[site.layer], apart=apart).items():
                # only the input and earlier layers' heads send to this layer: their rows; the rest stay 0
                earlier = 1 + sum(s.n_heads for s in sites[: site.layer])
                block = torch.zeros(sent.shape[0], gradient.shape[0], dtype=sent.dtype, device=sent.device)
                block[:earlier] = sent[:earlier] @ gradient.reshape(gradient.shape[0], -1).T.to(sent.dtype)
                _add(products, (site.layer, role), block)
    for site in sites:  # receivers the metric does not reach score 0
        for role in roles:
            heads = site.n_heads if role == "q" else site.n_kv_heads
            _add(products, (site.layer, role), torch.zeros(sent.shape[0], heads, dtype=sent.dtype))
    _add(products, OUTPUT, torch.zeros(sent.shape[0], 1, dtype=sent.dtype))


def _add(products: dict[tuple[int, str] | str, Tensor], key: tuple[int, str] | str, value: Tensor) -> None:
    products[key] = products[key] + value.to(products[key].device) if key in products else value


def _taking(taken: dict[int, dict[str, Tensor]], site: AttentionSite, roles: Sequence[str]) -> Tap:
    """A tap on every head's q and every key/value head's k and v, kept in the graph."""
    firsts = [site.kv_head_of.index(g) for g in range(site.n_kv_heads)]

    def sink(at: int, out: TapOutput) -> None:
        taken[at] = {role: getattr(out, role) for role in roles}

    return Tap(sink, q=list(range(site.n_heads)) if "q" in roles else None,
               k=firsts if "k" in roles else None, v=firsts if "v" in roles else None)


def _with_edge(model: HeadedModel, stream: Stream, net: torch.nn.Module, corrupted: Run, edge: Edge,
               added: Tensor) -> object:
    """The corrupted forward with ``edge`` carrying ``added`` into its receiver."""
    if edge.receiver == OUTPUT:
        with stream.hooked(final=lambda x: x + added):
            return net(**corrupted.inputs)  # a sender's own layer and every later one run as they are
    layer, head, role = receiving(edge.receiver)

    def own(at: int, x: Tensor) -> dict[tuple[str, int], Tensor]:
        return {(role, head): x + added} if at == layer else {}

    with own_inputs(model, stream, own):
        return net(**corrupted.inputs)


