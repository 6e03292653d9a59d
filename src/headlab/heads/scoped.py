"""Interventions for the length of a ``with`` block: the model is put back on exit, on error too.

    with heads.masked(loaded, {2: [3]}):            # zero-ablate layer 2, head 3
        cache = headlab.run_with_cache(loaded, text)
    with heads.patched(loaded, {2: [3]}, clean):     # head 3's z taken from another run's cache
        output = loaded(**corrupted)
    with heads.windowed(loaded, {2: [3]}, window=64, sinks=4):   # head 3 as a streaming head
        output = loaded(**inputs)

``intervening(model)`` is the scope itself: it records every site's gates (the persistent
affine and the per-call gate, replacement and delta of ``headlab.layer.gates``, the
replacements and deltas of the heads' inputs, and the key windows of ``windowed``) and its tap,
and sets them back exactly when the block ends. The persistent forms (``headlab.heads.mask`` …) are for saving.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from headlab.heads.interventions import mask, mean_ablate, scale
from headlab.heads.selection import HeadSelection
from headlab.layer.gates import Replacement
from headlab.models import AttentionSite, HeadedModel, headed
from headlab.models.site import HeadWindow

Model = HeadedModel | nn.Module  # a handle, or an attached model (headlab.attach)

# what intervening records and sets back: the gates, and the tap a block may set beside them
_GATES = ("scale", "shift", "head_mask", "replacement", "delta", "windows", "input_replacements", "input_deltas",
          "tap")


@contextmanager
def intervening(model: Model) -> Iterator[list[AttentionSite]]:
    """Every site's gates and tap as they are now, set back when the block ends (also on error).

    Yields:
        The model's sites, to change inside the block.
    """
    sites = headed(model).sites
    # the per-call input gates are dicts filled in place: kept as copies
    saved = [{name: _copy(getattr(site, name)) for name in _GATES} for site in sites]
    try:
        yield sites
    finally:
        for site, gates in zip(sites, saved):
            for name, value in gates.items():
                setattr(site, name, value)


def _copy(gate: Any) -> Any:
    return dict(gate) if isinstance(gate, dict) else gate


@contextmanager
def masked(model: Model, heads: HeadSelection) -> Iterator[None]:
    """Zero-ablate ``heads`` inside the block (``headlab.heads.mask``)."""
    with intervening(model):
        mask(model, heads)
        yield


@contextmanager
def scaled(model: Model, heads: HeadSelection, factor: float) -> Iterator[None]:
    """Multiply ``heads``' z by ``factor`` inside the block (``headlab.heads.scale``)."""
    with intervening(model):
        scale(model, heads, factor)
        yield


@contextmanager
def mean_ablated(model: Model, heads: HeadSelection, means: Mapping[int, Tensor]) -> Iterator[None]:
    """Replace ``heads``' z by their corpus means inside the block (``headlab.heads.mean_ablate``)."""
    with intervening(model):
        mean_ablate(model, heads, means)
        yield


@contextmanager
def patched(model: Model, heads: HeadSelection, source: Any) -> Iterator[None]:
    """Give ``heads`` the z they had in another run, inside the block (activation patching).

    Args:
        model: a ``HeadedModel`` or an attached model.
        heads: the heads to patch.
        source: a ``headlab.capture.Cache`` holding z of those heads (same batch and length as
            the inputs the block runs), or ``{layer: z (batch, n_heads, query_pos, d_head_v)}``.

    Raises:
        KeyError: the source lacks z of a selected head.
        ValueError: a selection error; the shapes are checked when the model runs.
    """
    handle = headed(model)
    with intervening(handle) as sites:
        for layer, hs in handle.heads(heads).items():
            index = torch.tensor(hs)
            if isinstance(source, Mapping):
                if layer not in source:
                    raise KeyError(f"the source has no z for layer {layer}; it has layers {sorted(source)}")
                values = source[layer].index_select(1, index.to(source[layer].device))
            else:
                values = torch.stack([source["z", layer, h] for h in hs], dim=1)
            sites[layer].replacement = Replacement(index, values.detach())
        yield


@contextmanager
def windowed(model: Model, heads: HeadSelection, *, window: int, sinks: int = 4) -> Iterator[None]:
    """Run ``heads`` as streaming heads inside the block: each sees only the first ``sinks`` keys
    and a window of ``window`` keys (StreamingLLM, Xiao et al. 2023; DuoAttention, Xiao et al. 2024).

    The attention function itself computes those heads under the sink + window mask
    (``headlab.layer.masks.sink_window_blocked``), on whichever path runs: it is the model with
    such heads, not an approximation. Causal models keep key j for the query at position p when
    ``j < sinks`` or ``0 <= p − j < window`` (a cache of ``sinks + window`` entries); bidirectional
    ones when ``j < sinks`` or ``|p − j| <= window`` (a Longformer-style window: attention memory,
    not a key/value cache). Positions count from the first input token, padding included: pad on
    the right. Nested blocks compose: a head in two windows keeps the keys both keep.

    Args:
        model: a ``HeadedModel`` or an attached model.
        heads: the heads to restrict (``headlab.heads.selection``).
        window: recent keys kept (causal) or largest distance kept (bidirectional), ``>= 1``.
        sinks: first keys every query keeps, ``>= 0``.

    Raises:
        ValueError: a window or sink count out of range, or a selection error.
        TypeError: a window or sink count that is not an int.
    """
    for name, value, least in (("window", window, 1), ("sinks", sinks, 0)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}={value!r}: expected an int >= {least}")
        if value < least:
            raise ValueError(f"{name}={value!r}: expected an int >= {least}")
    handle = headed(model)
    with intervening(handle) as sites:
        for layer, hs in handle.heads(heads).items():
            sites[layer].windows = (*sites[layer].windows, HeadWindow(tuple(hs), window, sinks))
        yield
