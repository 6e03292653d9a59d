"""The viewer's data from a ``run_with_cache`` cache: the patterns it kept, shown without running anything.

Axis legend:
    pattern   (batch, head, query_pos, key_pos)   one layer's kept heads, as the cache holds them
    stack     (head, pos, pos)                    the shown heads of one item, padding left out

A cache holds tensors and token strings, not the text, its character offsets or the tokenizer, so this
view has the word-piece level only (labels are the tokens, a space between them), marks no special
token and measures no statistic or role (``view_data`` does, from the text). Rollout and flow are
computed as ``view_data`` computes them, for the layers whose every head the cache kept from layer 0 on.
"""

from __future__ import annotations

import torch
from torch import Tensor

from headlab.analysis.flow import FLOW_MAX_LENGTH, attention_flow, rollout
from headlab.capture.cache import Cache
from headlab.heads.selection import HeadSelection, resolve
from headlab.report.viewer.encoding import quantize, thumbnails
from headlab.report.viewer.payload import HeadInfo, Level, ViewerData, ViewerItem

__all__ = ["cache_view_data"]


def cache_view_data(cache: Cache, *, heads: HeadSelection = None, flow_max_length: int = FLOW_MAX_LENGTH,
                    name: str = "cache") -> ViewerData:
    """Encode the patterns a cache kept for the viewer, one viewed text per item of its batch.

    Args:
        cache: what ``run_with_cache`` returned with ``"pattern"`` among what it kept.
        heads: the kept heads to show (``headlab.heads.selection``); None for every kept head.
        flow_max_length: compute attention flow for items of at most this many tokens; 0 for none.
        name: the model's name in the viewer's header.

    Returns:
        The viewer's data (no statistics, roles or pattern classes; see the module docstring).

    Raises:
        ValueError: the cache kept no pattern, a selected head's pattern was not kept, a bad
            ``flow_max_length``, or a forward without token ids (an image or audio model's) or with a target
            of another length than its source.
    """
    if isinstance(flow_max_length, bool) or not isinstance(flow_max_length, int) or flow_max_length < 0:
        raise ValueError(f"flow_max_length={flow_max_length!r}; expected an int >= 0 (tokens; 0: no flow)")
    ids, target = cache.inputs.get("input_ids"), cache.inputs.get("decoder_input_ids")
    if not isinstance(ids, torch.Tensor) or (isinstance(target, torch.Tensor) and target.shape != ids.shape):
        what = "token ids" if not isinstance(ids, torch.Tensor) else "a target as long as its source"
        raise ValueError(f"this cache's forward had no {what}, and the viewer of a cache shows one token sequence "
                         "per item: view images, audio and source/target pairs with view_data(model, inputs) "
                         "(headlab view)")
    kept = {layer: list(hs) for (what, layer), (hs, _) in cache.store.items() if what == "pattern"}
    if not kept:
        raise ValueError("this cache kept no pattern: run run_with_cache with 'pattern' among what it takes")
    if heads is None:
        shown = sorted((layer, h) for layer, hs in kept.items() for h in hs)
    else:
        shown = [(layer, h) for layer, hs in resolve(heads, cache.n_heads, cache.names).items() for h in hs]
        missing = [(layer, h) for layer, h in shown if h not in kept.get(layer, ())]
        if missing:
            raise ValueError(f"the cache kept no pattern of heads {missing}; it kept {kept}")
    # rollout and flow average every head of a layer: the layers from 0 on whose every head was kept
    whole = 0
    while whole in kept and len(kept[whole]) == cache.n_heads[whole]:
        whole += 1
    real = cache.inputs.get("attention_mask", torch.ones_like(ids)).bool().cpu()
    items, causal = [], True
    for row in range(ids.shape[0]):
        positions = real[row].nonzero().flatten()
        tokens = cache.tokens[row] if cache.tokens else [str(int(t)) for t in ids[row, positions].tolist()]
        stack = torch.stack([_item(cache, layer, h, row, positions) for layer, h in shown]).float()
        causal = causal and not bool((stack.triu(1) > 0).any())  # a cache does not say what the model is
        means = [_layer_mean(cache, layer, row, positions) for layer in range(whole)]
        n = len(positions)
        flow = [quantize(p) for p in attention_flow(means, max_length=flow_max_length)] \
            if means and n <= flow_max_length else None
        size, thumbs = thumbnails(stack)
        level = Level(name="pieces", labels=list(tokens), gaps=[""] + [" "] * (n - 1), tail="", special=[False] * n,
                      pieces=[1] * n, patterns=[quantize(p) for p in stack], thumb_size=size, thumbs=thumbs,
                      rollout=[quantize(p) for p in rollout(means)] if means else [], flow=flow)
        items.append(ViewerItem(text=" ".join(tokens), full_length=n, truncated=False, pieces=level, words=None))
    notes = [] if whole else ["Rollout and flow need every head of the layers from 0 on; this cache kept fewer."]
    return ViewerData(name=name, source="run_with_cache", architecture=type(cache.output).__name__,
                      causal=causal, n_heads=list(cache.n_heads), heads=shown,
                      info=[HeadInfo(layer=layer, head=h, roles=(), pattern_class="", stats={}) for layer, h in shown],
                      items=items, notes=notes, flow_max_length=flow_max_length)


def _item(cache: Cache, layer: int, head: int, row: int, positions: Tensor) -> Tensor:
    """One head's ``(pos, pos)`` pattern of one item, padding left out."""
    heads, pattern = cache.store[("pattern", layer)]
    return pattern[row, heads.index(head)].detach()[positions][:, positions].cpu()


def _layer_mean(cache: Cache, layer: int, row: int, positions: Tensor) -> Tensor:
    """Every head of ``layer`` on one item as ``(1, pos, pos)``: what rollout and flow read."""
    pattern = cache.store[("pattern", layer)][1][row].detach()[:, positions][:, :, positions]
    return pattern.float().mean(0, keepdim=True).cpu()
