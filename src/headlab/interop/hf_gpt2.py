"""GPT-2 adapter: ``GPT2Attention`` ⇄ headlab layers.

Axis legend: hidden states ``(batch, pos, d_model)``; masks ``(batch, 1, query_pos, key_pos)``;
Conv1D weights ``(in_features, out_features)``.

GPT-2's projections are ``Conv1D``s: ``y = x W + b`` with W ``(d_model, 3·d_model)``, the
transpose of a Linear's weight. ``c_attn``'s output splits into q, k, v, each head-major, so
``c_attn.weight.T`` is exactly headlab's fused ``in_proj_weight`` and ``c_proj.weight.T`` its
``out_proj.weight``. The layer is causal; its scale is the module's ``scaling``, which folds in
``scale_attn_weights`` (1/sqrt(d_head), or 1 when False) and
``scale_attn_by_inverse_layer_idx`` (a further 1/(layer_idx + 1)). ``attn_pdrop`` becomes the
layer's dropout; ``resid_dropout`` stays after the output projection.

``reorder_and_upcast_attn`` is accepted: in float32 and float64 it changes nothing; in half
precision Hugging Face's eager path forms q·kᵀ in float32, while headlab forms it in the
model's dtype (both take the softmax in float32), so outputs agree to half-precision
tolerance only. Cross-attention blocks (``add_cross_attention``) are refused.

The mask that reaches the module: eager builds a float additive mask (causal and padding,
finite minimum where masked) on every call; sdpa passes None without padding, else a bool
mask (True = attend). The cache is the model's ``past_key_values`` (a ``DynamicCache``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

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


class GPT2SwappedAttention(SwappedAttention):
    """Takes the place of a ``GPT2Attention`` module.

    Args:
        attn: the headlab layer with the module's ``c_attn`` and ``c_proj`` weights.
        layer_index: the block's index.
        original: the Hugging Face module; its ``resid_dropout`` is kept.
    """

    def __init__(self, attn: MultiHeadAttention, layer_index: int, *, original: GPT2Attention) -> None:
        super().__init__(attn, layer_index)
        self.resid_dropout = original.resid_dropout
        self.hf_config = original.config  # to rebuild the original on export

    def forward(
        self,
        hidden_states: Tensor,
        past_key_values: object | None = None,
        attention_mask: Tensor | None = None,
        encoder_hidden_states: Tensor | None = None,
        encoder_attention_mask: Tensor | None = None,
        output_attentions: bool | None = False,
        **kwargs: object,
    ) -> tuple[Tensor, None]:
        """``GPT2Attention.forward``'s contract: ``(resid_dropout(attn(x)), None)``."""
        if encoder_hidden_states is not None:
            raise ValueError(f"layer {self.layer_index}: the swapped GPT-2 attention is self-attention only")
        out = self.attend(
            hidden_states, attention_mask=attention_mask,
            past_key_values=past_key_values,
        )
        return self.resid_dropout(out), None


def attention_config(original: GPT2Attention) -> AttentionConfig:
    """The headlab config of one ``GPT2Attention``."""
    return AttentionConfig(
        d_model=original.embed_dim, n_heads=original.num_heads, d_head=original.head_dim, bias=True,
        dropout=float(original.attn_dropout.p), causal=True,
        scale=default_scale(float(original.scaling), original.head_dim),
    )


def _hf_weights(original: GPT2Attention) -> HFWeights:
    d = original.embed_dim
    qkv_weight = original.c_attn.weight.detach().t()  # (3·d_model, d_model), Linear layout
    qkv_bias = original.c_attn.bias.detach()
    return HFWeights(
        q=qkv_weight[:d], k=qkv_weight[d : 2 * d], v=qkv_weight[2 * d :], o=original.c_proj.weight.detach().t(),
        q_bias=qkv_bias[:d], k_bias=qkv_bias[d : 2 * d], v_bias=qkv_bias[2 * d :],
        o_bias=original.c_proj.bias.detach(),
    )


def swap(model: nn.Module) -> nn.Module:
    """Replace every ``GPT2Attention`` of ``model`` by a headlab layer, in place.

    Args:
        model: a transformers GPT-2 model (``GPT2Model``, ``GPT2LMHeadModel``, ...).

    Returns:
        ``model``, whose outputs are unchanged to float tolerance.

    Raises:
        ValueError: the model has cross-attention blocks, runs an attention implementation
            other than eager or sdpa, or has no module to swap.
    """
    return swap_modules(model, (GPT2Attention,), GPT2SwappedAttention, attention_config=attention_config,
                        hf_weights=_hf_weights, layer_idx=lambda module: module.layer_idx)


def export(model: nn.Module) -> nn.Module:
    """Put ``GPT2Attention`` modules back, carrying the headlab layers' current weights, in place.

    Raises:
        ValueError: a layer changed shape or carries per-head interventions since the swap.
    """
    install(model, [(name, _rebuild(name, module)) for name, module in swapped_of(model, GPT2SwappedAttention)])
    return model


def _rebuild(name: str, swapped: GPT2SwappedAttention) -> GPT2Attention:
    layer = swapped.attn
    weight = layer.projection.out_proj.weight
    with torch.device(weight.device):
        original = GPT2Attention(swapped.hf_config, is_cross_attention=False, layer_idx=swapped.layer_index)
    original = original.to(weight.dtype)
    original.attn_dropout.p = layer.config.dropout
    check_exportable(layer, attention_config(original), where=name)
    weights = layer_weights(layer, where=name)
    with torch.no_grad():
        original.c_attn.weight.copy_(torch.cat((weights.q, weights.k, weights.v)).t())
        original.c_attn.bias.copy_(torch.cat((weights.q_bias, weights.k_bias, weights.v_bias)))
        original.c_proj.weight.copy_(weights.o.t())
        original.c_proj.bias.copy_(weights.o_bias)
    original.resid_dropout = swapped.resid_dropout
    return original.train(swapped.training)


def swapped(model: nn.Module) -> list[GPT2SwappedAttention]:
    """The swapped GPT-2 modules of ``model``, in layer order."""
    return [module for _, module in swapped_of(model, GPT2SwappedAttention)]
