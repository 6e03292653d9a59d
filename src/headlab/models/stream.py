"""Where a model's heads read the residual stream, where the input enters it and where its output reads it:
found by one forward.

The circuits of ``headlab.circuits`` need these places beside the attention sites, and find them as
``attach`` finds the sites, from what one forward of the model does (no table of architectures):

- **layer points**: where layer L's heads read the stream (an encoder-decoder's encoder layers read the
  encoder's stream, its decoder's self- and cross-attention layers the decoder's: a cross-attention's point
  is where its queries read). The attention module's input is the
  output of a norm (pre-norm models: GPT-2, LLaMA, ViT, headlab's ``TinyTransformer``): the stream is
  that norm's input. Otherwise (a post-norm BERT, whose attention reads the previous layer's
  normalised output) the stream is what the norm that produced it took, or the attention module's
  input when no norm produced it. Everything between the point and the heads' q, k, v — the norm,
  the projections, positions, q/k norms — is the model's own code.
- **the entry**: where the input enters the stream: the outermost module around the first layer's point
  that reads the same stream (GPT-2's first block, ViT's encoder), so that a stream given there is what
  every later module reads, residual paths included. Whatever makes the stream before it (token and
  position embeddings, a vision model's patch embedding) is the input's.
- **the final point**: where the output reads the stream: the final norm's input (the stream before the
  final norm), or the unembedding's input without a norm; in a model that outputs the stream itself
  (``last_hidden_state`` made by no norm: CLIP's vision tower), that output, as the module that made it
  (the last layer) returns it.
- **the readout**: the final norm and the unembedding (the module whose output is the logits), when
  the model has them.
- in an encoder-decoder, **each stack's entry** (the decoder's stream begins with the target's embeddings)
  and **the memory**: where cross-attention's keys and values read the encoder's stream — the input of the
  norm that makes the tensor their key projection reads (the encoder's final norm), or without one that
  tensor, as the module that made it returns it.

A point is one call of a module: the stream is the call's first tensor input (its first positional
argument, or its ``hidden_states``), or for the final point of kind "output" the call's first tensor
output. A module run in several layers (ALBERT's one layer) is one point per call: its k-th call in a
forward is the k-th such point. ``Stream.hooked`` reads and edits the stream there with hooks that count
the module's calls in each forward of the model.

Axis legend:
    stream  (batch, pos, d_model)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from headlab.models.handle import HeadedModel, headed
from headlab.models.site import AttentionSite

STREAM_ATTRIBUTE = "_headlab_stream"  # on the handle: the Stream found for it
LOGITS_ATTRIBUTE = "_headlab_has_logits"  # on the handle: whether its output is logits
Edit = Callable[[Tensor], Tensor]  # the stream at a point -> the stream the model goes on with
Hook = Callable[..., Any]  # a torch forward (pre-)hook with keyword arguments
Call = tuple[nn.Module, Tensor | None, Tensor | None]  # (module, first input, first output) of a finished call


@dataclass(frozen=True)
class StreamPoint:
    """Where the stream is read: the first tensor input (or for kind "output", output) of ``module``'s call
    number ``call`` in a forward.

    Attributes:
        module: a norm (the stream is its input), the attention module itself, the unembedding, the module
            the input enters the stream at, or the module whose output the model outputs.
        name: its dotted name in the model ("" for the model itself).
        kind: "norm", "attention", "unembedding", "entry" or "output": what ``module`` is.
        call: which of the module's calls in one forward (0 but for a module run in several layers).
    """

    module: nn.Module
    name: str
    kind: str
    call: int = 0

    @property
    def label(self) -> str:
        """``"encoder.layer.0.layernorm_before"``, ``"albert.encoder.albert_layer_groups.0 (call 3)"``."""
        return (self.name or "the model") + (f" (call {self.call})" if self.call else "")


@dataclass
class Stream:
    """The residual stream's points of a model (see the module docstring).

    Attributes:
        layers: one ``StreamPoint`` per attention layer: where its heads read the stream.
        entry: where the input enters the stream (its stream is the first layer's).
        final: where the output reads it.
        final_norm: the norm between the final point and the output, or None.
        unembedding: the module whose output is the logits (``(vocab, d_model)`` weight), or None
            (the model has no language-model head).
        net: the model whose forwards the points' calls are counted in.
        unembedding_name: its dotted name, or "".
        entries: ``{stack: point}``: where the input enters each stack's stream (``AttentionSite.stack``;
            ``entry`` is the first stack's).
        memory: where cross-attention's keys and values read the other stack's stream, or None (no cross-attention,
            or its key projection not found).
        memory_norm: the norm between the memory point and the keys' projections, or None.
    """

    layers: list[StreamPoint]
    entry: StreamPoint
    final: StreamPoint
    final_norm: nn.Module | None
    unembedding: nn.Module | None
    net: nn.Module = field(repr=False)
    unembedding_name: str = ""
    entries: dict[str, StreamPoint] = field(default_factory=dict)
    memory: StreamPoint | None = None
    memory_norm: nn.Module | None = None

    @property
    def W_U(self) -> Tensor:
        """``(d_model, vocab)``: the unembedding's weight, transposed (a view).

        Raises:
            ValueError: the model has no unembedding (no language-model head).
        """
        if self.unembedding is None:
            raise ValueError("this model has no unembedding (no language-model head: its output is not logits over a "
                             "vocabulary); load it with its LM head, e.g. AutoModelForCausalLM or "
                             "AutoModelForMaskedLM")
        weight = self.unembedding.weight
        assert isinstance(weight, Tensor)
        return weight.t()

    @contextmanager
    def hooked(self, *, entry: Edit | None = None, layers: Mapping[int, Edit] | None = None,
               final: Edit | None = None, record: dict[int | str, Tensor] | None = None,
               entries: Mapping[str, Edit] | None = None, memory: Edit | None = None) -> Iterator[None]:
        """For the block: edit the stream at some points, and record it at every point.

        Args:
            entry: the model goes on from ``entry(stream)`` where the input enters the stream (every later
                module reads it, the first layer's heads included).
            layers: ``{layer: edit}``: layer L's heads read ``edit(stream)`` instead of the stream.
            final: the output reads ``final(stream)``.
            record: filled with ``{layer: stream, "final": stream}`` (and ``"memory": stream`` where the model has
                one) as the model runs (after the edits; the tensors themselves, in the autograd graph when the
                forward has one).
            entries: ``{stack: edit}``: as ``entry``, at each stack's entry (``Stream.entries``).
            memory: cross-attention's keys and values read ``memory(stream)`` (``Stream.memory``).
        """
        edits: dict[int | str, Edit] = dict((layers or {}).items())
        if final is not None:
            edits["final"] = final
        if memory is not None:
            edits["memory"] = memory
        points: list[tuple[int | str, StreamPoint]] = [*enumerate(self.layers), ("final", self.final)]
        if self.memory is not None:
            points.append(("memory", self.memory))
        hooks = [] if entry is None else [(self.entry, _editing(entry, None, "entry", "entry"))]
        hooks += [(self.entries[stack], _editing(edit, None, "entry", "entry")) for stack, edit in
                  (entries or {}).items()]
        hooks += [(point, _editing(edits.get(key), record, key, point.kind)) for key, point in points]
        with ExitStack() as stack:
            stack.enter_context(on_calls(self.net, [(p.module, p.call, h) for p, h in hooks if p.kind != "output"]))
            stack.enter_context(on_calls(self.net, [(p.module, p.call, h) for p, h in hooks if p.kind == "output"],
                                         after=True))
            yield


@contextmanager
def on_calls(net: nn.Module, hooks: Sequence[tuple[nn.Module, int, Hook]], *, after: bool = False) -> Iterator[None]:
    """For the forwards of ``net`` in the block: each ``hook`` on the call number ``call`` of its ``module`` in
    each forward (a torch forward pre-hook with keyword arguments, or with ``after`` a forward hook); several hooks
    on one call run in the order given, each seeing what the one before returned."""
    chosen: dict[int, dict[int, list[Hook]]] = {}
    modules: dict[int, nn.Module] = {}
    for module, call, hook in hooks:
        chosen.setdefault(id(module), {}).setdefault(call, []).append(hook)
        modules[id(module)] = module
    counts: dict[int, int] = {}

    def restart(module: nn.Module, args: Any) -> None:
        counts.clear()

    def dispatch(key: int) -> Hook:
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *output: Any) -> Any:
            call = counts.get(key, 0)
            counts[key] = call + 1
            changed = False
            for each in chosen[key].get(call, ()):
                returned = each(module, args, kwargs, *output)
                if returned is not None:
                    changed = True
                    if after:
                        output = (returned,)
                    else:
                        args, kwargs = returned
            if not changed:
                return None
            return output[0] if after else (args, kwargs)
        return hook

    with ExitStack() as stack:
        if hooks:
            stack.callback(net.register_forward_pre_hook(restart).remove)
        for key, module in modules.items():
            register = module.register_forward_hook if after else module.register_forward_pre_hook
            stack.callback(register(dispatch(key), with_kwargs=True).remove)
        yield


def call_of(sites: Sequence[AttentionSite], site: AttentionSite) -> int:
    """Which of its module's calls in a forward ``site`` is (0 but for a module run in several layers)."""
    return [s for s in sites if s.module is site.module].index(site)


def stream_of(model: HeadedModel, inputs: Mapping[str, Any]) -> Stream:
    """The model's ``Stream``, found by one forward on ``inputs`` (a forward's keyword arguments) the
    first time and kept on the handle.

    Raises:
        ValueError: layers of one stack reading streams of different shapes (Swin), two layers reading the stream
            at one point, or no place where the output reads the stream.
    """
    found = model.__dict__.get(STREAM_ATTRIBUTE)
    if found is None:
        found = _find(model, inputs)
        model.__dict__[STREAM_ATTRIBUTE] = found
    return found


def _find(model: HeadedModel, inputs: Mapping[str, Any]) -> Stream:
    net = model.model
    names = {id(m): name for name, m in net.named_modules()}
    calls: list[Call] = []  # as finished
    site_inputs: dict[int, list[Tensor | None]] = {}  # id(module) -> its calls' first inputs, in call order

    def after(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        calls.append((module, _first_input(args, kwargs), _first_tensor(output)))

    def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        site_inputs.setdefault(id(module), []).append(_first_input(args, kwargs))

    handles = [m.register_forward_hook(after, with_kwargs=True) for m in net.modules()]
    handles += [m.register_forward_pre_hook(before, with_kwargs=True)
                for m in {id(site.module): site.module for site in model.sites}.values()]
    try:
        with model.running(grad=False):
            output = net(**inputs)
    finally:
        for handle in handles:
            handle.remove()

    def point(index: int, kind: str) -> StreamPoint:
        module = calls[index][0]
        return StreamPoint(module, names[id(module)], kind, sum(m is module for m, _, _ in calls[:index]))

    layers, streams = [], []
    for site in model.sites:
        seen = site_inputs.get(id(site.module), [])
        call = call_of(model.sites, site)
        x = seen[call] if call < len(seen) else None
        norm = None if x is None else _produced(calls, x, _is_norm)
        if norm is not None:
            layers.append(point(norm, "norm"))
            x = calls[norm][1]
        else:
            layers.append(StreamPoint(site.module, site.name, "attention", call))
        streams.append(x)
    for stack in {site.stack for site in model.sites}:  # an encoder-decoder's, or several towers': one stream each
        shapes = {tuple(x.shape) for site, x in zip(model.sites, streams) if x is not None and site.stack == stack}
        if len(shapes) > 1:
            raise ValueError(f"{model.architecture}: its layers read streams of different shapes {sorted(shapes)} "
                             "(batch, pos, d_model): it has no single residual stream (a model that merges patches "
                             "between stages or attends within windows, as Swin does), which circuits need")
    out = _output_tensor(output)
    unembedding = None
    if out is not None and _is_logits(output):
        getter = getattr(net, "get_output_embeddings", None)
        declared = getter() if callable(getter) else None
        called = isinstance(declared, nn.Module) and any(m is declared for m, _, _ in calls)
        # the model's own word, else the module whose output is the logits
        made = _produced(calls, out, _is_unembedding)
        unembedding = declared if called else None if made is None else calls[made][0]
    read = out
    if unembedding is not None:
        read = next((x for m, x, _ in calls if m is unembedding), None)
    norm = None if read is None else _produced(calls, read, _is_norm)
    made = None if out is None else _produced(calls, out, lambda m: m is not net)
    if norm is not None:
        final = point(norm, "norm")
    elif unembedding is not None:
        final = point(next(i for i, (m, _, _) in enumerate(calls) if m is unembedding), "unembedding")
    elif made is not None:
        final = point(made, "output")
    else:
        raise ValueError(f"{model.architecture}: cannot find where its output reads the residual stream (no module "
                         "of it makes its output: no norm, unembedding or layer)")
    keys = [(id(p.module), p.call) for p in [*layers, final]]
    for p in [*layers, final]:
        if keys.count((id(p.module), p.call)) != 1:
            raise ValueError(f"{model.architecture}: {p.label} is where two layers (or a layer and the output) read "
                             "the residual stream: their streams cannot be told apart")
    firsts: dict[str, int] = {}  # each stack's first layer
    for site in model.sites:
        firsts.setdefault(site.stack, site.layer)
    entries = {stack: _entry(calls, names, layers[layer], streams[layer]) for stack, layer in firsts.items()}
    memory = _memory(model.sites, calls, net, point)
    return Stream(layers, entries[model.sites[0].stack] if layers else final, final,
                  None if norm is None else calls[norm][0], unembedding, net,
                  "" if unembedding is None else names[id(unembedding)], entries, *memory)


def _memory(sites: Sequence[AttentionSite], calls: list[Call], net: nn.Module,
            point: Callable[[int, str], StreamPoint]) -> tuple[StreamPoint | None, nn.Module | None]:
    """Where cross-attention's keys and values read the other stack's stream (``Stream.memory``) and the norm between,
    from what the first cross-attention's key projection read; ``(None, None)`` without one."""
    site = next((s for s in sites if s.cross and s.layout is not None), None)
    if site is None:
        return None, None
    assert site.layout is not None
    key = next((p.module for p in site.layout.projections if any(s.role == "k" for s in p.segments)), None)
    read = next((x for m, x, _ in calls if m is key), None)
    if read is None:
        return None, None
    norm = _produced(calls, read, _is_norm)
    if norm is not None:
        return point(norm, "norm"), calls[norm][0]
    made = _produced(calls, read, lambda m: m is not net)
    return (None if made is None else point(made, "output")), None


def _entry(calls: list[Call], names: Mapping[int, str], first: StreamPoint, x: Tensor | None) -> StreamPoint:
    """The outermost module around (or at) the first layer's point whose call reads the same stream ``x``."""
    best: StreamPoint = StreamPoint(first.module, first.name, "entry", first.call)
    if x is None:
        return best
    for index, (module, read, _) in enumerate(calls):
        name = names[id(module)]
        around = name != "" and (first.name == name or first.name.startswith(name + "."))
        if around and read is not None and _same(read, x) and len(name) < len(best.name):
            best = StreamPoint(module, name, "entry", sum(m is module for m, _, _ in calls[:index]))
    return best


def _editing(edit: Edit | None, record: dict[int | str, Tensor] | None, key: int | str, kind: str) -> Hook:
    """A hook (``on_calls``) that edits and records the stream at a point: its first input, or for kind "output"
    its first output."""
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *output: Any) -> Any:
        x = _first_tensor(output[0]) if kind == "output" else _first_input(args, kwargs)
        if x is None:
            return None
        if edit is not None:
            x = edit(x)
        if record is not None:
            record[key] = x
        if edit is None:
            return None
        if kind == "output":
            return x if isinstance(output[0], Tensor) else (x, *output[0][1:])
        if args and isinstance(args[0], Tensor):
            return (x, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": x}

    return hook


def _first_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    if args and isinstance(args[0], Tensor):
        return args[0]
    x = kwargs.get("hidden_states")
    return x if isinstance(x, Tensor) else None


def _first_tensor(output: Any) -> Tensor | None:
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    return None


def _output_tensor(output: Any) -> Tensor | None:
    """The model's main output: its logits, else its last hidden state, else its first tensor."""
    for name in ("logits", "last_hidden_state"):
        value = getattr(output, name, None)
        if isinstance(value, Tensor):
            return value
    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    return _first_tensor(output)


def has_logits(model: HeadedModel | nn.Module) -> bool:
    """Whether the model's output is logits (a language-model head), by a one-token forward without gradients the
    first time, kept on the handle (as its ``Stream`` is: analyze, streaming and patching all ask)."""
    model = headed(model)
    found = model.__dict__.get(LOGITS_ATTRIBUTE)
    if found is None:
        bos = getattr(model.tokenizer, "bos_token_id", None)
        ids = torch.tensor([[bos or 0]], device=model.device)
        with model.running(grad=False):
            found = _is_logits(model.model(**model.inputs(ids)))
        model.__dict__[LOGITS_ATTRIBUTE] = found
    return bool(found)


def _is_logits(output: Any) -> bool:
    """A model's output is logits when it says so (``.logits``) or is one bare tensor (a torch model's)."""
    return isinstance(output, Tensor) or isinstance(getattr(output, "logits", None), Tensor)


def _produced(calls: list[Call], x: Tensor, test: Callable[[nn.Module], bool]) -> int | None:
    """The index in ``calls`` of the innermost module's call (the first to finish) whose output is ``x`` (or a view of
    all of it: a model that slices its hidden states before the unembedding) and that passes ``test``."""
    return next((i for i, (m, _, out) in enumerate(calls) if out is not None and _same(out, x) and test(m)), None)


def _same(a: Tensor, b: Tensor) -> bool:
    return a is b or (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride())


def _is_norm(module: nn.Module) -> bool:
    """A normalisation layer: torch's own, or a model's class named for one (LlamaRMSNorm, T5LayerNorm …)."""
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)):
        return True
    return "norm" in type(module).__name__.lower() and not any(True for _ in module.children())


def _is_unembedding(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(weight, Tensor) and weight.dim() == 2
