"""The two runs every circuit method starts from: a clean and a corrupted input of the same shape, each
with every head's result (or z) and what each input sends: the stream where the first layer of its stack reads
it (an encoder-decoder has two inputs, ``headlab.circuits.graph.input_of``).

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
from headlab.circuits.graph import Sender, check_one_stream, input_layers
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
        streams: ``{input: stream}``: what each input sender sends, the stream where the first layer of its stack
            reads it.
    """

    inputs: dict[str, Any]
    metric: float
    results: dict[int, Tensor]
    z: dict[int, Tensor]
    streams: dict[str, Tensor]

    def sent(self, sender: Sender) -> Tensor:
        """What ``sender`` adds to its stream: an input's stream, or a head's result ``(batch, pos, d_model)``."""
        if isinstance(sender, str):
            return self.streams[sender]
        return self.results[sender[0]][:, sender[1]]


def sent_inputs(model: HeadedModel, streams: Mapping[int | str, Tensor]) -> dict[str, Tensor]:
    """``Run.streams`` from the streams a forward recorded (``Stream.hooked``), detached."""
    return {name: streams[layer].detach() for name, layer in input_layers(model.sites).items()}


def run(model: HeadedModel, stream: Stream, inputs: Mapping[str, Any], metric: Metric, *,
        take: tuple[str, ...] = ("result", "z")) -> Run:
    """Run ``inputs`` once without gradients, taking ``take`` of every head and what each input sends."""
    streams: dict[int | str, Tensor] = {}
    with torch.no_grad(), stream.hooked(record=streams):
        cache = run_with_cache(model, inputs, take=take, grad=False)
    results = {site.layer: cache["result", site.layer] for site in model.sites} if "result" in take else {}
    z = {site.layer: cache["z", site.layer] for site in model.sites} if "z" in take else {}
    return Run(dict(inputs), float(metric(cache.output)), results, z, sent_inputs(model, streams))


class _EnteredError(Exception):
    """Raised where the input enters the stream: the forward is not needed further."""


def entered(model: HeadedModel, stream: Stream, inputs: Mapping[str, Any]) -> dict[str, Tensor]:
    """``{stack: stream}`` where ``inputs`` enter each stack's stream (``Stream.entries``: its first layer's stream),
    by a forward without gradients stopped once every one is found."""
    found: dict[str, Tensor] = {}

    def stop(stack: str) -> Callable[[Tensor], Tensor]:
        def keep(x: Tensor) -> Tensor:
            found[stack] = x.detach()
            if len(found) == len(stream.entries):
                raise _EnteredError
            return x
        return keep

    with suppress(_EnteredError), stream.hooked(entries={stack: stop(stack) for stack in stream.entries}), \
            model.running(grad=False):
        model.model(**inputs)
    return found


def moved(stream: Stream, clean: Mapping[str, Tensor] | None, alpha: float) -> AbstractContextManager[None]:
    """For the forwards in the block (of the corrupted input): the stream where the input enters each stack's stream
    moved ``alpha`` of the way to the clean input's (``clean``, as ``entered`` gives it; ``alpha = 0`` or None: left
    as it is), as a leaf of the autograd graph, so that everything after it is in it whether or not the model's
    parameters want gradients. Whatever makes the stream before it (embeddings, a patch embedding) is the input's."""
    def move(stack: str) -> Callable[[Tensor], Tensor]:
        def edit(x: Tensor) -> Tensor:
            start = x.detach()
            if clean is None or not alpha:
                return start.requires_grad_(True)
            return (start + alpha * (clean[stack].to(start.dtype) - start)).requires_grad_(True)
        return edit

    return stream.hooked(entries={stack: move(stack) for stack in stream.entries})


def prepare(model: HeadedModel, clean: Inputs, corrupted: Inputs, metric: Metric, *,
            take: tuple[str, ...] = ("result", "z"), one_stream: bool = True) -> tuple[Stream, Run, Run]:
    """The model's stream and the clean and corrupted runs, each taking ``take`` of every head.

    Args:
        one_stream: refuse a model whose streams the graph does not join (``paired``).

    Raises:
        ValueError: such a model where refused, inputs of different shapes, or runs that score the same.
    """
    clean_inputs, corrupted_inputs = paired(model, clean, corrupted, one_stream=one_stream)
    stream = graph_stream(model, corrupted_inputs) if one_stream else stream_of(model, corrupted_inputs)
    clean_run = run(model, stream, clean_inputs, metric, take=take)
    corrupted_run = run(model, stream, corrupted_inputs, metric, take=take)
    check_gap(clean_run.metric, corrupted_run.metric)
    return stream, clean_run, corrupted_run


def paired(model: HeadedModel, clean: Inputs, corrupted: Inputs, *,
           one_stream: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """The clean and corrupted inputs as forward keyword arguments.

    Args:
        one_stream: refuse a model whose streams the graph does not join (``graph.check_one_stream``: several
            towers; the methods that build the graph); path patching, which freezes heads and replaces a receiver's
            input as the model computed it, takes any.

    Raises:
        ValueError: such a model where refused, or inputs of different shapes.
    """
    if one_stream:
        check_one_stream(model)
    clean_inputs, corrupted_inputs = forward_inputs(model, clean), forward_inputs(model, corrupted)
    a, b = input_shape(clean_inputs), input_shape(corrupted_inputs)
    if a != b:
        raise ValueError(f"clean and corrupted inputs must have the same shape to patch between them: clean {a},"
                         f" corrupted {b} (batch, tokens); reword one so both have as many tokens")
    for name, value in clean_inputs.items():  # an encoder-decoder's targets too
        other = corrupted_inputs.get(name)
        if isinstance(value, Tensor) and isinstance(other, Tensor) and value.shape != other.shape:
            raise ValueError(f"clean and corrupted {name} must have the same shape to patch between them: clean "
                             f"{tuple(value.shape)}, corrupted {tuple(other.shape)}; reword one so both have as many "
                             "tokens")
    return clean_inputs, corrupted_inputs


def graph_stream(model: HeadedModel, inputs: Mapping[str, Any]) -> Stream:
    """The model's ``Stream`` (``stream_of``), with the memory the graph needs where heads cross-attend.

    Raises:
        ValueError: a cross-attention whose keys' stream was not found (``Stream.memory``).
    """
    stream = stream_of(model, inputs)
    if stream.memory is None and any(site.cross for site in model.sites):
        raise ValueError(f"{model.architecture}: cannot find the stream its cross-attention's keys and values read (no "
                         "key projection of a cross-attention site was recognised); the graph of edge attribution, "
                         "edge patching and circuits needs it")
    return stream


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
    return source.sent(sender) - base.sent(sender)


def input_shape(inputs: Mapping[str, Any]) -> tuple[int, ...]:
    """``(batch, tokens)`` of a forward's keyword arguments (its ``input_ids``, or its first tensor)."""
    first = inputs["input_ids"] if "input_ids" in inputs else next(v for v in inputs.values() if isinstance(v, Tensor))
    return tuple(first.shape)
