"""Path patching (Wang et al. 2022; Goldowsky-Dill et al. 2023): a sender head's effect on a receiver's
query, key or value input, or on the output directly, with every other head frozen.

For a sender s and a receiver r, by forwards (denoising: the corrupted run is the base, the clean run
the source; noising swaps them):

1. the base run with s's z taken from the source run and every other head's z frozen to the base run's
   (the MLPs and norms recompute): what r's input (its q, or its key/value head's k or v) becomes when
   only s changes, through the stream and the MLPs but through no other head; for the output as
   receiver, the metric of this run is the answer;
2. the base run with r's input replaced by that value (inside headlab's attention function), every
   other head free: ``score = metric(2) − metric(base)``.

One forward per sender for step 1 serves every receiver after it; one forward per (sender, receiver)
for step 2. Exact: no gradient, no linearisation.

Nothing here builds the stream's graph: the receiver's input is what the model computed, so path patching
serves a model of several streams too. In an encoder-decoder, an encoder head's path reaches every
cross-attention head's k and v (through the encoder's output, every other head frozen), a decoder head's
the later decoder heads' q, k, v and cross-attention heads' q, and the output (``headlab.circuits.graph.reads``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from headlab.circuits.graph import (
    INPUT,
    OUTPUT,
    Edge,
    EdgeScores,
    Receiver,
    Sender,
    output_writers,
    reads,
    receiving,
    role_heads,
    sending,
)
from headlab.circuits.runs import Metric, Run, prepare
from headlab.heads.scoped import intervening
from headlab.layer.gates import Replacement
from headlab.layer.taps import Tap, TapOutput
from headlab.models import HeadedModel, headed
from headlab.models.handle import Inputs

DIRECTIONS = ("denoise", "noise")

__all__ = ["DIRECTIONS", "path_patching"]


def path_patching(model: HeadedModel, clean: Inputs, corrupted: Inputs, metric: Metric, *,
                  receivers: Sequence[Receiver], senders: Sequence[Sender] | None = None,
                  direction: str = "denoise", progress: Callable[[int, int], None] | None = None) -> EdgeScores:
    """Score each sender → receiver path exactly (see the module docstring).

    Args:
        model: a ``HeadedModel`` or an attached model.
        clean, corrupted: inputs of the same shape.
        metric: ``metric(output) -> scalar``; higher means more of the behaviour.
        receivers: ``OUTPUT`` and/or ``(layer, head, role)`` (role "q" of a query head, "k" or "v" of a
            key/value head).
        senders: ``(layer, head)`` heads; None for every head. A pair is scored when the receiver reads what
            the sender writes (``headlab.circuits.graph.reads``: an earlier layer of its stream; in an
            encoder-decoder an encoder head for a cross-attention head's k and v), and a head → output pair when
            the sender writes the stream the output reads (an encoder-decoder's decoder heads).
        direction: "denoise" (the corrupted run receives the clean sender) or "noise" (the clean run
            receives the corrupted sender).
        progress: called as ``progress(done, total)`` after each forward.

    Returns:
        ``EdgeScores`` with method "path patching": score = the metric's change from the base run.

    Raises:
        ValueError: an unknown direction, receiver or sender, no pair to score, or the errors of
            mismatched inputs.
    """
    if direction not in DIRECTIONS:
        raise ValueError(f"direction={direction!r}; expected one of {DIRECTIONS}")
    start = time.perf_counter()
    handle = headed(model)
    n_heads = handle.n_heads
    receivers = [_check_receiver(handle, r) for r in receivers]
    if not receivers:
        raise ValueError("receivers is empty; give OUTPUT or (layer, head, role) receivers")
    senders = [(layer, h) for layer, n in enumerate(n_heads) for h in range(n)] if senders is None else [
        _check_sender(n_heads, s) for s in senders]
    writers = {site.layer for site in output_writers(handle.sites)}
    pairs = [Edge(s, r) for s in senders for r in receivers
             if (sending(s)[0] in writers if r == OUTPUT else reads(handle.sites, sending(s)[0], *_layer_role(r)))]
    if not pairs:
        raise ValueError("no sender is in an earlier layer of the stream a receiver reads (for cross-attention's k "
                         "and v: the encoder's): nothing to patch")
    _, clean_run, corrupted_run = prepare(handle, clean, corrupted, metric, one_stream=False)
    base, source = (corrupted_run, clean_run) if direction == "denoise" else (clean_run, corrupted_run)
    total = len({e.sender for e in pairs}) + sum(e.receiver != OUTPUT for e in pairs)
    done, scores = 0, {}
    with handle.running(grad=False) as net:
        for sender in dict.fromkeys(e.sender for e in pairs):
            wanted = [e.receiver for e in pairs if e.sender == sender]
            metric_a, inputs = _sender_run(handle, net, base, source, sender, wanted, metric)
            done += 1
            for receiver in wanted:
                if receiver == OUTPUT:
                    scores[Edge(sender, receiver)] = metric_a - base.metric
                    continue
                layer, head, role = receiving(receiver)
                with intervening(handle) as sites:
                    sites[layer].input_replacements = {role: Replacement(torch.tensor([head]),
                                                                         inputs[(layer, role)][:, head: head + 1])}
                    scores[Edge(sender, receiver)] = float(metric(net(**base.inputs))) - base.metric
                done += 1
                if progress is not None:
                    progress(done, total)
    return EdgeScores("path patching", pairs, np.asarray([scores[e] for e in pairs]), clean_run.metric,
                      corrupted_run.metric, forwards=2 + total, backwards=0, seconds=time.perf_counter() - start,
                      details={"direction": direction})


def _layer_role(receiver: Receiver) -> tuple[int, str]:
    layer, _, role = receiving(receiver)
    return layer, role


def _sender_run(model: HeadedModel, net: torch.nn.Module, base: Run, source: Run, sender: Sender,
                receivers: list[Receiver], metric: Metric) -> tuple[float, dict[tuple[int, str], Tensor]]:
    """Step 1: the base run with ``sender`` from the source and every other head frozen.

    Returns:
        Its metric, and ``{(layer, role): q (batch, n_heads, pos, d) or k, v (batch, n_kv_heads, pos, d)}``
        of the receivers' layers.
    """
    layer_s, head_s = sending(sender)
    layers = sorted({receiving(r)[0] for r in receivers if r != OUTPUT})
    taken: dict[tuple[int, str], Tensor] = {}
    with intervening(model) as sites:
        for site in sites:
            values = base.z[site.layer].clone()
            if site.layer == layer_s:
                values[:, head_s] = source.z[layer_s][:, head_s]
            site.replacement = Replacement(torch.arange(site.n_heads), values)
            site.tap = _inputs_tap(site.n_heads, site.kv_head_of, taken) if site.layer in layers else None
        value = float(metric(net(**base.inputs)))
    return value, taken


def _inputs_tap(n_heads: int, kv_head_of: tuple[int, ...], taken: dict[tuple[int, str], Tensor]) -> Tap:
    firsts = [kv_head_of.index(g) for g in sorted(set(kv_head_of))]

    def sink(at: int, out: TapOutput) -> None:
        for role in ("q", "k", "v"):
            taken[(at, role)] = getattr(out, role)

    return Tap(sink, q=list(range(n_heads)), k=firsts, v=firsts)


def _check_receiver(model: HeadedModel, receiver: Receiver) -> Receiver:
    if receiver == OUTPUT:
        return OUTPUT
    if (not isinstance(receiver, tuple) or len(receiver) != 3 or receiver[2] not in ("q", "k", "v")
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in receiver[:2])):
        raise ValueError(f"receiver {receiver!r}; expected {OUTPUT!r} or (layer, head, role) with role 'q', 'k' or 'v'")
    layer, head, role = receiver
    if not 0 <= layer < model.n_layers:
        raise ValueError(f"receiver {receiver!r}: layer {layer}; the model has layers 0..{model.n_layers - 1}")
    site = model.sites[layer]
    count = role_heads(site, role)
    if not 0 <= head < count:
        what = "query heads" if role == "q" else "key/value heads"
        raise ValueError(f"receiver {receiver!r}: head {head}; layer {layer} has {count} {what}")
    return receiver


def _check_sender(n_heads: list[int], sender: Sender) -> Sender:
    if sender == INPUT:
        raise ValueError("path patching's senders are heads; the input is not frozen or patched as a head")
    if (not isinstance(sender, tuple) or len(sender) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in sender)
            or not 0 <= sender[0] < len(n_heads) or not 0 <= sender[1] < n_heads[sender[0]]):
        raise ValueError(f"sender {sender!r}; expected (layer, head) of the model ({len(n_heads)} layers, "
                         f"heads {n_heads})")
    return sender
