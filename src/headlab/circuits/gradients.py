"""The gradient reaching the residual stream through one receiver's input alone: what edge attribution
multiplies each sender's difference with.

For receiver r (head h's q, or key/value head g's k or v) the gradient at the stream x its layer reads
is the metric's gradient at r's slice of q (k, v) only, carried back to x through the model's own
modules: a vector–Jacobian product per receiver. Two ways, the same numbers:

- **by the projections** (a site whose q/k/v layout is recognised, ``headlab.models.layout``, and whose
  heads stay apart): the forward's own backward gives the metric's gradient at the outputs of the
  model's q/k/v projections; each head's slice of it goes through that head's rows of the projection's
  own weight (the transposed Linear, a small product per head), then back through the model's norm to
  x, batched over the heads. Nothing of the attention is run twice. Where the projections read the
  output of the norm at the stream's point itself (``headlab.models.stream``: every pre-norm model,
  BERT), that last product goes through the norm module run again on x, a chunk of positions at a
  time with every receiver side by side in the batch (``Receivers.at_stream``; the norm checked first
  to work per position and per batch row, ``per_position``), so the forward's graph need not be kept
  after its backward; elsewhere through the forward's graph, at every position at once. *Apart* means each slice of a
  projection's output reaches the metric only through its own head's q, k or v: positions and per-head
  q/k norms keep heads apart, a norm over every head's queries does not. It is checked on the first
  run that meets an attention module (``check_apart``) and remembered for that module.
- **head by head** (any other site, and a module run in several layers, ALBERT's, whose projections' calls are
  several layers'): additive zeros on every head's q, k and v
  (``AttentionSite.input_deltas``) give ∂metric/∂q, ∂k, ∂v; head h's alone is carried back from its q,
  k or v to x, batched over the heads (``is_grads_batched``).

Axis legend:
    x, gradient  (batch, pos, d_model)
    q            (batch, n_heads, pos, d_head);  k, v (batch, n_kv_heads, pos, d)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import torch
from torch import Tensor, nn

from headlab.layer.taps import SITE_ATTRIBUTE
from headlab.models import AttentionSite
from headlab.models.layout import Projection, Segment
from headlab.models.site import SharedSites
from headlab.models.stream import Stream, on_calls

Calls = dict[int, dict[int, tuple[Tensor, Tensor]]]  # layer -> id(projection module) -> (input, output)

# attention module -> whether its heads' projections stay apart (found by ``check_apart``)
APART: WeakKeyDictionary[nn.Module, bool] = WeakKeyDictionary()


def by_projections(site: AttentionSite) -> bool | None:
    """Whether ``site``'s receivers take the way by the projections: True, False, or None where not yet checked."""
    if site.layout is None or shared(site):
        return False
    return APART.get(site.module)


def shared(site: AttentionSite) -> bool:
    """Whether ``site``'s module runs in several layers (ALBERT's): its projections' calls are several layers'."""
    return isinstance(site.module.__dict__.get(SITE_ATTRIBUTE), SharedSites)


@contextmanager
def projection_calls(sites: Sequence[AttentionSite]) -> Iterator[Calls]:
    """Record each site's q/k/v projections' input and output (in the graph) while the block runs."""
    calls: Calls = {site.layer: {} for site in sites}
    with ExitStack() as stack:
        for site in sites:
            if site.layout is None or shared(site):
                continue
            for projection in site.layout.projections:
                def hook(module: nn.Module, args: tuple[Any, ...], output: Any, layer: int = site.layer) -> None:
                    if args and isinstance(args[0], Tensor) and isinstance(output, Tensor):
                        calls[layer][id(module)] = (args[0], output)
                stack.callback(projection.module.register_forward_hook(hook).remove)
        yield calls


