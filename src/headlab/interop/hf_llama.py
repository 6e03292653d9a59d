"""LLaMA-family adapter: ``LlamaAttention``, ``MistralAttention``, ``Qwen2Attention`` ⇄ headlab layers.

Axis legend: hidden states ``(batch, pos, d_model)``; masks ``(batch, 1, query_pos, key_pos)``;
rotary ``(cos, sin)`` each ``(batch, pos, d_head)``.

The four Linear projections copy into a wide headlab layer: grouped-query through
``n_kv_heads`` (``num_key_value_heads``), ``d_head`` from the module's ``head_dim`` (which may
differ from ``hidden_size / num_attention_heads``), causal, rotary over the whole head
(``rotary_dim = d_head``, half-split layout as in ``apply_rotary_pos_emb``). The rotary angles
are the model's own: the ``position_embeddings`` Hugging Face hands the module go to the
layer as ``rotary_cos_sin``, so scaled RoPE variants (linear, dynamic, llama3, ...) and
per-example positions carry over unchanged.

Biases: headlab's ``bias`` is all or nothing. LLaMA/Mistral have all four biases or none
(``attention_bias``); Qwen2 has q/k/v biases and no o_proj bias. A missing bias becomes a
zero slice of the layer's bias (outputs are unchanged exactly), and export refuses a layer
whose such slice is no longer zero.

Sliding window (Mistral, Qwen2's sliding layers): Hugging Face puts the window into the mask
it hands the module whenever the window cuts anything (it drops the mask only when every
key is within the window), and its sliding caches keep the last ``window - 1`` positions;
the adapter reads the keys' span from the cache (``HFCache.length``) so both line up. Should
a caller hand no mask although the window cuts, the adapter builds the window mask itself.

The mask that reaches the module: eager builds a float additive mask (finite minimum where
masked) on every call; sdpa passes None when nothing but causality masks, else a bool mask
(True = attend) — always a mask on a sliding layer whose window cuts.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaAttention
from transformers.models.mistral.modeling_mistral import MistralAttention
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

from headlab.interop._hf_common import (
    HFWeights,
    check_exportable,
    default_scale,
    install,
    layer_weights,
    swap_modules,
    swapped_of,
)
from headlab.interop.hf_attention import HFCache, SwappedAttention
from headlab.layer import AttentionConfig, MultiHeadAttention

ATTENTION_CLASSES: tuple[type[nn.Module], ...] = (LlamaAttention, MistralAttention, Qwen2Attention)


class LlamaFamilyAttention(SwappedAttention):
    """Takes the place of a ``LlamaAttention`` (or Mistral / Qwen2) module.

    Args:
        attn: the headlab layer with the module's q/k/v/o weights.
        layer_index: the decoder layer's index (the model's cache is indexed by it).
        original: the Hugging Face module.
    """

    def __init__(self, attn: MultiHeadAttention, layer_index: int, *, original: nn.Module) -> None:
        super().__init__(attn, layer_index)
        self.sliding_window = _sliding_window(original)
        # What export needs to rebuild the original module (plain attributes, not submodules).
        self.hf_class = type(original)
        self.hf_config = original.config
        self.hf_absent_biases = _hf_weights(original).absent_biases

    def forward(
        self,
        hidden_states: Tensor,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        attention_mask: Tensor | None = None,
        past_key_values: object | None = None,
        **kwargs: object,
    ) -> tuple[Tensor, None]:
        """``LlamaAttention.forward``'s contract: ``(attn(x), None)``."""
        q_len = hidden_states.shape[1]
        mask = attention_mask
        if mask is None and self.sliding_window is not None:
            cached = 0 if past_key_values is None else HFCache(past_key_values, self.layer_index, q_len).length
            mask = self._window_mask(q_len, cached, hidden_states.device)
        out = self.attend(hidden_states, attention_mask=mask, past_key_values=past_key_values,
                          rotary_cos_sin=position_embeddings)
        return out, None

    def _window_mask(self, q_len: int, cached: int, device: torch.device) -> Tensor | None:
        """Bool ``(1, 1, query_pos, key_pos)``, True = attend: the last ``sliding_window`` keys; None if all fit."""
        k_len = q_len + cached
        if k_len <= self.sliding_window:
            return None
        q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # keys end with the queries
        k_pos = torch.arange(k_len, device=device)[None, :]
        return ((k_pos > q_pos - self.sliding_window) & (k_pos <= q_pos))[None, None]


