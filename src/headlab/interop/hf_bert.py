"""BERT-family adapter: ``BertAttention``, ``RobertaAttention``, ``XLMRobertaAttention`` ⇄ headlab layers.

Axis legend: hidden states ``(batch, pos, d_model)``; masks ``(batch, 1, query_pos, key_pos)``.

A Hugging Face ``BertAttention`` is ``self`` (query/key/value Linear, attention dropout) then
``output`` (``dense`` = W_O, dropout, LayerNorm over the residual). The swapped module holds a
headlab layer with the four projections and keeps ``output``'s dropout and LayerNorm, so
``LayerNorm(dropout(attention(x)) + x)`` is computed as before, and it returns what
``BertAttention`` returns in transformers v5: ``(attention_output, attn_weights)``, the
weights always None (read patterns through a ``Tap``).

Decoders (``config.is_decoder``) get a causal layer and use the model's kv cache.
Cross-attention blocks (``add_cross_attention``) are refused: the headlab layer is swapped
for self-attention only.

The mask that reaches the module: None without padding; with padding a float additive mask
(eager, finite minimum where masked) or a bool mask (sdpa, True = attend).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.models.bert.modeling_bert import BertAttention
from transformers.models.roberta.modeling_roberta import RobertaAttention
from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaAttention

from headlab.interop._hf_common import (
    HFWeights,
    check_exportable,
    default_scale,
    install,
    layer_weights,
    swap_modules,
    swapped_of,
)
from headlab.interop.hf_attention import SwappedAttention
from headlab.layer import AttentionConfig, MultiHeadAttention

ATTENTION_CLASSES: tuple[type[nn.Module], ...] = (BertAttention, RobertaAttention, XLMRobertaAttention)


class BertFamilyAttention(SwappedAttention):
    """Takes the place of a ``BertAttention`` (or RoBERTa / XLM-R) module.

    Args:
        attn: the headlab layer with the module's query/key/value/dense weights.
        layer_index: the block's index.
        original: the Hugging Face module; its output dropout and LayerNorm are kept.
    """

    def __init__(self, attn: MultiHeadAttention, layer_index: int, *, original: nn.Module) -> None:
        super().__init__(attn, layer_index)
        self.output_dropout = original.output.dropout
        self.output_norm = original.output.LayerNorm
        # What export needs to rebuild the original module (plain attributes, not submodules).
        self.hf_class = type(original)
        self.hf_config = original.self.config
        self.hf_is_causal = bool(original.self.is_causal)

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        encoder_hidden_states: Tensor | None = None,
        encoder_attention_mask: Tensor | None = None,
        past_key_values: object | None = None,
        **kwargs: object,
    ) -> tuple[Tensor, None]:
        """``BertAttention.forward``'s contract: ``(LayerNorm(dropout(attn(x)) + x), None)``."""
        if encoder_hidden_states is not None:
            raise ValueError(f"layer {self.layer_index}: the swapped BERT attention is self-attention only")
        out = self.attend(
            hidden_states, attention_mask=attention_mask,
            past_key_values=past_key_values,
        )
        return self.output_norm(self.output_dropout(out) + hidden_states), None


def attention_config(original: nn.Module) -> AttentionConfig:
    """The headlab config of one BERT-family attention module."""
    self_attn = original.self
    return AttentionConfig(
        d_model=self_attn.query.in_features, n_heads=self_attn.num_attention_heads,
        d_head=self_attn.attention_head_size, bias=True, dropout=float(self_attn.dropout.p),
        causal=bool(self_attn.is_causal),
        scale=default_scale(float(self_attn.scaling), self_attn.attention_head_size),
    )


def _hf_weights(original: nn.Module) -> HFWeights:
    s = original.self
    return HFWeights.from_linears(s.query, s.key, s.value, original.output.dense)


def swap(model: nn.Module) -> nn.Module:
    """Replace every BERT-family attention module of ``model`` by a headlab layer, in place.

    Args:
        model: a transformers BERT, RoBERTa or XLM-RoBERTa model (any head).

    Returns:
        ``model``, whose outputs are unchanged to float tolerance.

    Raises:
        ValueError: the model has cross-attention blocks, runs an attention implementation
            other than eager or sdpa, or has no module to swap.
    """
    return swap_modules(model, ATTENTION_CLASSES, BertFamilyAttention, attention_config=attention_config,
                        hf_weights=_hf_weights, layer_idx=lambda module: module.self.layer_idx)


def export(model: nn.Module) -> nn.Module:
    """Put Hugging Face modules back, carrying the headlab layers' current weights, in place.

    Returns:
        ``model`` with its original module classes (its state_dict has the original names).

    Raises:
        ValueError: a layer changed shape or carries per-head interventions since the swap.
    """
    found = swapped_of(model, BertFamilyAttention)
    install(model, [(name, _rebuild(name, module)) for name, module in found])
    return model


def _rebuild(name: str, swapped: BertFamilyAttention) -> nn.Module:
    layer = swapped.attn
    weight = layer.projection.out_proj.weight
    with torch.device(weight.device):
        original = swapped.hf_class(swapped.hf_config, is_causal=swapped.hf_is_causal, layer_idx=swapped.layer_index)
    original = original.to(weight.dtype)
    original.self.dropout.p = layer.config.dropout
    check_exportable(layer, attention_config(original), where=name)
    weights = layer_weights(layer, where=name)
    s, dense = original.self, original.output.dense
    with torch.no_grad():
        for linear, w, b in ((s.query, weights.q, weights.q_bias), (s.key, weights.k, weights.k_bias),
                             (s.value, weights.v, weights.v_bias), (dense, weights.o, weights.o_bias)):
            linear.weight.copy_(w)
            linear.bias.copy_(b)
    original.output.dropout = swapped.output_dropout
    original.output.LayerNorm = swapped.output_norm
    return original.train(swapped.training)


def swapped(model: nn.Module) -> list[BertFamilyAttention]:
    """The swapped BERT-family modules of ``model``, in layer order."""
    return [module for _, module in swapped_of(model, BertFamilyAttention)]
