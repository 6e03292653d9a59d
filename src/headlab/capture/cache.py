"""``run_with_cache``: run a model once and keep what its heads did, under stable names.

    cache = run_with_cache(loaded, "The cat sat on the mat.", take=("pattern", "z"), heads={2: [3]})
    cache["pattern", 2, 3]            # (batch, query_pos, key_pos): layer 2, head 3
    cache["blocks.2.attn.z"]          # (batch, head, query_pos, d_head_v), if every head of layer 2 was kept

Names follow TransformerLens: ``{address}.{name}`` with the layer's address (``AttentionSite.address``:
``blocks.{layer}.attn`` in a model of one stack; ``encoder.blocks.3.attn``, ``decoder.blocks.2.cross_attn`` in
an encoder-decoder; ``blocks.{layer}.attn`` by the layer's index works in every model) and ``name`` one of ``TAKE``:
``pattern``, ``z``, ``result``, ``q``, ``k``, ``v`` (``headlab.layer.taps`` gives their shapes). Only
the heads selected are computed and kept; the fused kernel serves the rest of the model.

Axis legend: pattern ``(batch, head, query_pos, key_pos)``; z ``(batch, head, query_pos,
d_head_v)``; result ``(batch, head, query_pos, d_model)``; q ``(batch, head, query_pos, d_head)``;
k, v ``(batch, head, key_pos, d_head | d_head_v)``. ``head`` runs over a layer's kept heads. The names
follow TransformerLens', the layout does not: its z, result, q, k and v are ``(batch, pos, head, d)``;
``tensor.transpose(1, 2)`` gives that.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from headlab import display
from headlab.capture.taps import renamed_take, tapped
from headlab.layer.selection import HeadSelection
from headlab.models import HeadedModel, TapOutput
from headlab.models.handle import Inputs, given_tokenizer

_NAME = re.compile(r"^blocks\.(\d+)\.attn\.(\w+)$")
_AXES = {"pattern": "(batch, head, query_pos, key_pos)", "z": "(batch, head, query_pos, d_head_v)",
         "result": "(batch, head, query_pos, d_model)", "q": "(batch, head, query_pos, d_head)",
         "k": "(batch, head, key_pos, d_head)", "v": "(batch, head, key_pos, d_head_v)"}
_AXES_ORDER = {name: i for i, name in enumerate(_AXES)}


@dataclass
class Cache:
    """What one forward kept: per layer and name, the kept heads' tensors.

    Attributes:
        output: the model's output.
        inputs: the keyword arguments the model ran on (``input_ids``, ``attention_mask``, …).
        n_heads: the model's heads per layer.
        names: each layer's address (``AttentionSite.address``), or None.
        tokens: per item, its tokens as strings (padding left out), when a tokenizer was at hand.
        store: ``{(name, layer): (heads, tensor)}``, heads in the order of the tensor's axis 1.
    """

    output: Any
    inputs: dict[str, Tensor]
    n_heads: list[int]
    names: list[str] | None = None
    tokens: list[list[str]] | None = None
    store: dict[tuple[str, int], tuple[tuple[int, ...], Tensor]] = field(default_factory=dict)

    def __getitem__(self, key: str | tuple[Any, ...]) -> Tensor:
        """``cache[name, layer]``, ``cache[name, layer, head]``, ``cache["{address}.{name}"]`` or
        ``cache["blocks.{layer}.attn.{name}"]``.

        Raises:
            KeyError: the name, layer or head was not kept; the message says what was.
        """
        name, layer, head = self._parse(key)
        heads, tensor = self._entry(name, layer)
        if head is not None:
            if head not in heads:
                raise KeyError(f"head {head} of layer {layer} was not kept for {name!r}; kept heads: {list(heads)}")
            return tensor[:, heads.index(head)]
        if len(heads) != self.n_heads[layer]:
            raise KeyError(f"only heads {list(heads)} of layer {layer}'s {self.n_heads[layer]} were kept for "
                           f"{name!r}: ask for one with cache[{name!r}, {layer}, head] (cache.keys() lists what can "
                           "be read)")
        return tensor

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]  # any object may be asked about: a wrong key raises, caught below
        except (KeyError, TypeError):
            return False
        return True

    def __iter__(self) -> Iterator[str | tuple[str, int, int]]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def keys(self) -> list[str | tuple[str, int, int]]:
        """What can be read, layer by layer: the dotted name of a layer whose every head was kept, and ``(name,
        layer, head)`` for each kept head of a layer kept in part (its dotted name would raise)."""
        out: list[str | tuple[str, int, int]] = []
        for name, layer in sorted(self.store, key=lambda k: (k[1], k[0])):
            heads = self.store[(name, layer)][0]
            if len(heads) == self.n_heads[layer]:
                out.append(f"{self._address(layer)}.{name}")
            else:
                out += [(name, layer, head) for head in heads]
        return out

    def _address(self, layer: int) -> str:
        return f"blocks.{layer}.attn" if self.names is None else self.names[layer]

    def heads(self, name: str, layer: int) -> list[int]:
        """The heads of ``layer`` kept for ``name``, in the order of the tensor's head axis."""
        return list(self._entry(name, layer)[0])

    def _entry(self, name: str, layer: int) -> tuple[tuple[int, ...], Tensor]:
        try:
            return self.store[(name, layer)]
        except KeyError:
            kept = sorted({n for n, _ in self.store})
            layers = sorted({lay for n, lay in self.store if n == name})
            raise KeyError(f"{name!r} of layer {layer} was not kept; this cache holds {kept}"
                           + (f", {name!r} for layers {layers}" if layers else "")) from None

    def _parse(self, key: str | tuple[Any, ...]) -> tuple[str, int, int | None]:
        if isinstance(key, str):
            address, _, name = key.rpartition(".")
            if self.names is not None and address in self.names:
                return name, self.names.index(address), None
            match = _NAME.match(key)
            if match is None:
                example = self._address(0)
                raise KeyError(f"{key!r} is not a cache name; expected '{example}.<name>' (a layer's address), "
                               "'blocks.<layer>.attn.<name>' or cache[name, layer(, head)] (TransformerLens' names; "
                               "the layout is (batch, head, pos, …), not its (batch, pos, head, …))")
            return match.group(2), int(match.group(1)), None
        if isinstance(key, tuple) and len(key) in (2, 3) and isinstance(key[0], str):
            return key[0], int(key[1]), (int(key[2]) if len(key) == 3 else None)
        raise KeyError(f"{key!r}: expected cache[name, layer], cache[name, layer, head] or a dotted name")

    def __repr__(self) -> str:
        groups = [(name, f"{layers} × {heads}: {shape}") for name, layers, heads, shape in self._groups()]
        return display.summary(self._title(), [*self._facts(), *groups])

    def _repr_html_(self) -> str:
        rows = [[name, layers, heads, shape, _AXES.get(name, "")] for name, layers, heads, shape in self._groups()]
        kept = display.table(["kept", "layers", "heads", "shape (each layer)", "axes"], rows, labels=1)
        return display.card(self._title(), self._facts(), kept)

    def _title(self) -> str:
        n = len(self.store)
        return f"Cache of one {type(self.output).__name__} forward: {n} tensor{'s' if n != 1 else ''} kept"

    def _facts(self) -> list[tuple[str, object]]:
        facts: list[tuple[str, object]] = [
            ("inputs", ", ".join(f"{key} {display.shape(value)}" for key, value in self.inputs.items()))]
        if self.tokens:
            others = len(self.tokens) - 1
            more = f"; {others} more item{'s' if others > 1 else ''}" if others else ""
            facts.append(("tokens[0]", f"{display.abbreviate(self.tokens[0])} ({len(self.tokens[0])} tokens{more})"))
        return facts

    def _groups(self) -> list[tuple[str, str, str, str]]:
        """``(name, layers, heads, shape)`` per run of layers keeping the same heads in tensors of one shape."""
        out: list[tuple[str, str, str, str]] = []
        for name in sorted({n for n, _ in self.store}, key=lambda n: (_AXES_ORDER.get(n, len(_AXES_ORDER)), n)):
            runs: dict[tuple[str, str], list[int]] = {}
            for (kept, layer), (heads, tensor) in sorted(self.store.items(), key=lambda kv: kv[0][1]):
                if kept == name:
                    every = len(heads) == self.n_heads[layer] and list(heads) == list(range(len(heads)))
                    listed = f"head{'s' if len(heads) != 1 else ''} {', '.join(map(str, heads))}"
                    heads_text = "every head" if every else listed
                    runs.setdefault((heads_text, display.shape(tensor)), []).append(layer)
            for (heads_text, shape), layers in runs.items():
                out.append((name, f"layer{'s' if len(layers) > 1 else ''} {display.runs(layers)}", heads_text, shape))
        return out