def _sliding_window(original: nn.Module) -> int | None:
    if hasattr(original, "sliding_window"):  # Qwen2: set per layer from config.layer_types
        window = original.sliding_window
    else:  # Mistral: every layer, from the config
        window = getattr(original.config, "sliding_window", None)
    return None if window is None else int(window)


def _rope_theta(config: object) -> float:
    parameters = getattr(config, "rope_parameters", None) or {}
    theta = parameters.get("rope_theta") if isinstance(parameters, dict) else None
    theta = theta if theta is not None else getattr(config, "rope_theta", None)
    return float(theta) if theta is not None else 10000.0


def attention_config(original: nn.Module) -> AttentionConfig:
    """The headlab config of one LLaMA-family attention module."""
    d_head = int(original.head_dim)
    biases = [getattr(original, name).bias is not None for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
    return AttentionConfig(
        d_model=original.q_proj.in_features, n_heads=original.q_proj.out_features // d_head, d_head=d_head,
        n_kv_heads=original.k_proj.out_features // d_head, bias=any(biases),
        dropout=float(original.attention_dropout), causal=True, rotary=True, rotary_dim=d_head,
        rotary_base=_rope_theta(original.config), scale=default_scale(float(original.scaling), d_head),
    )


def _hf_weights(original: nn.Module) -> HFWeights:
    return HFWeights.from_linears(original.q_proj, original.k_proj, original.v_proj, original.o_proj)


def swap(model: nn.Module) -> nn.Module:
    """Replace every LLaMA-family attention module of ``model`` by a headlab layer, in place.

    Args:
        model: a transformers LLaMA, Mistral or Qwen2 model (base or causal LM).

    Returns:
        ``model``, whose outputs and greedy generations are unchanged to float tolerance.

    Raises:
        ValueError: the model runs an attention implementation other than eager or sdpa, or
            has no module to swap.
    """
    return swap_modules(model, ATTENTION_CLASSES, LlamaFamilyAttention, attention_config=attention_config,
                        hf_weights=_hf_weights, layer_idx=lambda module: module.layer_idx)


def export(model: nn.Module) -> nn.Module:
    """Put the Hugging Face modules back, carrying the headlab layers' current weights, in place.

    Raises:
        ValueError: a layer changed shape or carries per-head interventions since the swap, or
            a bias the original module lacks is no longer zero.
    """
    install(model, [(name, _rebuild(name, module)) for name, module in swapped_of(model, LlamaFamilyAttention)])
    return model


def _rebuild(name: str, swapped: LlamaFamilyAttention) -> nn.Module:
    layer = swapped.attn
    weight = layer.projection.out_proj.weight
    with torch.device(weight.device):
        original = swapped.hf_class(swapped.hf_config, layer_idx=swapped.layer_index)
    original = original.to(weight.dtype)
    original.attention_dropout = layer.config.dropout
    check_exportable(layer, attention_config(original), where=name)
    weights = layer_weights(layer, absent_biases=swapped.hf_absent_biases, where=name)
    with torch.no_grad():
        for part in "qkvo":
            linear = getattr(original, f"{part}_proj")
            linear.weight.copy_(getattr(weights, part))
            bias = getattr(weights, f"{part}_bias")
            if (bias is None) != (linear.bias is None):
                raise ValueError(f"{name}: {part}_proj bias presence differs from the swapped module's")
            if bias is not None:
                linear.bias.copy_(bias)
    return original.train(swapped.training)


def swapped(model: nn.Module) -> list[LlamaFamilyAttention]:
    """The swapped LLaMA-family modules of ``model``, in layer order."""
    return [module for _, module in swapped_of(model, LlamaFamilyAttention)]
