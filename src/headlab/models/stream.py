"""Where a model's heads read the residual stream and where its output reads it: found by one forward.

The circuits of ``headlab.circuits`` need three places beside the attention sites, and find them as
``attach`` finds the sites, from what one forward of the model does (no table of architectures):

- **layer points**: where layer L's heads read the stream. The attention module's input is the
  output of a norm (pre-norm models: GPT-2, LLaMA, headlab's ``TinyTransformer``): the stream is
  that norm's input. Otherwise (a post-norm BERT, whose attention reads the previous layer's
  normalised output) the stream is what the norm that produced it took, or the attention module's
  input when no norm produced it. Everything between the point and the heads' q, k, v — the norm,
  the projections, positions, q/k norms — is the model's own code.
- **the final point**: where the output reads the stream: the final norm's input (the stream
  before the final norm), or the unembedding's input without a norm.
- **the readout**: the final norm and the unembedding (the module whose output is the logits), when
  the model has them.

A point is "the first tensor input of a module" (its first positional argument, or its
``hidden_states``): ``Stream.hooked`` reads and edits it there with forward pre-hooks.

Axis legend:
    stream  (batch, pos, d_model)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from headlab.models.handle import HeadedModel, headed

STREAM_ATTRIBUTE = "_headlab_stream"  # on the handle: the Stream found for it
LOGITS_ATTRIBUTE = "_headlab_has_logits"  # on the handle: whether its output is logits
Edit = Callable[[Tensor], Tensor]  # the stream at a point -> the stream the model goes on with


@dataclass(frozen=True)
class StreamPoint:
    """Where the stream is read: the first tensor input of ``module``.

    Attributes:
        module: a norm (the stream is its input), the attention module itself, or the unembedding.
        name: its dotted name in the model ("" for the model itself).
        kind: "norm", "attention" or "unembedding": what ``module`` is.
    """

    module: nn.Module
    name: str
    kind: str


@dataclass
class Stream:
    """The residual stream's points of a model (see the module docstring).

    Attributes:
        layers: one ``StreamPoint`` per attention layer: where its heads read the stream.
        final: where the output reads it.
        final_norm: the norm between the final point and the output, or None.
        unembedding: the module whose output is the logits (``(vocab, d_model)`` weight), or None
            (the model has no language-model head).
        unembedding_name: its dotted name, or "".
    """

    layers: list[StreamPoint]
    final: StreamPoint
    final_norm: nn.Module | None
    unembedding: nn.Module | None
    unembedding_name: str = ""
    _points: list[StreamPoint] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._points = [*self.layers, self.final]

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
    def hooked(self, *, layers: Mapping[int, Edit] | None = None, final: Edit | None = None,
               record: dict[int | str, Tensor] | None = None) -> Iterator[None]:
        """For the block: edit the stream at some points, and record it at every point.

        Args:
            layers: ``{layer: edit}``: layer L's heads read ``edit(stream)`` instead of the stream.
            final: the output reads ``final(stream)``.
            record: filled with ``{layer: stream, "final": stream}`` as the model runs (after the
                edits; the tensors themselves, in the autograd graph when the forward has one).
        """
        edits: dict[int | str, Edit] = dict((layers or {}).items())
        if final is not None:
            edits["final"] = final
        keys: list[int | str] = [*range(len(self.layers)), "final"]
        handles = []
        for key, point in zip(keys, self._points):
            handles.append(point.module.register_forward_pre_hook(_hook(key, edits.get(key), record),
                                                                  with_kwargs=True))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def stream_of(model: HeadedModel, inputs: Mapping[str, Any]) -> Stream:
    """The model's ``Stream``, found by one forward on ``inputs`` (a forward's keyword arguments) the
    first time and kept on the handle.

    Raises:
        ValueError: a point read twice in one forward (a module shared between layers), or no place
            where the output reads the stream.
    """
    found = model.__dict__.get(STREAM_ATTRIBUTE)
    if found is None:
        found = _find(model, inputs)
        model.__dict__[STREAM_ATTRIBUTE] = found
    return found


def _find(model: HeadedModel, inputs: Mapping[str, Any]) -> Stream:
    net = model.model
    names = {id(m): name for name, m in net.named_modules()}
    calls: list[tuple[nn.Module, Tensor | None, Tensor | None]] = []  # (module, first input, output) as finished
    site_inputs: dict[int, Tensor] = {}
    sites = {id(site.module): site.layer for site in model.sites}

    def after(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        calls.append((module, _first_input(args, kwargs), _first_tensor(output)))

    def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = _first_input(args, kwargs)
        if x is not None:
            site_inputs.setdefault(sites[id(module)], x)

    handles = [m.register_forward_hook(after, with_kwargs=True) for m in net.modules()]
    handles += [site.module.register_forward_pre_hook(before, with_kwargs=True) for site in model.sites]
    try:
        with model.running(grad=False):
            output = net(**inputs)
    finally:
        for handle in handles:
            handle.remove()

    layers = []
    for site in model.sites:
        x = site_inputs.get(site.layer)
        norm = None if x is None else _producer(calls, x, _is_norm)
        if norm is not None:
            layers.append(StreamPoint(norm, names[id(norm)], "norm"))
        else:
            layers.append(StreamPoint(site.module, site.name, "attention"))
    out = _output_tensor(output)
    unembedding = None
    if out is not None and _is_logits(output):
        getter = getattr(net, "get_output_embeddings", None)
        declared = getter() if callable(getter) else None
        called = isinstance(declared, nn.Module) and any(m is declared for m, _, _ in calls)
        # the model's own word, else the module whose output is the logits
        unembedding = declared if called else _producer(calls, out, _is_unembedding)
    read = out
    if unembedding is not None:
        read = next((x for m, x, _ in calls if m is unembedding), None)
    final_norm = None if read is None else _producer(calls, read, _is_norm)
    if final_norm is not None:
        final = StreamPoint(final_norm, names[id(final_norm)], "norm")
    elif unembedding is not None:
        final = StreamPoint(unembedding, names[id(unembedding)], "unembedding")
    else:
        raise ValueError(f"{model.architecture}: cannot find where its output reads the residual stream (no norm or "
                         "unembedding produces its output)")
    modules = [point.module for point in [*layers, final]]
    for point in [*layers, final]:
        runs = sum(m is point.module for m, _, _ in calls)
        if runs != 1 or modules.count(point.module) != 1:
            raise ValueError(f"{model.architecture}: {point.name or 'the model'} reads the residual stream {runs} "
                             "times in one forward (a module shared between layers): its layers' streams cannot be "
                             "told apart")
    return Stream(layers, final, final_norm, unembedding,
                  "" if unembedding is None else names[id(unembedding)])


def _hook(key: int | str, edit: Edit | None, record: dict[int | str, Tensor] | None) -> Callable[..., Any]:
    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        x = _first_input(args, kwargs)
        if x is None:
            return None
        if edit is not None:
            x = edit(x)
            if args and isinstance(args[0], Tensor):
                args = (x, *args[1:])
            else:
                kwargs = {**kwargs, "hidden_states": x}
        if record is not None:
            record[key] = x
        return args, kwargs

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


def _producer(calls: list[tuple[nn.Module, Tensor | None, Tensor | None]], x: Tensor,
              test: Callable[[nn.Module], bool]) -> nn.Module | None:
    """The innermost module (the first to finish) whose output is ``x`` (or a view of all of it: a model that
    slices its hidden states before the unembedding) and that passes ``test``."""
    return next((m for m, _, out in calls if out is not None and _same(out, x) and test(m)), None)


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
