"""The seat of a headlab layer inside a Hugging Face model.

A family adapter (``hf_bert``, ``hf_gpt2``, ``hf_llama``) replaces each of the model's attention
modules with a subclass of ``SwappedAttention``: the subclass speaks the Hugging Face module's
calling convention and does what surrounds attention in that family (e.g. BERT's residual
LayerNorm); this base class owns the headlab layer, translates Hugging Face's masks and cache,
and hands what a ``Tap`` asks for to its sink.

Axis legend: hidden states ``(batch, pos, d_model)``; Hugging Face 4-D masks
``(batch, 1, query_pos, key_pos)``, bool with True = attend, or float added to the scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headlab.layer import AttentionOutput, MultiHeadAttention


@dataclass
class Tap:
    """What to take out of one layer's forward, and where to send it.

    Attributes:
        patterns: query heads whose patterns to return, or None.
        head_outputs: query heads whose contributions to the output to return, or None.
        z: query heads whose z to return, or None.
        sink: called as ``sink(layer_index, output)`` after each forward of the layer.
    """

    sink: Callable[[int, AttentionOutput], None]
    patterns: list[int] | None = None
    head_outputs: list[int] | None = None
    z: list[int] | None = None


class HFCache:
    """A Hugging Face ``Cache`` seen through headlab's kv-cache interface, for one layer and one call.

    ``length`` is the number of cached keys the next ``update`` returns besides the new ones.
    That is not always the positions seen: a sliding-window layer keeps only the last
    ``window - 1`` and a static cache returns its whole buffer; ``get_mask_sizes`` gives the
    span Hugging Face also built its mask for, so mask and keys line up.

    Args:
        cache: a Hugging Face cache (of an encoder-decoder model: its self-attention part is used).
        layer_index: the layer's index in the cache.
        query_len: positions in this call.
    """

    def __init__(self, cache: object, layer_index: int, query_len: int) -> None:
        self.cache = getattr(cache, "self_attention_cache", cache)
        self.layer_index, self.query_len = layer_index, query_len

    @property
    def length(self) -> int:
        mask_sizes = getattr(self.cache, "get_mask_sizes", None)
        if mask_sizes is None:
            return int(self.cache.get_seq_length(self.layer_index))
        kv_length, _ = mask_sizes(self.query_len, self.layer_index)
        return int(kv_length) - self.query_len

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return self.cache.update(k, v, self.layer_index)


class SwappedAttention(nn.Module):
    """Base of the modules that take a Hugging Face attention module's place.

    Args:
        attn: the headlab layer carrying the original module's weights.
        layer_index: the transformer block this attention belongs to (0-based).
    """

    def __init__(self, attn: MultiHeadAttention, layer_index: int) -> None:
        super().__init__()
        self.attn = attn
        self.layer_index = layer_index
        self.head_ids = list(range(attn.config.n_heads))  # original index of each head (pruning drops some)
        self.tap: Tap | None = None
        # A per-call gate on the heads, (n_heads,) or (batch, n_heads), passed to the layer's head_mask:
        # differentiable, for importance scores (Michel et al. 2019); None when unused.
        self.head_mask: Tensor | None = None

    def attend(
        self,
        hidden_states: Tensor,
        *,
        attention_mask: Tensor | None = None,
        past_key_values: object | None = None,
        rotary_cos_sin: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """Run the headlab layer in Hugging Face's terms; feed the tap, if any.

        Args:
            hidden_states: ``(batch, pos, d_model)``.
            attention_mask: Hugging Face's prepared 4-D mask (bool True = attend, or additive
                float), or None. Causal masking comes from the layer's config either way.
                Anything else (the 2-D masks of flash attention, say) is refused.
            past_key_values: a Hugging Face ``Cache``, or None.
            rotary_cos_sin: Hugging Face's ``position_embeddings`` for rotary layers.

        Returns:
            The layer's output ``(batch, pos, d_model)``.
        """
        if attention_mask is not None and not (isinstance(attention_mask, Tensor) and attention_mask.dim() == 4):
            shape = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise ValueError(
                f"layer {self.layer_index}: expected a 4-D attention mask (batch, 1, query_pos, key_pos) or None, "
                f"got {shape}; headlab layers run under attn_implementation 'eager' or 'sdpa'"
            )
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            attention_mask = ~attention_mask  # Hugging Face: True = attend; headlab: True = not allowed
        cache = None if past_key_values is None else HFCache(past_key_values, self.layer_index, hidden_states.shape[1])
        tap = self.tap
        if tap is None:
            return self.attn(hidden_states, attn_mask=attention_mask, kv_cache=cache, rotary_cos_sin=rotary_cos_sin,
                             head_mask=self.head_mask)
        out = self.attn(
            hidden_states, attn_mask=attention_mask, kv_cache=cache, rotary_cos_sin=rotary_cos_sin,
            head_mask=self.head_mask,
            return_patterns=tap.patterns or False, return_head_outputs=tap.head_outputs or False,
            return_z=tap.z or False,
        )
        tap.sink(self.layer_index, out)
        return out.output
