"""The gradient reaching the residual stream through one receiver's input alone: what edge attribution
multiplies each sender's difference with.

During a forward and backward with gradients, additive zeros on every head's q, k and v
(``AttentionSite.input_deltas``) give ∂metric/∂q, ∂metric/∂k, ∂metric/∂v. For receiver r (head h's q, or
key/value head g's k or v) the gradient at the stream x its layer reads is that gradient, at r's slice
only, carried back to x through the model's own modules: a vector–Jacobian product per receiver.

Two ways, the same numbers:

- **by the projections** (where the site's q/k/v layout is recognised, ``headlab.models.layout``): one
  product from every head's q, k, v back to the outputs of the model's projections (through positions
  and per-head q/k norms, which never mix heads — checked on the run), then each head's rows of the
  projection's own weight (the transposed Linear, a small product per head), then one product per head
  back through the model's norm to x, batched over the heads. The costly part, the projection's
  backward, is paid once per layer instead of once per head.
- **head by head** (any other site, and where heads mix): head h's gradient alone carried back from q, k
  or v to x, batched over the heads (``is_grads_batched``).

Axis legend:
    x, gradient  (batch, pos, d_model)
    q            (batch, n_heads, pos, d_head);  k, v (batch, n_kv_heads, pos, d)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from headlab.models import AttentionSite
from headlab.models.layout import Projection

Calls = dict[int, dict[int, tuple[Tensor, Tensor]]]  # layer -> id(projection module) -> (input, output)


@contextmanager
def projection_calls(sites: list[AttentionSite]) -> Iterator[Calls]:
    """Record each site's q/k/v projections' input and output (in the graph) while the block runs."""
    calls: Calls = {site.layer: {} for site in sites}
    with ExitStack() as stack:
        for site in sites:
            if site.layout is None:
                continue
            for projection in site.layout.projections:
                def hook(module: nn.Module, args: tuple[Any, ...], output: Any, layer: int = site.layer) -> None:
                    if args and isinstance(args[0], Tensor) and isinstance(output, Tensor):
                        calls[layer][id(module)] = (args[0], output)
                stack.callback(projection.module.register_forward_hook(hook).remove)
        yield calls


def receiver_gradients(site: AttentionSite, x: Tensor, taken: Mapping[str, Tensor], grads: Mapping[str, Tensor | None],
                       calls: Mapping[int, tuple[Tensor, Tensor]], *, apart: dict[int, bool] | None = None
                       ) -> dict[str, Tensor]:
    """Each receiver's gradient at the stream ``x`` through its input alone.

    Args:
        site: the receivers' site.
        x: the stream its heads read, in the graph.
        taken: role -> every head's q (or key/value head's k, v) as the attention function saw it, in the graph.
        grads: role -> ∂metric/∂ that tensor, or None where the metric does not depend on it.
        calls: the site's projections' ``(input, output)`` of this forward (``projection_calls``).
        apart: whether each layer's heads were found apart by an earlier forward of the same model and
            inputs (filled here; checked once per layer).

    Returns:
        role -> ``(heads, batch, pos, d_model)``.
    """
    roles = list(taken)
    live = [r for r in roles if grads[r] is not None]
    out = {r: torch.zeros(taken[r].shape[1], *x.shape, dtype=x.dtype, device=x.device) for r in roles if r not in live}
    if not live:
        return out
    staged = _by_projections(site, x, {r: taken[r] for r in live}, {r: grads[r] for r in live}, calls,
                             {} if apart is None else apart)
    for role in live:
        gradient = grads[role]
        assert gradient is not None
        out[role] = staged[role] if staged is not None else _head_by_head(taken[role], x, gradient)
    return out


def _by_projections(site: AttentionSite, x: Tensor, taken: dict[str, Tensor], grads: Mapping[str, Tensor | None],
                    calls: Mapping[int, tuple[Tensor, Tensor]], apart: dict[int, bool]) -> dict[str, Tensor] | None:
    """The products by the projections' own weights, or None where this site cannot take that way."""
    if site.layout is None:
        return None
    projections = [p for p in site.layout.projections if id(p.module) in calls]
    if len(projections) != len(site.layout.projections):
        return None
    inputs = {id(calls[id(p.module)][0]) for p in projections}
    if len(inputs) != 1:  # q, k and v projected from different tensors
        return None
    hidden = calls[id(projections[0].module)][0]
    outputs = [calls[id(p.module)][1] for p in projections]
    roles = list(taken)
    if site.layer not in apart:
        apart[site.layer] = _heads_apart(site, projections, outputs, roles, taken)
    if not apart[site.layer]:
        return None
    at_outputs = torch.autograd.grad([taken[r] for r in roles], outputs, [grads[r] for r in roles],
                                     retain_graph=True, allow_unused=True)
    per_head: dict[str, dict[int, Tensor]] = {r: {} for r in roles}
    for projection, gradient in zip(projections, at_outputs):
        weight = projection.module.weight
        assert isinstance(weight, Tensor)
        for segment in projection.segments:
            if segment.role not in per_head:
                continue
            if gradient is None:
                part = torch.zeros_like(hidden)
            else:  # the head's rows of the projection, (d, d_in) in Linear layout: its share of the input's gradient
                part = gradient[..., segment.start:segment.stop] @ projection.rows(weight, segment).to(gradient.dtype)
            per_head[segment.role][segment.head] = part
    stacked = {r: torch.stack([per_head[r][h] for h in sorted(per_head[r])]) for r in roles}
    if hidden is x:
        return {r: v.detach() for r, v in stacked.items()}
    everything = torch.cat([stacked[r] for r in roles])  # (heads of every role, batch, pos, d_in)
    (back,) = torch.autograd.grad(hidden, x, everything.detach(), retain_graph=True, is_grads_batched=True)
    result, start = {}, 0
    for r in roles:
        count = stacked[r].shape[0]
        result[r] = back[start: start + count].detach()
        start += count
    return result