@contextmanager
def norm_outputs(stream: Stream) -> Iterator[dict[int, Tensor]]:
    """Record the output of each layer's norm at the stream's point (``StreamPoint.kind == "norm"``) while the
    block runs."""
    outputs: dict[int, Tensor] = {}

    def keep(layer: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if isinstance(output, Tensor):
                outputs[layer] = output
        return hook

    with on_calls(stream.net, [(point.module, point.call, keep(layer)) for layer, point in enumerate(stream.layers)
                               if point.kind == "norm"], after=True):
        yield outputs


def projection_input(site: AttentionSite, calls: Mapping[int, tuple[Tensor, Tensor]]) -> Tensor:
    """What ``site``'s projections read in this forward (``projection_outputs`` is not None)."""
    assert site.layout is not None
    return calls[id(site.layout.projections[0].module)][0]


def per_position(norm: nn.Module, x: Tensor, hidden: Tensor) -> bool:
    """Whether ``norm``, run on ``x`` again, may stand for what made ``hidden`` from it a chunk of positions at a
    time: run on the first half of the positions alone, twice over in the batch, it gives ``hidden`` there (a
    norm over each position's features, as every transformer's is; one over positions or the batch is not)."""
    width = max(1, x.shape[1] // 2)
    try:
        with torch.no_grad():
            part = norm(x[:, :width].detach().repeat(2, 1, 1))
    except TypeError:  # a norm that takes more than the stream
        return False
    expected = hidden[:, :width].detach().repeat(2, 1, 1)
    return isinstance(part, Tensor) and part.shape == expected.shape and torch.allclose(
        part, expected, rtol=1e-5, atol=1e-6 * max(float(expected.abs().max()), 1.0))


def projection_outputs(site: AttentionSite, calls: Mapping[int, tuple[Tensor, Tensor]]) -> list[Tensor] | None:
    """The outputs of every q/k/v projection of ``site`` in this forward, in the layout's order, or None where
    some did not run or they read different tensors (nothing to take the way by the projections)."""
    if site.layout is None or any(id(p.module) not in calls for p in site.layout.projections):
        return None
    taken = [calls[id(p.module)] for p in site.layout.projections]
    if len({id(hidden) for hidden, _ in taken}) != 1:
        return None
    return [output for _, output in taken]


def check_apart(site: AttentionSite, calls: Mapping[int, tuple[Tensor, Tensor]], taken: Mapping[str, Tensor],
                at_inputs: Mapping[str, Tensor | None], at_outputs: Sequence[Tensor | None] | None) -> bool:
    """Whether the gradient at ``site``'s projection outputs can stand for each head's: remembered for the module.

    True when (1) a probe at head 0's q (k, v) alone reaches only that head's slice of the projections'
    outputs, and (2) the gradient at the outputs from the forward's backward (``at_outputs``) equals the
    gradient at q, k and v (``at_inputs``) carried back to them (nothing else reads the outputs).

    Args:
        site: the receivers' site.
        calls: its projections' ``(input, output)`` of this forward.
        taken: role -> every head's q (key/value head's k, v) as the attention function saw it, in the graph.
        at_inputs: role -> ∂metric/∂ that tensor (None where the metric does not depend on it).
        at_outputs: ∂metric/∂ each projection's output from the backward, or None where they were not taken.
    """
    outputs = projection_outputs(site, calls)
    APART[site.module] = outputs is not None and at_outputs is not None and _apart(site, outputs, taken) and \
        _outputs_read_only_by_heads(outputs, taken, at_inputs, at_outputs)
    return APART[site.module]


@dataclass(frozen=True)
class Receivers:
    """A layer's receivers taken by the projections: what carries their gradients back to the stream, a chunk of
    positions at a time (``at_stream``).

    Attributes:
        blocks: in receiver order, ``(gradient, weights)`` of some heads of one projection: ∂metric/∂ their slices
            of its output ``(batch, pos, heads, d)`` and their rows of its weight ``(heads, d, d_in)`` (views where
            the heads sit side by side).
        hidden: what the projections read.
        norm: the norm that made ``hidden`` from the stream, run again on it a chunk of positions at a time
            (``per_position``); None where ``hidden`` is the stream itself, or came from it another way (then
            through the forward's graph, at every position at once).
    """

    blocks: list[tuple[Tensor, Tensor]]
    hidden: Tensor
    norm: nn.Module | None

    def chunked(self, x: Tensor) -> bool:
        """Whether ``at_stream`` takes a chunk of positions (else every position at once)."""
        return self.hidden is x or self.norm is not None

    def at_stream(self, x: Tensor, span: slice = slice(None)) -> Tensor:
        """Each receiver's gradient at the stream ``x`` through its input alone, at the positions ``span`` (every
        position unless ``chunked``): ``(receivers, batch, positions, d_model)``."""
        batch = x.shape[0]
        width = len(range(*span.indices(x.shape[1])))
        # each receiver's slice of the gradient through its rows of the weight: its share of hidden's gradient
        count = sum(weights.shape[0] for _, weights in self.blocks)
        shares = x.new_empty(count, batch, width, self.blocks[0][1].shape[2])
        start = 0
        for gradient, weights in self.blocks:
            heads = weights.shape[0]
            torch.bmm(gradient[:, span].permute(2, 0, 1, 3).flatten(1, 2), weights,
                      out=shares[start: start + heads].view(heads, batch * width, -1))
            start += heads
        if self.hidden is x:
            return shares
        if self.norm is not None:  # the norm again on these positions, once per receiver side by side in the batch
            part = x[:, span].detach().repeat(len(shares), 1, 1).requires_grad_(True)
            with torch.enable_grad():
                (back,) = torch.autograd.grad(self.norm(part), part, shares.flatten(0, 1))
            return back.view(shares.shape)
        if span != slice(None):
            raise ValueError(f"span={span}: through the forward's graph the gradient is taken at every position")
        (back,) = torch.autograd.grad(self.hidden, x, shares, retain_graph=True, is_grads_batched=True)
        return back.detach()


def receivers(site: AttentionSite, hidden: Tensor, at_outputs: Sequence[Tensor | None], roles: Sequence[str], *,
              norm: nn.Module | None = None) -> Receivers:
    """``site``'s receivers of ``roles`` (q: every head; k, v: every key/value head, in that order), by the
    projections (``by_projections(site)`` is True).

    Args:
        site: the receivers' site.
        hidden: what its projections read in this forward (``projection_input``).
        at_outputs: ∂metric/∂ each projection's output (None where the metric does not depend on it).
        roles: the roles, in order.
        norm: the norm that made ``hidden`` from the stream, checked by ``per_position`` (see ``Receivers``),
            or None.
    """
    assert site.layout is not None
    blocks: list[tuple[Tensor, Tensor]] = []  # (gradient (batch, pos, heads, d), weights (heads, d, d_in))
    for role in roles:
        found = []
        for projection, gradient in zip(site.layout.projections, at_outputs):
            segments = sorted((s for s in projection.segments if s.role == role), key=lambda s: s.head)
            if segments:
                found.append((segments[0].head, _block(projection, segments, hidden, gradient)))
        blocks += [block for _, block in sorted(found, key=lambda item: item[0])]
    return Receivers(blocks, hidden, norm)


def _block(projection: Projection, segments: list[Segment], hidden: Tensor, gradient: Tensor | None
           ) -> tuple[Tensor, Tensor]:
    """The gradient at some heads' slices of a projection's output ``(batch, pos, heads, d)`` (zeros where the
    metric does not reach it) and their rows of its weight ``(heads, d, d_in)``, in the segments' order."""
    weight = projection.module.weight
    assert isinstance(weight, Tensor)
    if gradient is None:
        outputs = weight.shape[1] if projection.transposed else weight.shape[0]
        gradient = hidden.new_zeros(*hidden.shape[:-1], outputs)
    first, width = segments[0].start, segments[0].stop - segments[0].start
    if all(s.start == first + i * width and s.stop == s.start + width for i, s in enumerate(segments)):
        stop = first + len(segments) * width  # the heads side by side: views, no copies
        sliced = gradient[..., first:stop].unflatten(-1, (len(segments), width))
        rows = projection.rows(weight, Segment(segments[0].role, 0, first, stop)).unflatten(0, (len(segments), width))
    else:
        columns = torch.cat([torch.arange(s.start, s.stop, device=gradient.device) for s in segments])
        sliced = gradient.index_select(-1, columns).unflatten(-1, (len(segments), -1))
        rows = torch.stack([projection.rows(weight, s) for s in segments])
    return sliced.detach(), rows.detach().to(gradient.dtype)


def head_by_head(tensor: Tensor, x: Tensor, g: Tensor) -> Tensor:
    """For each head h: ``g`` at head h of ``tensor`` alone carried back to ``x``: ``(heads, batch, pos, d_model)``."""
    heads = tensor.shape[1]
    eye = torch.eye(heads, dtype=g.dtype, device=g.device)[:, None, :, None, None]  # (heads, 1, heads, 1, 1)
    cotangents = eye * g.detach()[None]  # (heads, batch, heads, pos, d): head h's gradient alone
    try:
        (vjp,) = torch.autograd.grad(tensor, x, cotangents, retain_graph=True, is_grads_batched=True)
    except RuntimeError:  # an operation without a batching rule: one product per head
        vjp = torch.stack([torch.autograd.grad(tensor, x, c, retain_graph=True)[0] for c in cotangents])
    return vjp.detach()


def _apart(site: AttentionSite, outputs: list[Tensor], taken: Mapping[str, Tensor]) -> bool:
    """Whether a probe at one role's head 0 alone reaches only that head's slice of the projections' outputs."""
    assert site.layout is not None
    generator = torch.Generator(device=outputs[0].device).manual_seed(0)  # the caller's random state untouched
    for role, tensor in taken.items():
        probe = torch.zeros_like(tensor)
        probe[:, 0] = torch.randn(probe[:, 0].shape, generator=generator, device=probe.device, dtype=probe.dtype)
        reached = torch.autograd.grad(tensor, outputs, probe, retain_graph=True, allow_unused=True)
        for projection, gradient in zip(site.layout.projections, reached):
            if gradient is None:
                continue
            for segment in projection.segments:
                if (segment.role, segment.head) != (role, 0) and bool(gradient[..., segment.start:segment.stop].any()):
                    return False
    return True


def _outputs_read_only_by_heads(outputs: list[Tensor], taken: Mapping[str, Tensor],
                                at_inputs: Mapping[str, Tensor | None], at_outputs: Sequence[Tensor | None]) -> bool:
    """Whether the backward's gradient at the outputs is the gradient at q, k and v carried back to them."""
    live = [r for r in taken if at_inputs[r] is not None]
    carried: Sequence[Tensor | None] = [None] * len(outputs)
    if live:
        carried = torch.autograd.grad([taken[r] for r in live], outputs, [at_inputs[r] for r in live],
                                      retain_graph=True, allow_unused=True)
    for expected, got in zip(carried, at_outputs):
        a = torch.zeros(()) if expected is None else expected
        b = torch.zeros(()) if got is None else got
        scale = max(float(a.abs().max()), float(b.abs().max()), torch.finfo(a.dtype).tiny)
        if float((a - b).abs().max()) > 1e-4 * scale:
            return False
    return True
