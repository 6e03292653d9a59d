"""LLaMA-family adapter: grouped-query, rotary, biases, sliding windows and the kv cache match HF."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from headlab.interop import hf_llama, swap, swapped_layers  # noqa: E402
from headlab.interop.hf_attention import Tap  # noqa: E402
from tests.interop.hf_models import (  # noqa: E402
    assert_round_trip,
    batch,
    build,
    config,
    max_diff_on_tokens,
    swapped_copy,
)

LM = {
    "llama": lambda: transformers.LlamaForCausalLM,
    "mistral": lambda: transformers.MistralForCausalLM,
    "qwen2": lambda: transformers.Qwen2ForCausalLM,
}


@pytest.mark.parametrize("kind", sorted(LM))
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("padding", ["left", "right"])
def test_logits_equal_original_eager(kind, attn_implementation, padding):
    original = build(LM[kind](), config(kind))
    swapped = swapped_copy(original, attn_implementation=attn_implementation)
    ids, mask = batch(padding=padding, length=11)
    assert max_diff_on_tokens(original, swapped, ids, mask) < 1e-5


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_the_sliding_window_is_active_in_these_cases(kind):
    """Without the window the same weights give other logits, so the parity above tests the window."""
    ids, mask = batch(padding="left", length=11)
    windowed = swap(build(LM[kind](), config(kind), attn_implementation="sdpa"))
    unwindowed = build(LM[kind](), config(kind, sliding_window=None, use_sliding_window=False))
    assert max_diff_on_tokens(unwindowed, windowed, ids, mask) > 1e-3
    windows = [module.sliding_window for module in hf_llama.swapped(windowed)]
    assert windows == ([4, 4] if kind == "mistral" else [None, 4])


def test_sizes_biases_and_rotary_carry_over():
    original = build(transformers.LlamaModel, config("llama", rope_parameters={"rope_type": "default",
                                                                               "rope_theta": 500.0}))
    attn = original.layers[0].self_attn
    layer = swapped_layers(swapped_copy(original, attn_implementation="sdpa"))[0]
    c = layer.config
    assert (c.d_model, c.n_heads, c.n_kv_heads, c.d_head) == (32, 4, 2, 12)
    assert c.rotary and c.rotary_dim == 12 and c.rotary_base == 500.0 and c.causal
    assert torch.equal(layer.W_K[1], attn.k_proj.weight[12:24].T)
    assert torch.equal(layer.b_O, attn.o_proj.bias)


def test_qwen2_output_bias_is_zero_and_export_refuses_a_trained_one():
    original = build(transformers.Qwen2ForCausalLM, config("qwen2"))
    assert original.model.layers[0].self_attn.o_proj.bias is None
    swapped = swapped_copy(original, attn_implementation="sdpa")
    layer = swapped_layers(swapped)[0]
    assert layer.config.bias and torch.equal(layer.b_O, torch.zeros(32))
    assert torch.equal(layer.b_Q.flatten(), original.model.layers[0].self_attn.q_proj.bias)
    with torch.no_grad():
        layer.b_O.add_(0.5)
    with pytest.raises(ValueError, match="no o bias"):
        hf_llama.export(swapped)


def test_scaled_rope_passes_through_position_embeddings():
    cfg = config("llama", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    original = build(transformers.LlamaForCausalLM, cfg)
    swapped = swapped_copy(original, attn_implementation="sdpa")
    ids, mask = batch(padding="left", length=11)
    assert max_diff_on_tokens(original, swapped, ids, mask) < 1e-5


def test_patterns_through_a_tap_equal_hf_attentions_under_grouped_query():
    original = build(transformers.LlamaModel, config("llama"))
    swapped = swapped_copy(original, attn_implementation="sdpa")
    ids, mask = batch(padding="left")
    seen = {}
    for module in hf_llama.swapped(swapped):
        module.tap = Tap(sink=lambda index, out: seen.__setitem__(index, out.patterns), patterns=[0, 1, 2, 3])
    with torch.no_grad():
        expected = original(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        swapped(input_ids=ids, attention_mask=mask)
    assert len(expected) == len(seen) == 2
    live = mask.bool()[:, None, :, None].expand(-1, 4, -1, mask.shape[1])  # queries that are tokens
    for index, pattern in enumerate(expected):
        assert (seen[index] - pattern)[live].abs().max() < 1e-5


@pytest.mark.parametrize("kind", sorted(LM))
@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_greedy_generation_with_the_cache_is_unchanged(kind, cache_implementation):
    """Eight new tokens: past Mistral's and Qwen2's window of 4, so their sliding caches wrap."""
    original = build(LM[kind](), config(kind))
    swapped = swapped_copy(original, attn_implementation="sdpa")
    ids, mask = batch(padding="left", batch_size=2, length=6)
    kwargs = dict(attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0,
                  output_scores=True, return_dict_in_generate=True, cache_implementation=cache_implementation)
    with torch.no_grad():
        expected = original.generate(ids, **kwargs)
        got = swapped.generate(ids, **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert max(float((a - b).abs().max()) for a, b in zip(got.scores, expected.scores)) < 1e-5


def test_window_mask_is_built_when_the_caller_gives_none():
    original = build(transformers.MistralModel, config("mistral"))
    module = hf_llama.swapped(swapped_copy(original, attn_implementation="sdpa"))[0]
    x = torch.randn(2, 7, 32)
    q_pos, k_pos = torch.arange(7)[:, None], torch.arange(7)[None, :]
    window = ((k_pos <= q_pos) & (k_pos > q_pos - 4))[None, None].expand(2, 1, 7, 7)  # HF: True = attend
    cos_sin = original.rotary_emb(x, torch.arange(7)[None].expand(2, -1))
    with torch.no_grad():
        implicit, _ = module(x, position_embeddings=cos_sin, attention_mask=None)
        explicit, _ = module(x, position_embeddings=cos_sin, attention_mask=window)
        unwindowed = module.attend(x, rotary_cos_sin=cos_sin)
    assert torch.allclose(implicit, explicit, atol=1e-6)
    assert not torch.allclose(implicit, unwindowed, atol=1e-3)


@pytest.mark.parametrize("kind", sorted(LM))
def test_export_round_trip(kind):
    assert_round_trip(build(LM[kind](), config(kind)))


def test_float64_attention_module():
    """Module against module: the models' RMSNorm computes in float32, which hides float64 agreement."""
    original = build(transformers.LlamaModel, config("llama"), attn_implementation="sdpa").double()
    swapped = swapped_copy(original, attn_implementation="sdpa")
    x = torch.randn(3, 9, 32, dtype=torch.float64)
    cos_sin = original.rotary_emb(x, torch.arange(9)[None].expand(3, -1))
    with torch.no_grad():
        expected, _ = original.layers[1].self_attn(x, position_embeddings=cos_sin, attention_mask=None)
        got, _ = swapped.layers[1].self_attn(x, position_embeddings=cos_sin, attention_mask=None)
    assert float((got - expected).abs().max()) < 1e-12


def test_flash_attention_is_refused():
    model = build(transformers.LlamaModel, config("llama"))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attn_implementation='flash_attention_2'"):
        swap(model)
