"""Which heads: the one selection type of headlab and its one resolver.

A head selection (``HeadSelection``) is any of:

    None                          every head of every layer
    Heads(layers=…, heads=…)      the heads ``heads`` (None: all) of the layers ``layers`` (None: all),
                                  as the command line's ``--layers`` and ``--heads`` say it
    {layer: [head, …] | None}     per layer (None: every head of that layer)
    [(layer, head), …]            pairs

Layers are the model's attention layers in the order they run (0-based); heads are each
layer's current query heads. ``resolve(selection, n_heads)`` turns any of them into
``{layer: sorted unique heads}`` against a model with ``n_heads[layer]`` heads per layer.

``indices`` is the one validator of a list of heads (or layers), used by the layer itself and by
``resolve``. The selection lives here, below every room that takes one (the layer, a model's handle,
``headlab.heads``, capture and analysis); ``headlab.heads`` exports it to users.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from torch import Tensor


def indices(name: str, values: object, size: int, *, what: str = "head") -> list[int]:
    """Validate a sequence of indices in ``[0, size)``; their order is kept.

    Args:
        name: what the values are called in messages, e.g. ``"return_pattern"``.
        values: a sequence of ints (numpy ints and 0-d integer tensors too), a 1-d integer
            tensor or a numpy array.
        size: how many there are to index.
        what: the kind of index, for messages ("head", "layer").

    Returns:
        The indices as Python ints.

    Raises:
        TypeError: not a sequence of integers.
        ValueError: empty, or an index out of range.
    """
    if isinstance(values, Tensor) or type(values).__module__ == "numpy":
        values = cast(Any, values).tolist()  # a tensor, a numpy array or a numpy scalar
        values = values if isinstance(values, list) else [values]
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of {what} indices, got {values!r}")
    if len(values) == 0:
        raise ValueError(f"{name} is empty: it selects no {what}")
    out = []
    for v in values:
        try:
            index = None if isinstance(v, bool) else operator.index(v)
        except TypeError:
            index = None
        if index is None:
            raise TypeError(f"{name} has {v!r}; expected int {what} indices")
        if not 0 <= index < size:
            raise ValueError(f"{name} has {what} {index}, which does not exist: expected {what}s 0..{size - 1}")
        out.append(index)
    return out


@dataclass(frozen=True)
class Heads:
    """The heads ``heads`` of the layers ``layers``; None for all of them.

    Attributes:
        layers: layer indices, or None for every layer.
        heads: head indices taken in every selected layer, or None for every head.
    """

    layers: Sequence[int] | None = None
    heads: Sequence[int] | None = None


HeadSelection = Heads | Mapping[int, Iterable[int] | None] | Iterable[tuple[int, int]] | None


def head_label(layer: int, head: int) -> str:
    """A head as text: ``"L3 H7"`` for layer 3, head 7 (never "3.7", which reads as a number)."""
    return f"L{layer} H{head}"


def resolve(selection: HeadSelection, n_heads: Sequence[int]) -> dict[int, list[int]]:
    """Resolve a head selection against a model's layers.

    Args:
        selection: see the module docstring.
        n_heads: heads of each layer, in layer order.

    Returns:
        ``{layer: sorted unique heads}``, layers in increasing order, none empty.

    Raises:
        TypeError: a selection of another form, or an index that is not an int.
        ValueError: a layer or head that does not exist, or an empty selection.
    """
    n_layers = len(n_heads)
    if selection is None:
        selection = Heads()
    if isinstance(selection, Heads):
        layers = range(n_layers) if selection.layers is None else indices("layers", selection.layers, n_layers,
                                                                           what="layer")
        chosen: dict[int, Iterable[int] | None] = dict.fromkeys(layers, selection.heads)
    elif isinstance(selection, Mapping):
        if not selection:
            raise ValueError("the head selection is empty: it selects no layer")
        keys = indices("the selection", list(selection), n_layers, what="layer")
        chosen = {layer: selection[key] for layer, key in zip(keys, selection)}
    elif isinstance(selection, (str, bytes)) or not isinstance(selection, Iterable):
        raise TypeError(f"a head selection is None, Heads(layers, heads), {{layer: [heads]}} or (layer, head) "
                        f"pairs; got {selection!r}")
    else:
        chosen = {}
        for pair in selection:
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(f"a head selection of pairs holds (layer, head) pairs; got the item {pair!r}")
            layer = indices("the selection", [pair[0]], n_layers, what="layer")[0]
            heads = chosen.setdefault(layer, [])
            assert isinstance(heads, list)
            heads.append(pair[1])
    out = {}
    for layer in sorted(chosen):
        heads = chosen[layer]
        if heads is not None and not isinstance(heads, Sequence) and type(heads).__module__ not in ("torch", "numpy"):
            heads = list(heads)  # a set or a generator
        out[layer] = list(range(n_heads[layer])) if heads is None else sorted(set(
            indices(f"the heads of layer {layer}", heads, n_heads[layer])))
    if not out:
        raise ValueError("the head selection is empty: it selects no layer")
    return out
