"""The two runs every circuit method starts from: a clean and a corrupted input of the same shape, each
with every head's result (or z) and the stream where the first layer's heads read it.

Axis legend:
    result  (batch, head, pos, d_model)   a head's z through its slice of the output projection
    stream  (batch, pos, d_model)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from headlab.capture.cache import run_with_cache
from headlab.circuits.graph import INPUT, Sender, check_one_stream
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


class _EnteredError(Exception):
    """Raised where the input enters the stream: the forward is not needed further."""


def entered(model: HeadedModel, stream: Stream, inputs: Mapping[str, Any]) -> Tensor:
    """The stream where ``inputs`` enter it (``Stream.entry``: the first layer's stream), by a forward without
    gradients stopped there."""
    found: list[Tensor] = []

    def stop(x: Tensor) -> Tensor:
        found.append(x.detach())
        raise _EnteredError

    with suppress(_EnteredError), stream.hooked(entry=stop), model.running(grad=False):
        model.model(**inputs)
    return found[0]


def moved(stream: Stream, clean: Tensor | None, alpha: float) -> AbstractContextManager[None]:
    """For the forwards in the block (of the corrupted input): the stream where the input enters it moved ``alpha``
    of the way to the clean input's (``clean``, as ``entered`` gives it; ``alpha = 0`` or None: left as it is), as a
    leaf of the autograd graph, so that everything after it is in it whether or not the model's parameters want
    gradients. Whatever makes the stream before it (embeddings, a patch embedding) is the input's."""
    def move(x: Tensor) -> Tensor:
        start = x.detach()
        if clean is None or not alpha:
            return start.requires_grad_(True)
        return (start + alpha * (clean.to(start.dtype) - start)).requires_grad_(True)

    return stream.hooked(entry=move)


def prepare(model: HeadedModel, clean: Inputs, corrupted: Inputs, metric: Metric, *,
            take: tuple[str, ...] = ("result", "z"), one_stream: bool = True) -> tuple[Stream, Run, Run]:
    """The model's stream and the clean and corrupted runs, each taking ``take`` of every head.

    Args:
        one_stream: refuse a model of several streams (``paired``).

    Raises:
        ValueError: a model of several streams where refused, inputs of different shapes, or runs that score the
            same.
    """
    clean_inputs, corrupted_inputs = paired(model, clean, corrupted, one_stream=one_stream)
    stream = stream_of(model, corrupted_inputs)
    clean_run = run(model, stream, clean_inputs, metric, take=take)
    corrupted_run = run(model, stream, corrupted_inputs, metric, take=take)
    check_gap(clean_run.metric, corrupted_run.metric)
    return stream, clean_run, corrupted_run


def paired(model: HeadedModel, clean: Inputs, corrupted: Inputs, *,
           one_stream: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """The clean and corrupted inputs as forward keyword arguments.

    Args:
        one_stream: refuse a model of several streams (``graph.check_one_stream``: the methods that build the graph
            of one stream); path patching, which freezes heads and replaces a receiver's input as the model computed
            it, takes any.

    Raises:
        ValueError: a model of several streams where refused, or inputs of different shapes.
    """
    if one_stream:
        check_one_stream(model)
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
