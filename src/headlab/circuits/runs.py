"""The two runs every circuit method starts from: a clean and a corrupted input of the same shape, each
with every head's result and the stream at every point.

Axis legend:
    result  (batch, head, pos, d_model)   a head's z through its slice of the output projection
    stream  (batch, pos, d_model)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
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
        streams: ``{layer: stream, "final": stream}``.
        embeddings: ``{name: output}`` of every ``nn.Embedding`` of the model that ran (the input's
            tokens and positions).
    """

    inputs: dict[str, Any]
    metric: float
    results: dict[int, Tensor]
    z: dict[int, Tensor]
    streams: dict[int | str, Tensor]
    embeddings: dict[str, Tensor]

    def sent(self, sender: Sender) -> Tensor:
        """What ``sender`` adds to the stream: the input's stream, or a head's result ``(batch, pos, d_model)``."""
        if isinstance(sender, str):
            return self.streams[0]
        return self.results[sender[0]][:, sender[1]]


def run(model: HeadedModel, stream: Stream, inputs: Mapping[str, Any], metric: Metric, *,
        take: tuple[str, ...] = ("result", "z")) -> Run:
    """Run ``inputs`` once without gradients, taking every head's result and z and the stream at every point."""
    streams: dict[int | str, Tensor] = {}
    embeddings: dict[str, Tensor] = {}
    with ExitStack() as stack:
        for name, module in embedding_modules(model):
            stack.callback(module.register_forward_hook(
                lambda m, args, out, name=name: embeddings.__setitem__(name, out.detach())).remove)
        stack.enter_context(torch.no_grad())
        stack.enter_context(stream.hooked(record=streams))
        cache = run_with_cache(model, inputs, take=take, grad=False)
    results = {site.layer: cache["result", site.layer] for site in model.sites} if "result" in take else {}
    z = {site.layer: cache["z", site.layer] for site in model.sites} if "z" in take else {}
    return Run(dict(inputs), float(metric(cache.output)), results, z, {k: v.detach() for k, v in streams.items()},
               embeddings)


def embedding_modules(model: HeadedModel) -> list[tuple[str, nn.Embedding]]:
    """The model's ``nn.Embedding`` modules (tokens, positions, other input fields), by name."""
    return [(name, m) for name, m in model.model.named_modules() if isinstance(m, nn.Embedding)]


@contextmanager
def interpolated(model: HeadedModel, clean: Run, corrupted: Run, alpha: float) -> Iterator[None]:
    """For the forwards in the block: every embedding's output moved ``alpha`` of the way from the corrupted
    run's to the clean run's (``alpha = 0``: the corrupted run's), as leaves of the autograd graph, so that
    everything after them is in it whether or not the model's parameters want gradients.

    Raises:
        ValueError: the model has no ``nn.Embedding`` (its inputs cannot be interpolated).
    """
    modules = [(name, m) for name, m in embedding_modules(model) if name in corrupted.embeddings]
    if not modules:
        raise ValueError(f"{model.architecture} has no nn.Embedding that ran: its inputs cannot be moved between the "
                         "corrupted and clean runs")

    def hook(name: str) -> Callable[..., Tensor]:
        def moved(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
            start = corrupted.embeddings[name]
            point = start + alpha * (clean.embeddings[name] - start) if alpha else start
            return point.detach().to(output.dtype).requires_grad_(True)
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
    clean_inputs, corrupted_inputs = forward_inputs(model, clean), forward_inputs(model, corrupted)
    a, b = _shape(clean_inputs), _shape(corrupted_inputs)
    if a != b:
        raise ValueError(f"clean and corrupted inputs must have the same shape to patch between them: clean {a},"
                         f" corrupted {b} (batch, tokens); reword one so both have as many tokens")
    stream = stream_of(model, corrupted_inputs)
    clean_run = run(model, stream, clean_inputs, metric, take=take)
    corrupted_run = run(model, stream, corrupted_inputs, metric, take=take)
    gap = clean_run.metric - corrupted_run.metric
    if not abs(gap) > 1e-9 * max(1.0, abs(clean_run.metric)):
        raise ValueError(f"the clean and corrupted runs score the same ({clean_run.metric:.6g} and "
                         f"{corrupted_run.metric:.6g}): there is no behaviour to attribute; choose a corruption that "
                         "changes the metric")
    return stream, clean_run, corrupted_run


def difference(source: Run, base: Run, sender: Sender) -> Tensor:
    """What ``sender`` sends in ``source`` minus what it sends in ``base``: ``(batch, pos, d_model)``."""
    if sender == INPUT:
        return source.streams[0] - base.streams[0]
    return source.sent(sender) - base.sent(sender)


def _shape(inputs: Mapping[str, Any]) -> tuple[int, ...]:
    first = inputs["input_ids"] if "input_ids" in inputs else next(v for v in inputs.values() if isinstance(v, Tensor))
    return tuple(first.shape)
