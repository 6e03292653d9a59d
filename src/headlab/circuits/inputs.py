"""Receivers' inputs from a stream of their own, computed by the model's own modules.

An edge sender → receiver changes what one receiver reads (its q, or the k or v of a key/value
head) and nothing else: the other heads of the receiver's layer read the stream as it is. During a
forward, ``own_inputs`` gives receivers of a layer a stream of their own: where the layer's heads
read the stream (``headlab.models.stream``), it runs the model's norm there and the attention module
itself on each receiver's stream, takes the q, k and v the module computes (its projections,
positions, q/k norms) at headlab's attention function, stops that call there, and has the real call
use them for those receivers only (``AttentionSite.input_replacements``). Nothing is reimplemented:
the modules' own ``forward`` runs (without their hooks, so that nothing recording the forward sees
the extra call).

A cross-attention head's k and v read the other stack's stream (an encoder-decoder's encoder) at the memory
point (``Stream.memory``): their own stream goes through the norm there (the encoder's final norm) and is what the
extra call's keys and values read, in place of the encoder's output; its q reads the decoder's stream as any
head's does.

Axis legend:
    stream  (batch, pos, d_model)
    q       (batch, n_heads, query_pos, d_head);  k, v (batch, n_kv_heads, key_pos, d_head | d_head_v)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from headlab.heads.scoped import intervening
from headlab.layer.gates import Replacement
from headlab.layer.taps import SITE_ATTRIBUTE, Tap, TapOutput
from headlab.models import AttentionSite, HeadedModel
from headlab.models.stream import Stream, StreamPoint, call_of, on_calls

# (layer, stream, memory) -> {(role, head): the receiver's own stream}; head: a key/value head for k and v; memory: the
# stream a cross-attention's k and v read (its own stream for them is made from it), None for other layers
OwnStreams = Callable[[int, Tensor, Tensor | None], Mapping[tuple[str, int], Tensor]]


class _StopCallError(Exception):
    """Raised by the tap of an extra call once its q, k, v are taken: the rest of the call is not needed."""


@contextmanager
def own_inputs(model: HeadedModel, stream: Stream, streams: OwnStreams) -> Iterator[None]:
    """For the forwards run in the block: receivers' q, k, v computed from streams of their own.

    Args:
        model: a ``HeadedModel``.
        stream: its ``Stream`` (``headlab.models.stream.stream_of``).
        streams: called once per layer and forward with the stream its heads read there and, for a
            cross-attention, the stream its k and v read (``Stream.memory``; else None); returns
            ``{(role, head): stream}`` for the receivers that read another one (the same tensor for
            several receivers is run once).

    Raises:
        ValueError: a receiver whose input already has a replacement in this forward.
    """
    sites = model.sites
    seen: dict[int, Tensor] = {}  # the stream each layer's heads read, this forward
    set_here: dict[int, list[str]] = {}  # the inputs replaced at each layer, this forward
    memory: dict[str, Tensor] = {}  # "stream": the memory's stream, "read": what cross-attention's keys read

    def at_memory(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        assert stream.memory is not None
        out = output[0] if isinstance(output, (tuple, list)) else output
        x = args[0] if args and isinstance(args[0], Tensor) else kwargs.get("hidden_states")
        memory["read"] = out
        memory["stream"] = x if stream.memory.kind == "norm" and isinstance(x, Tensor) else out

    def at_point(layer: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args and isinstance(args[0], Tensor) else kwargs.get("hidden_states")
            if isinstance(x, Tensor):
                seen[layer] = x
        return hook

    def at_site(layer: int) -> Callable[..., None]:
        site, point = sites[layer], stream.layers[layer]

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = seen.pop(layer, None)
            if x is None:
                return
            wanted = streams(layer, x, memory.get("stream") if site.cross else None)
            if not wanted:
                return
            computed: dict[int, tuple[Tensor, Tensor, Tensor]] = {}
            chosen: dict[str, dict[int, Tensor]] = {"q": {}, "k": {}, "v": {}}
            for (role, head), own in wanted.items():
                if id(own) not in computed and site.cross and role in ("k", "v"):  # the keys read their own memory
                    read = own if stream.memory_norm is None else stream.memory_norm.forward(own)
                    replaced = _replaced(site, args, kwargs, memory["read"], read)
                    computed[id(own)] = _inputs_from(site, point, x, *replaced)
                elif id(own) not in computed:
                    computed[id(own)] = _inputs_from(site, point, own, args, kwargs)
                q, k, v = computed[id(own)]
                chosen[role][head] = {"q": q, "k": k, "v": v}[role][:, head]
            for role, heads in chosen.items():
                if not heads:
                    continue
                if role in site.input_replacements:
                    raise ValueError(f"layer {layer}: its heads' {role} already has a replacement in this forward")
                order = sorted(heads)
                site.input_replacements[role] = Replacement(torch.tensor(order), torch.stack(
                    [heads[h] for h in order], dim=1))
                set_here.setdefault(layer, []).append(role)
        return hook

    def after_site(layer: int) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            for role in set_here.pop(layer, ()):  # this forward's only
                sites[layer].input_replacements.pop(role, None)
        return hook

    calls = [call_of(sites, site) for site in sites]
    with ExitStack() as stack:
        stack.enter_context(intervening(model))  # also puts the inputs back after an error
        # the point's hook first: when the point is the attention module itself, it runs before the site's
        stack.enter_context(on_calls(model.model, [
            *((point.module, point.call, at_point(layer)) for layer, point in enumerate(stream.layers)),
            *((site.module, call, at_site(site.layer)) for site, call in zip(sites, calls))]))
        stack.enter_context(on_calls(model.model, [
            *((site.module, call, after_site(site.layer)) for site, call in zip(sites, calls)),
            *([] if stream.memory is None else [(stream.memory.module, stream.memory.call, at_memory)])], after=True))
        yield


def forward_inputs(model: HeadedModel, inputs: Any) -> dict[str, Any]:
    """A forward's keyword arguments (``HeadedModel.inputs``), without a key/value cache where the model
    makes one: the extra calls of ``own_inputs`` must not add to it."""
    kwargs = model.inputs(inputs)
    if "use_cache" in inspect.signature(model.model.forward).parameters:
        kwargs.setdefault("use_cache", False)
    return kwargs


def _inputs_from(site: AttentionSite, point: StreamPoint, own: Tensor, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v of every head of ``site`` as its module computes them from the stream ``own``.

    Returns:
        ``(q (batch, n_heads, pos, d_head), k, v (batch, n_kv_heads, pos, d))``.
    """
    hidden = point.module.forward(own) if point.kind == "norm" else own
    taken: list[TapOutput] = []
    firsts = [site.kv_head_of.index(g) for g in range(site.n_kv_heads)]  # a query head reading each kv head

    def sink(layer: int, out: TapOutput) -> None:
        taken.append(out)
        raise _StopCallError

    saved_tap, saved_inputs = site.tap, site.input_replacements
    attached = site.module.__dict__[SITE_ATTRIBUTE]
    site.tap = Tap(sink, q=list(range(site.n_heads)), k=firsts, v=firsts)
    site.input_replacements = {}
    site.module.__dict__[SITE_ATTRIBUTE] = site  # a module run in several layers: this call is this site's
    try:
        if args and isinstance(args[0], Tensor):
            site.module.forward(hidden, *args[1:], **kwargs)
        else:
            site.module.forward(*args, **{**kwargs, "hidden_states": hidden})
    except _StopCallError:
        pass
    finally:
        site.tap, site.input_replacements = saved_tap, saved_inputs
        site.module.__dict__[SITE_ATTRIBUTE] = attached
    if not taken:
        raise ValueError(f"layer {site.layer} ({site.name}): its module ran without calling headlab's attention")
    out = taken[0]
    assert out.q is not None and out.k is not None and out.v is not None
    return out.q, out.k, out.v


def _replaced(site: AttentionSite, args: tuple[Any, ...], kwargs: dict[str, Any], read: Tensor,
              own: Tensor) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The call's arguments with ``read`` (the tensor itself, or a view of all of it) replaced by ``own``.

    Raises:
        ValueError: no argument is ``read``.
    """
    def same(value: Any) -> bool:
        return isinstance(value, Tensor) and (value is read or (value.data_ptr() == read.data_ptr()
                                                                and value.shape == read.shape))

    if not any(same(value) for value in (*args, *kwargs.values())):
        raise ValueError(f"layer {site.layer} ({site.name}): no argument of its call is the encoder's output that its "
                         "keys and values read")
    return (tuple(own if same(a) else a for a in args),
            {name: own if same(value) else value for name, value in kwargs.items()})