def run_with_cache(
    model: HeadedModel | nn.Module,
    inputs: Inputs,
    *,
    take: str | Sequence[str] = ("pattern",),
    heads: HeadSelection = None,
    grad: bool = False,
    names: str | Sequence[str] | None = None,
    tokenizer: Any = None,
) -> Cache:
    """Run ``model`` once on ``inputs`` and keep what ``take`` names of the selected heads.

    Args:
        model: a ``HeadedModel`` (``headlab.load`` / ``headlab.attach``) or an attached model.
        inputs: a text or texts (tokenized with padding), the keyword arguments of a forward,
            or a tensor (``HeadedModel.inputs``).
        take: any of ``TAKE``: "pattern", "z", "result", "q", "k", "v".
        heads: the heads to keep (``headlab.heads.selection``); None for every head.
        grad: run with autograd (the kept tensors then carry gradients); default: no_grad.
        names: deprecated name of ``take``.
        tokenizer: deprecated: the handle holds the tokenizer (``headlab.attach(model, tokenizer=...)``).

    Returns:
        The ``Cache``; the model's own output is ``cache.output``.

    Raises:
        ValueError / TypeError: bad names, selection or inputs; a text input without a tokenizer.
    """
    take = renamed_take(take, names, "names", "run_with_cache")
    handle = given_tokenizer(model, tokenizer, "run_with_cache")
    sites = handle.sites
    kwargs = handle.inputs(inputs)
    selection = handle.heads(heads, inputs=kwargs)
    cache = Cache(output=None, inputs=kwargs, n_heads=[site.n_heads for site in sites],
                  names=[site.address for site in sites], tokens=handle.tokens(kwargs))

    def sink(layer: int, out: TapOutput) -> None:
        for name in take:
            cache.store[(name, layer)] = (tuple(selection[layer]), getattr(out, name))

    with tapped(sites, selection, take, sink), handle.running(grad=grad) as net:
        cache.output = net(**kwargs)
    missing = sorted(set(selection) - {layer for _, layer in cache.store})
    if missing:
        raise RuntimeError(f"layers {missing} did not run headlab's attention in this forward")
    return cache
