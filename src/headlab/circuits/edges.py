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
(``headlab.circuits.gradients``: by the projections' own weights, a head's rows each). One corrupted
forward and backward, one clean forward, and the products, taken a chunk of positions at a time (they
sum over positions): neither the cost nor the memory grows with the edges, and the memory beyond the
forward and backward does not grow with the sequence.

**EAP-IG** (Hanna et al. 2024) averages the gradient over ``steps`` points between the corrupted and
the clean input (the stream where the input enters it interpolated, ``headlab.models.stream``: embeddings
and positions, or a vision model's patches; at the midpoints α = (k − ½)/steps), which
follows the metric where a single gradient does not.

In an encoder-decoder (``headlab.circuits.graph``: two streams) each sender's difference is of its own stream and
each receiver's gradient is at the stream it reads: a cross-attention head's k and v at the encoder's final
stream, carried back through the encoder's final norm; the products are taken stream by stream, over its own
positions.

Senders add to the stream as they do in a pre-norm residual model (GPT-2, LLaMA, …): the edge adds
the difference to the receiver's stream as it is. In a post-norm model (BERT) a head's output is
normalised before later layers read it; the edge still adds it unnormalised (say so when you read a
BERT's edges: compare edges into one layer, not their absolute sizes).

Axis legend:
    stream, gradient  (batch, pos, d_model)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from headlab.circuits.gradients import (
    Receivers,
    by_projections,
    check_apart,
    head_by_head,
    norm_outputs,
    per_position,
    projection_calls,
    projection_input,
    projection_outputs,
    receivers,
)
from headlab.circuits.graph import (
    OUTPUT,
    ROLES,
    Edge,
    EdgeScores,
    check_edges,
    graph_edges,
    graph_layers,
    input_of,
    output_stack,
    read_stack,
    receiver_senders,
    receiving,
    role_heads,
)
from headlab.circuits.inputs import own_inputs
from headlab.circuits.runs import (
    Metric,
    Run,
    check_gap,
    difference,
    entered,
    graph_stream,
    moved,
    paired,
    prepare,
    run,
    sent_inputs,
)
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
    clean_inputs, corrupted_inputs = paired(handle, clean, corrupted)
    stream = graph_stream(handle, corrupted_inputs)
    runs = _Runs(handle, stream, clean_inputs, corrupted_inputs, metric, interpolate=method == "eap-ig")
    edges = graph_edges(handle, roles=roles, output=output)
    roles = tuple(role for role in ROLES if role in roles)  # the graph's order
    alphas = [0.0] if method == "eap" else [(k + 0.5) / steps for k in range(steps)]
    # each (layer, role)'s (senders into the stream it reads, its receivers) and the output's (senders, 1): the
    # products, summed over the steps; each step's gradients are multiplied as they come and let go
    layers = graph_layers(handle)
    dtype = torch.promote_types(handle.dtype, torch.float32)
    products: dict[tuple[int, str] | str, Tensor] = {
        OUTPUT: torch.zeros(len(receiver_senders(layers, OUTPUT)), 1, dtype=dtype, device=handle.device),
        **{(site.layer, role): torch.zeros(len(receiver_senders(layers, (site.layer, 0, role))),
                                           role_heads(site, role), dtype=dtype, device=handle.device)
           for site in handle.sites for role in roles}}
    for alpha in alphas:
        _receiver_products(handle, stream, runs, alpha, roles, products)
    clean_run, corrupted_run = runs.both()
    # the graph lists the edges into each (layer, role) receiver by receiver, then sender; the output's last
    scores = torch.cat([
        *(products[(site.layer, role)].T.reshape(-1) for site in handle.sites for role in roles),
        *([products[OUTPUT][:, 0]] if output else [])]).double().cpu().numpy() / len(alphas)
    assert len(scores) == len(edges)
    passes = len(alphas)
    return EdgeScores(method, edges, scores, clean_run.metric, corrupted_run.metric,
                      forwards=1 + passes + (method == "eap-ig"), backwards=passes,
                      seconds=time.perf_counter() - start, details={"steps": steps} if method == "eap-ig" else None)


class _Runs:
    """The clean and corrupted runs without gradients, each made when it is first needed: after a pass's backward,
    so that it takes the memory the pass let go.

    Attributes:
        inputs: ``{"clean": ..., "corrupted": ...}``: the forwards' keyword arguments.
        entry: ``{stack: stream}``: the clean input's streams where it enters them (``entered``), where the passes
            move to it (EAP-IG).
        shapes: ``{stack: (batch, pos, d_model)}`` of each stream.
        clean, corrupted: the runs, once made; EAP's one pass at ``alpha = 0`` is the corrupted run itself.
    """

    def __init__(self, model: HeadedModel, stream: Stream, clean: dict[str, Any], corrupted: dict[str, Any],
                 metric: Metric, *, interpolate: bool) -> None:
        self.model, self.stream, self.metric = model, stream, metric
        self.inputs = {"clean": clean, "corrupted": corrupted}
        self.entry = entered(model, stream, clean) if interpolate else None
        found = entered(model, stream, corrupted) if self.entry is None else self.entry
        self.shapes = {stack: tuple(x.shape) for stack, x in found.items()}
        self.clean: Run | None = None
        self.corrupted: Run | None = None
        self._sent: dict[str, _Sent] | None = None

    def both(self) -> tuple[Run, Run]:
        """The clean and corrupted runs.

        Raises:
            ValueError: they score the same.
        """
        if self.clean is None:
            self.clean = run(self.model, self.stream, self.inputs["clean"], self.metric, take=("z",))
        if self.corrupted is None:
            self.corrupted = run(self.model, self.stream, self.inputs["corrupted"], self.metric, take=("z",))
        check_gap(self.clean.metric, self.corrupted.metric)
        return self.clean, self.corrupted

    def sent(self) -> dict[str, _Sent]:
        """``{stack: what each sender into its stream sends differently}`` (made once)."""
        if self._sent is None:
            clean, corrupted = self.both()
            self._sent = {stack: _Sent(self.model, clean, corrupted, stack) for stack in self.shapes}
        return self._sent


class _Sent:
    """What each sender into one stream sends differently, clean − corrupted, a chunk of positions at a time.

    A sender's row is ``(batch · positions · d_model)``: the stream's input difference, or a head's result
    difference (its z difference through its slice of W_O: the result is linear in z), made from the z
    differences when a chunk is multiplied, so that no more than about ``CHUNK`` numbers of them are held.
    Rows are in the graph's order of the stream's senders (``graph.stream_senders``): the senders into a
    receiver are the first rows. Products are taken in float32 or wider.
    """

    CHUNK = 1 << 19  # numbers of sender rows made at once

    def __init__(self, model: HeadedModel, clean: Run, corrupted: Run, stack: str) -> None:
        self.sites = [site for site in model.sites if site.stack == stack]
        self.input = difference(clean, corrupted, input_of(model.sites, stack))  # (batch, pos, d_model)
        self.dtype = torch.promote_types(self.input.dtype, torch.float32)
        # (head, batch, pos, d_head_v) and (head, d_head_v, d_model) of each layer
        self.dz = {site.layer: (clean.z[site.layer] - corrupted.z[site.layer]).transpose(0, 1).to(self.dtype)
                   .contiguous() for site in self.sites}
        self.W_O = {site.layer: site.W_O.detach().to(self.dtype) for site in self.sites}
        self.count = 1 + sum(site.n_heads for site in self.sites)

    @property
    def step(self) -> int:
        """Positions of a chunk: every sender's rows over them hold at most about ``CHUNK`` numbers, the chunks
        as even as the positions allow (each chunk's memory is then the last one's, free to be taken again)."""
        batch, positions, d_model = self.input.shape
        most = max(1, self.CHUNK // (self.count * batch * d_model))
        return -(-positions // -(-positions // most))  # ceil(positions / number of chunks)

    def rows(self, span: slice) -> Tensor:
        """Every sender's row at the positions ``span``: ``(senders, batch · positions · d_model)``."""
        batch, _, d_model = self.input.shape
        width = span.stop - span.start
        rows = torch.empty(self.count, batch, width, d_model, dtype=self.dtype, device=self.input.device)
        rows[0] = self.input[:, span]
        row = 1
        for site in self.sites:
            z = self.dz[site.layer][:, :, span].flatten(1, 2)  # (heads, batch · positions, d_head_v)
            torch.bmm(z, self.W_O[site.layer], out=rows[row: row + site.n_heads].view(-1, batch * width, d_model))
            row += site.n_heads
        return rows.view(self.count, -1)


@dataclass
class _Pass:
    """What one forward and backward of the corrupted input leaves for the products.

    Attributes:
        streams: ``{layer: stream, "final": stream}`` as the heads and the output read it, and ``"memory"``: what
            cross-attention's k and v read (in the graph).
        final: ∂metric/∂ the final point's stream, or None where the metric does not depend on it.
        staged: the layers whose receivers take the way by the projections (``headlab.circuits.gradients``).
        taken, at_inputs: the other layers' (head by head): q, k, v as the attention saw them (in the graph),
            and ∂metric/∂ them.
    """

    streams: dict[int | str, Tensor]
    final: Tensor | None
    staged: dict[int, Receivers]
    taken: dict[int, dict[str, Tensor]]
    at_inputs: dict[int, dict[str, Tensor | None]]
    _whole: dict[tuple[int, tuple[str, ...]], Tensor] = field(default_factory=dict)

    def gradients(self, site: AttentionSite, roles: tuple[str, ...], span: slice, *, memory: bool = False) -> Tensor:
        """Each receiver of ``site``'s gradient at its stream through its input alone, at the positions ``span``:
        ``(receivers, batch, positions, d_model)``, the receivers of ``roles`` (which read one stream: ``_groups``;
        the memory, a cross-attention's k and v, where ``memory``) in order. Taken at those positions alone where
        the way allows (``Receivers.chunked``); else at every position once, and kept."""
        layer, x = site.layer, self.streams["memory" if memory else site.layer]
        if layer in self.staged and self.staged[layer].chunked(x):
            return self.staged[layer].at_stream(x, span)
        if (layer, roles) not in self._whole:
            self._whole[(layer, roles)] = self._every_position(site, roles, x)
        return self._whole[(layer, roles)][:, :, span]

    def _every_position(self, site: AttentionSite, roles: Sequence[str], x: Tensor) -> Tensor:
        layer = site.layer
        if layer in self.staged:
            return self.staged[layer].at_stream(x)
        parts = []
        for role in roles:
            tensor, gradient = self.taken[layer][role], self.at_inputs[layer][role]
            parts.append(torch.zeros(tensor.shape[1], *x.shape, dtype=x.dtype, device=x.device) if gradient is None
                         else head_by_head(tensor, x, gradient))
        return torch.cat(parts)


def _forward_backward(model: HeadedModel, stream: Stream, runs: _Runs, alpha: float, roles: Sequence[str]) -> _Pass:
    """One forward of the corrupted input, its entering stream moved ``alpha`` of the way to the clean run's, and its
    backward to what the receivers' gradients start from. At ``alpha = 0`` the forward is the corrupted run, kept
    as ``runs.corrupted``.

    Raises:
        ValueError: the metric has no gradient.
    """
    sites = model.sites
    streams: dict[int | str, Tensor] = {}
    taken: dict[int, dict[str, Tensor]] = {}
    ways = {site.layer: by_projections(site) for site in sites}  # True, False, or None: checked on this run
    inputs = runs.inputs["corrupted"]
    corrupted_here = runs.corrupted is None and not alpha
    with intervening(model), model.running(grad=True) as net:
        deltas = _input_deltas(model, ways, roles, runs.shapes)
        for site in sites:
            site.input_deltas = dict(deltas[site.layer])
            site.tap = _taking(taken, site, roles if ways[site.layer] is not True else (), z=corrupted_here)
        with moved(stream, runs.entry, alpha), stream.hooked(record=streams), \
                projection_calls(sites) as calls, norm_outputs(stream) as normed:
            value = runs.metric(net(**inputs))
    if corrupted_here:
        z = {at: t.pop("z").detach() for at, t in taken.items()}
        runs.corrupted = Run(dict(inputs), float(value.detach()), {}, z, sent_inputs(model, streams))
    if not value.requires_grad:
        raise ValueError("the metric does not depend on the model's heads (no gradient): edge attribution needs a "
                         "differentiable metric of the output")
    outputs = {s.layer: made for s in sites if ways[s.layer] is not False
               and (made := projection_outputs(s, calls[s.layer])) is not None}
    # where the projections read the output of the norm at the stream's point, that norm is run again for the last
    # product; the forward's graph is kept after its backward only where some receiver needs it
    norms = {layer: stream.layers[layer].module for layer in outputs
             if normed.get(layer) is projection_input(sites[layer], calls[layer])
             and per_position(stream.layers[layer].module, streams[layer], normed[layer])}
    keep = any(ways[s.layer] is not True or (projection_input(s, calls[s.layer]) is not streams[s.layer]
                                             and s.layer not in norms) for s in sites)
    wanted = [streams["final"], *(o for made in outputs.values() for o in made),
              *(deltas[s.layer][r] for s in sites for r in deltas[s.layer])]
    found: Iterator[Tensor | None] = iter(torch.autograd.grad(value, wanted, retain_graph=keep, allow_unused=True))
    final = next(found)
    at_outputs = {layer: [next(found) for _ in projections] for layer, projections in outputs.items()}
    at_inputs = {s.layer: {r: next(found) for r in deltas[s.layer]} for s in sites}
    for site in sites:  # the first run on an attention module: which way its receivers take
        if ways[site.layer] is None:
            ways[site.layer] = check_apart(site, calls[site.layer], taken[site.layer], at_inputs[site.layer],
                                           at_outputs.get(site.layer))
    staged = {layer: receivers(sites[layer], projection_input(sites[layer], calls[layer]), at_outputs[layer], roles,
                               norm=norms.get(layer)) for layer in outputs if ways[layer]}
    return _Pass(streams, final, staged, taken, at_inputs)


def _receiver_products(model: HeadedModel, stream: Stream, runs: _Runs, alpha: float, roles: Sequence[str],
                       products: dict[tuple[int, str] | str, Tensor]) -> None:
    """One forward and backward (``_forward_backward``): the gradient reaching each receiver's stream through its
    input alone, multiplied with what each sender into that stream sends differently and added into ``products``
    (``{(layer, role): (senders, the receivers), OUTPUT: (senders, 1)}``), stream by stream."""
    done = _forward_backward(model, stream, runs, alpha, roles)
    out = output_stack(model.sites)
    with model.running(grad=False):  # the norms run again in eval mode, as in the forward
        for stack, sent in runs.sent().items():  # a run still missing takes the memory the backward let go
            groups = [(site, group) for site in model.sites for read, group in _groups(model, site, roles).items()
                      if read == stack]
            positions = sent.input.shape[1]
            for start in range(0, positions, sent.step):  # a chunk of positions at a time: the products sum over them
                span = slice(start, min(start + sent.step, positions))
                rows = sent.rows(span)  # every sender's, made once for every receiver
                if stack == out and done.final is not None:
                    products[OUTPUT].addmm_(rows, done.final.detach()[:, span].reshape(-1, 1).to(rows.dtype))
                for site, group in groups:  # the stream's input and earlier layers' heads send to a receiver
                    gradients = done.gradients(site, group, span, memory=stack != site.stack)
                    gradients = gradients.flatten(1).to(rows.dtype)
                    for role, part in zip(group, gradients.split([role_heads(site, r) for r in group])):
                        block = products[(site.layer, role)]
                        block.addmm_(rows[: len(block)], part.T)


def _groups(model: HeadedModel, site: AttentionSite, roles: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """``{stack: roles}``: ``site``'s roles by the stream they read (``graph.read_stack``), in order."""
    groups: dict[str, tuple[str, ...]] = {}
    for role in roles:
        read = read_stack(model.sites, site.layer, role)
        groups[read] = (*groups.get(read, ()), role)
    return groups


def _input_deltas(model: HeadedModel, ways: dict[int, bool | None], roles: Sequence[str],
                  shapes: dict[str, tuple[int, ...]]) -> dict[int, dict[str, Tensor]]:
    """Additive zeros on every head's q, k and v (over the positions of the stream each reads, ``shapes``: ``{stack:
    (batch, pos, d_model)}``) of the sites not known to take the way by the projections: their gradients are
    ∂metric/∂q, ∂k, ∂v."""
    deltas: dict[int, dict[str, Tensor]] = {site.layer: {} for site in model.sites}
    for site in model.sites:
        if ways[site.layer] is True:
            continue
        for role in roles:
            batch, positions = shapes[read_stack(model.sites, site.layer, role)][:2]
            d = site.d_head if role in ("q", "k") else site.d_head_v
            deltas[site.layer][role] = torch.zeros(batch, role_heads(site, role), positions, d, dtype=model.dtype,
                                                   device=model.device, requires_grad=True)
    return deltas


def _taking(taken: dict[int, dict[str, Tensor]], site: AttentionSite, roles: Sequence[str], *, z: bool) -> Tap | None:
    """A tap on every head's q and every key/value head's k and v (``roles``), kept in the graph, and on every
    head's z where ``z``; None where it takes nothing."""
    if not roles and not z:
        return None
    firsts = [site.kv_head_of.index(g) for g in range(site.n_kv_heads)]

    def sink(at: int, out: TapOutput) -> None:
        taken[at] = {role: getattr(out, role) for role in (*roles, *("z" if z else ()))}

    return Tap(sink, q=list(range(site.n_heads)) if "q" in roles else None,
               k=firsts if "k" in roles else None, v=firsts if "v" in roles else None,
               z=list(range(site.n_heads)) if z else None)


def _with_edge(model: HeadedModel, stream: Stream, net: torch.nn.Module, corrupted: Run, edge: Edge,
               added: Tensor) -> object:
    """The corrupted forward with ``edge`` carrying ``added`` into its receiver."""
    if edge.receiver == OUTPUT:
        with stream.hooked(final=lambda x: x + added):
            return net(**corrupted.inputs)  # a sender's own layer and every later one run as they are
    layer, head, role = receiving(edge.receiver)

    def own(at: int, x: Tensor, memory: Tensor | None) -> dict[tuple[str, int], Tensor]:
        if at != layer:
            return {}
        read = memory if role != "q" and memory is not None else x  # a cross-attention's k and v read the memory
        return {(role, head): read + added}

    with own_inputs(model, stream, own):
        return net(**corrupted.inputs)


