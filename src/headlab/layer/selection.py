"""Which heads: the one selection type of headlab and its one resolver.

A head selection (``HeadSelection``) is any of:

    None                          every head of every layer
    Heads(layers=…, heads=…)      the heads ``heads`` (None: all) of the layers ``layers`` (None: all),
                                  as the command line's ``--layers`` and ``--heads`` say it
    {layer: [head, …] | None}     per layer (None: every head of that layer)
    [(layer, head), …]            pairs

Layers are the model's attention layers in the order they run (0-based); heads are each
layer's current query heads. Where a model's layers have names (a ``HeadedModel``: its sites'
addresses, ``"blocks.3.attn"``, ``"encoder.blocks.3.attn"``, ``"decoder.blocks.2.cross_attn"``), a
layer may also be given by name: an address, a stack (``"encoder"``: every layer of it), or a
pattern (``"decoder.blocks.*.cross_attn"``). ``resolve(selection, n_heads, names)`` turns any of
them into ``{layer: sorted unique heads}`` against a model with ``n_heads[layer]`` heads per layer.

``indices`` is the one validator of a list of heads (or layers), used by the layer itself and by
``resolve``. The selection lives here, below every room that takes one (the layer, a model's handle,
``headlab.heads``, capture and analysis); ``headlab.heads`` exports it to users.
"""

from __future__ import annotations

import fnmatch
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

    layers: Sequence[int | str] | None = None
    heads: Sequence[int] | None = None


Layer = int | str  # an index, or (a model whose layers have names) an address, a stack or a pattern
HeadSelection = (Heads | Mapping[int, Iterable[int] | None] | Mapping[str, Iterable[int] | None]
                 | Mapping[Layer, Iterable[int] | None] | Iterable[tuple[Layer, int]] | None)


def named_layers(pattern: str, names: Sequence[str]) -> list[int]:
    """The layers ``pattern`` names: the layer of that address, every layer of that stack (or block:
    ``"decoder.blocks.2"``), or the layers whose addresses match it as a shell pattern (``*``, ``?``).

    Args:
        pattern: what was given.
        names: each layer's address, in layer order.

    Returns:
        The layers, in order; empty when it names none.
    """
    return [layer for layer, name in enumerate(names)
            if name == pattern or name.startswith(pattern + ".") or fnmatch.fnmatchcase(name, pattern)]


def layer_indices(name: str, values: object, n_layers: int, names: Sequence[str] | None) -> list[int]:
    """``indices`` of layers, where a layer may also be a name (``named_layers``).

    Raises:
        TypeError / ValueError: as ``indices``; a name that names no layer (the message shows what names
            look like), or a name given where the layers have none.
    """
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, Sequence) or not any(isinstance(v, str) for v in values):
        return indices(name, values, n_layers, what="layer")
    out: list[object] = []
    for value in values:
        if not isinstance(value, str):
            out.append(value)
            continue
        if names is None:
            raise TypeError(f"{name} has {value!r}, but these layers have no names; expected int layer indices")
        found = named_layers(value, names)
        if not found:
            examples = ", ".join(repr(n) for n in dict.fromkeys([names[0], names[-1]]))
            raise ValueError(f"{name} has {value!r}, which names no layer: expected a layer 0..{n_layers - 1}, an "
                             f"address such as {examples}, a stack or a pattern such as 'blocks.*.attn'")
        out.extend(found)
    return indices(name, list(dict.fromkeys(out)), n_layers, what="layer")


def head_label(layer: int, head: int) -> str:
    """A head as text: ``"L3 H7"`` for layer 3, head 7 (never "3.7", which reads as a number)."""
    return f"L{layer} H{head}"


def resolve(selection: HeadSelection, n_heads: Sequence[int], names: Sequence[str] | None = None
            ) -> dict[int, list[int]]:
    """Resolve a head selection against a model's layers.

    Args:
        selection: see the module docstring.
        n_heads: heads of each layer, in layer order.
        names: each layer's address, in layer order, or None (layers given by index only).

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
        layers = range(n_layers) if selection.layers is None else layer_indices("layers", selection.layers,
                                                                                 n_layers, names)
        chosen: dict[int, Iterable[int] | None] = dict.fromkeys(layers, selection.heads)
    elif isinstance(selection, Mapping):
        if not selection:
            raise ValueError("the head selection is empty: it selects no layer")
        chosen = {}
        for key, heads in selection.items():  # a name may stand for several layers
            chosen.update(dict.fromkeys(layer_indices("the selection", [key], n_layers, names), heads))
    elif isinstance(selection, (str, bytes)) or not isinstance(selection, Iterable):
        raise TypeError(f"a head selection is None, Heads(layers, heads), {{layer: [heads]}} or (layer, head) "
                        f"pairs; got {selection!r}")
    else:
        chosen = {}
        for pair in selection:
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(f"a head selection of pairs holds (layer, head) pairs; got the item {pair!r}")
            for layer in layer_indices("the selection", [pair[0]], n_layers, names):
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
