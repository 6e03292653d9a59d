"""GPT-2 adapter: Conv1D weights carry over transposed; outputs, scales and generation match."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from headlab.interop import hf_gpt2, swap, swapped_layers  # noqa: E402
from tests.interop.hf_models import (  # noqa: E402
    assert_round_trip,
    batch,
    build,
    config,
    max_diff_on_tokens,
    swapped_copy,
)

VARIANTS = {
    "standard": {},
    "scale by inverse layer index": dict(scale_attn_by_inverse_layer_idx=True),
    "unscaled": dict(scale_attn_weights=False),
    "reorder and upcast": dict(reorder_and_upcast_attn=True),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("padding", ["left", "right"])
def test_logits_equal_original_eager(variant, attn_implementation, padding):
    original = build(transformers.GPT2LMHeadModel, config("gpt2", **VARIANTS[variant]))
    swapped = swapped_copy(original, attn_implementation=attn_implementation)
    ids, mask = batch(padding=padding)
    assert max_diff_on_tokens(original, swapped, ids, mask) < 1e-5


def test_scale_folds_in_both_flags():
    cfg = config("gpt2", n_layer=3, scale_attn_by_inverse_layer_idx=True)
    layers = swapped_layers(swap(build(transformers.GPT2Model, cfg)))
    d_head = 32 // 4
    assert [layer.config.softmax_scale for layer in layers] == [d_head**-0.5 / (i + 1) for i in range(3)]
    unscaled = swapped_layers(swap(build(transformers.GPT2Model, config("gpt2", scale_attn_weights=False))))
    assert unscaled[0].config.softmax_scale == 1.0


def test_conv1d_weights_are_transposed_into_heads():
    original = build(transformers.GPT2Model, config("gpt2", attn_pdrop=0.2, resid_pdrop=0.3))
    attn = original.h[0].attn
    module = hf_gpt2.swapped(swapped_copy(original, attn_implementation="sdpa"))[0]
    layer = module.attn
    assert layer.config.causal and layer.config.dropout == 0.2 and module.resid_dropout.p == 0.3
    # c_attn: (d_model, 3·d_model), x W: query columns 0:32, head 1 = columns 8:16; keys from 32.
    assert torch.equal(layer.W_Q[1], attn.c_attn.weight[:, 8:16])
    assert torch.equal(layer.W_K[3], attn.c_attn.weight[:, 32 + 24 : 32 + 32])
    assert torch.equal(layer.W_O[2], attn.c_proj.weight[16:24])


def test_greedy_generation_with_the_cache_is_unchanged():
    original = build(transformers.GPT2LMHeadModel, config("gpt2"))
    swapped = swapped_copy(original, attn_implementation="sdpa")
    ids, mask = batch(padding="left", batch_size=2, length=6)
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                  output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        expected = original.generate(ids, **kwargs)
        got = swapped.generate(ids, **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert max(float((a - b).abs().max()) for a, b in zip(got.scores, expected.scores)) < 1e-5


def test_export_round_trip():
    assert_round_trip(build(transformers.GPT2LMHeadModel, config("gpt2", scale_attn_by_inverse_layer_idx=True)))


def test_float64():
    original = build(transformers.GPT2LMHeadModel, config("gpt2")).double()
    swapped = swapped_copy(original, attn_implementation="sdpa")
    ids, mask = batch(padding="left")
    assert max_diff_on_tokens(original, swapped, ids, mask) < 1e-12


def test_cross_attention_is_refused():
    model = build(transformers.GPT2Model, config("gpt2", add_cross_attention=True))
    with pytest.raises(ValueError, match="cross-attention"):
        swap(model)
    assert not swapped_layers(model)
