"""The two runs every circuit method starts from: a clean and a corrupted input of the same shape, each
with every head's result (or z) and the stream where the first layer's heads read it.

Axis legend:
    result  (batch, head, pos, d_model)   a head's z through its slice of the output projection
    stream  (batch, pos, d_model)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headlab.capture.cache import run_with_cache
from headlab.circuits.graph import INPUT, Sender
from headlab.circuits.inputs import forward_inputs
from headlab.models import HeadedModel
from headlab.models.handle import Inputs
from headlab.models.stream import Stream, stream_of

Metric = Callable[[Any], Tensor]  # the model's output -> a scalar tensor (differentiable for the gradient methods)


@dataclass
class Run:
    """One unpatched forward.

    Attributes:
        inputs: the forward's keyword arguments.
        metric: the metric of its output.
        results: ``{layer: result}`` of every head.
        z: ``{layer: z (batch, head, pos, d_head_v)}`` of every head.
        stream: the stream where the first layer's heads read it: what the input sends.
    """

    inputs: dict[str, Any]
    metric: float
    results: dict[int, Tensor]
    z: dict[int, Tensor]
    stream: Tensor

    def sent(self, sender: Sender) -> Tensor:
        """What ``sender`` adds to the stream: the input's stream, or a head's result ``(batch, pos, d_model)``."""
        if isinstance(sender, str):
            return self.stream
        return self.results[sender[0]][:, sender[1]]


def run(model: HeadedModel, stream: Stream, inputs: Mapping[str, Any], metric: Metric, *,
        take: tuple[str, ...] = ("result", "z")) -> Run:
    """Run ``inputs`` once without gradients, taking ``take`` of every head and the stream before the first layer."""
    streams: dict[int | str, Tensor] = {}
    with torch.no_grad(), stream.hooked(record=streams):
        cache = run_with_cache(model, inputs, take=take, grad=False)
    results = {site.layer: cache["result", site.layer] for site in model.sites} if "result" in take else {}
    z = {site.layer: cache["z", site.layer] for site in model.sites} if "z" in take else {}
    return Run(dict(inputs), float(metric(cache.output)), results, z, streams[0].detach())


def embedding_modules(model: HeadedModel) -> list[tuple[str, nn.Embedding]]:
    """The model's ``nn.Embedding`` modules (tokens, positions, other input fields), by name."""
    return [(name, m) for name, m in model.model.named_modules() if isinstance(m, nn.Embedding)]


class _EmbeddedError(Exception):
    """Raised where the first layer's heads read the stream: every embedding of the input has run."""


def embeddings_of(model: HeadedModel, stream: Stream, inputs: Mapping[str, Any]) -> dict[str, Tensor]:
    """``{name: output}`` of every ``nn.Embedding`` of the model on ``inputs``, by a forward without gradients
    stopped where the first layer's heads read the stream (``stream.layers[0]``)."""
    embeddings: dict[str, Tensor] = {}

    def stop(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        raise _EmbeddedError

    with ExitStack() as stack:
        stack.enter_context(suppress(_EmbeddedError))  # outermost: the hooks go and the mode comes back first
        for name, module in embedding_modules(model):
            stack.callback(module.register_forward_hook(
                lambda m, args, out, name=name: embeddings.__setitem__(name, out.detach())).remove)
        stack.callback(stream.layers[0].module.register_forward_pre_hook(stop, with_kwargs=True).remove)
        stack.enter_context(model.running(grad=False))
        model.model(**inputs)
    return embeddings


@contextmanager
def interpolated(model: HeadedModel, clean: Mapping[str, Tensor] | None, alpha: float) -> Iterator[None]:
    """For the forwards in the block (of the corrupted input): every embedding's output moved ``alpha`` of the
    way to the clean input's (``clean``: ``{name: output}``, as ``embeddings_of`` gives them; ``alpha = 0`` or
    None: left as it is), as leaves of the autograd graph, so that everything after them
    is in it whether or not the model's parameters want gradients.

    Raises:
        ValueError: the model has no ``nn.Embedding`` that ran (its inputs cannot be moved to the clean run's).
    """
    modules = [(name, m) for name, m in embedding_modules(model) if clean is None or name in clean]
    if not modules:
        raise ValueError(f"{model.architecture} has no nn.Embedding that ran: its inputs cannot be moved between the "
                         "corrupted and clean runs")

    def hook(name: str) -> Callable[..., Tensor]:
        def moved(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
            start = output.detach()
            if clean is None or not alpha:
                return start.requires_grad_(True)
            return (start + alpha * (clean[name].to(start.dtype) - start)).requires_grad_(True)
        return moved

    with ExitStack() as stack:
        for name, module in modules:
            stack.callback(module.register_forward_hook(hook(name)).remove)
        yield


def prepare(model: HeadedModel, clean: Inputs, corrupted: Inputs, metric: Metric, *,
            take: tuple[str, ...] = ("result", "z")) -> tuple[Stream, Run, Run]:
    """The model's stream and the clean and corrupted runs, each taking ``take`` of every head.

    Raises:
        ValueError: inputs of different shapes, or runs that score the same.
    """
    clean_inputs, corrupted_inputs = paired(model, clean, corrupted)
    stream = stream_of(model, corrupted_inputs)
    clean_run = run(model, stream, clean_inputs, metric, take=take)
    corrupted_run = run(model, stream, corrupted_inputs, metric, take=take)
    check_gap(clean_run.metric, corrupted_run.metric)
    return stream, clean_run, corrupted_run


def paired(model: HeadedModel, clean: Inputs, corrupted: Inputs) -> tuple[dict[str, Any], dict[str, Any]]:
    """The clean and corrupted inputs as forward keyword arguments.

    Raises:
        ValueError: inputs of different shapes.
    """
    clean_inputs, corrupted_inputs = forward_inputs(model, clean), forward_inputs(model, corrupted)
    a, b = input_shape(clean_inputs), input_shape(corrupted_inputs)
    if a != b:
        raise ValueError(f"clean and corrupted inputs must have the same shape to patch between them: clean {a},"
                         f" corrupted {b} (batch, tokens); reword one so both have as many tokens")
    return clean_inputs, corrupted_inputs


def check_gap(clean: float, corrupted: float) -> None:
    """Refuse runs whose metrics are the same: nothing to attribute.

    Raises:
        ValueError: naming both metrics.
    """
    if not abs(clean - corrupted) > 1e-9 * max(1.0, abs(clean)):
        raise ValueError(f"the clean and corrupted runs score the same ({clean:.6g} and {corrupted:.6g}): there is "
                         "no behaviour to attribute; choose a corruption that changes the metric")


def difference(source: Run, base: Run, sender: Sender) -> Tensor:
    """What ``sender`` sends in ``source`` minus what it sends in ``base``: ``(batch, pos, d_model)``."""
    if sender == INPUT:
        return source.stream - base.stream
    return source.sent(sender) - base.sent(sender)


def input_shape(inputs: Mapping[str, Any]) -> tuple[int, ...]:
    """``(batch, tokens)`` of a forward's keyword arguments (its ``input_ids``, or its first tensor)."""
    first = inputs["input_ids"] if "input_ids" in inputs else next(v for v in inputs.values() if isinstance(v, Tensor))
    return tuple(first.shape)