def _heads_apart(site: AttentionSite, projections: list[Projection], outputs: list[Tensor], roles: list[str],
                 taken: dict[str, Tensor]) -> bool:
    """Whether a gradient at one head's q, k or v reaches only that head's rows of the projections' outputs
    (positions and per-head norms keep heads apart; a norm over every head's queries does not)."""
    generator = torch.Generator(device=taken[roles[0]].device).manual_seed(0)  # the caller's random state untouched
    probes = []
    for role in roles:
        probe = torch.zeros_like(taken[role])
        probe[:, 0] = torch.randn(probe[:, 0].shape, generator=generator, device=probe.device, dtype=probe.dtype)
        probes.append(probe)
    reached = torch.autograd.grad([taken[r] for r in roles], outputs, probes, retain_graph=True, allow_unused=True)
    for projection, gradient in zip(projections, reached):
        if gradient is None:
            continue
        for segment in projection.segments:
            if segment.role in roles and segment.head != 0 and bool(gradient[..., segment.start:segment.stop].any()):
                return False
    return True


def _head_by_head(tensor: Tensor, x: Tensor, g: Tensor) -> Tensor:
    """For each head h: ``g`` at head h of ``tensor`` alone carried back to ``x``: ``(heads, batch, pos, d_model)``."""
    heads = tensor.shape[1]
    eye = torch.eye(heads, dtype=g.dtype, device=g.device)[:, None, :, None, None]  # (heads, 1, heads, 1, 1)
    cotangents = eye * g.detach()[None]  # (heads, batch, heads, pos, d): head h's gradient alone
    try:
        (vjp,) = torch.autograd.grad(tensor, x, cotangents, retain_graph=True, is_grads_batched=True)
    except RuntimeError:  # an operation without a batching rule: one product per head
        vjp = torch.stack([torch.autograd.grad(tensor, x, c, retain_graph=True)[0] for c in cotangents])
    return vjp.detach()
