"""BERT-family adapter: swapped BERT / RoBERTa / XLM-R equal the originals; export restores them."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from headlab.interop import hf_bert, swap, swapped_layers  # noqa: E402
from headlab.interop.hf_attention import Tap  # noqa: E402
from tests.interop.hf_models import (  # noqa: E402
    assert_round_trip,
    batch,
    build,
    config,
    max_diff_on_tokens,
    swapped_copy,
)

MODELS = {
    "bert": lambda: transformers.BertModel,
    "roberta": lambda: transformers.RobertaModel,
    "xlm-roberta": lambda: transformers.XLMRobertaModel,
}


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("padding", ["right", "left", "none"])
def test_outputs_equal_original_eager(kind, attn_implementation, padding):
    original = build(MODELS[kind](), config(kind))
    swapped = swapped_copy(original, attn_implementation=attn_implementation)
    assert len(hf_bert.swapped(swapped)) == 2
    ids, mask = batch(padding=padding)
    assert max_diff_on_tokens(original, swapped, ids, mask) < 1e-5


def test_decoder_is_causal_and_generates_the_same():
    cfg = config("bert", is_decoder=True, bos_token_id=1, eos_token_id=2)
    original = build(transformers.BertLMHeadModel, cfg)
    swapped = swapped_copy(original, attn_implementation="sdpa")
    assert all(layer.config.causal for layer in swapped_layers(swapped))
    ids, mask = batch(padding="right")
    assert max_diff_on_tokens(original, swapped, ids, mask) < 1e-5
    prompt = ids[:1, :5]
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = original.generate(prompt, **kwargs)
        got = swapped.generate(prompt, **kwargs)
    assert torch.equal(got, expected)


def test_weights_dropout_and_layernorm_carry_over():
    cfg = config("bert", attention_probs_dropout_prob=0.25, hidden_dropout_prob=0.15)
    original = build(transformers.BertModel, cfg)
    block = original.encoder.layer[1].attention
    swapped = swapped_copy(original, attn_implementation="sdpa")
    module = hf_bert.swapped(swapped)[1]
    layer = module.attn
    assert module.layer_index == 1
    assert layer.config.dropout == 0.25 and module.output_dropout.p == 0.15
    assert torch.equal(module.output_norm.weight, block.output.LayerNorm.weight)
    # Head 2's query weights are rows 16:24 of BERT's query Linear (heads contiguous).
    assert torch.equal(layer.W_Q[2], block.self.query.weight[16:24].T)
    assert torch.equal(layer.W_O[2], block.output.dense.weight[:, 16:24].T)
    assert torch.equal(layer.b_V.flatten(), block.self.value.bias)


def test_patterns_through_a_tap_equal_hf_attentions():
    original = build(transformers.BertModel, config("bert"))
    swapped = swapped_copy(original, attn_implementation="sdpa")
    ids, mask = batch(padding="right")
    seen = {}
    for module in hf_bert.swapped(swapped):
        module.tap = Tap(sink=lambda index, out: seen.__setitem__(index, out.patterns), patterns=[0, 1, 2, 3])
    with torch.no_grad():
        expected = original(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
        swapped(input_ids=ids, attention_mask=mask)
    assert len(expected) == len(seen) == 2
    for index, pattern in enumerate(expected):
        live = mask.bool()[:, None, :, None].expand_as(pattern)
        assert (seen[index] - pattern)[live].abs().max() < 1e-5


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.bfloat16, 0.1)])
def test_other_dtypes(dtype, tolerance):
    original = build(transformers.BertModel, config("bert")).to(dtype)
    swapped = swapped_copy(original, attn_implementation="sdpa")
    assert swapped_layers(swapped)[0].projection.dtype == dtype
    ids, mask = batch(padding="right")
    assert max_diff_on_tokens(original, swapped, ids, mask) < tolerance


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_export_round_trip(kind):
    assert_round_trip(build(MODELS[kind](), config(kind)))


def test_export_carries_edited_weights():
    original = build(transformers.BertModel, config("bert"))
    swapped = swapped_copy(original, attn_implementation="sdpa")
    with torch.no_grad():
        swapped_layers(swapped)[0].W_O[1].zero_()  # a view: zeroes head 1's slice of out_proj
    exported = hf_bert.export(copy.deepcopy(swapped))
    dense = exported.encoder.layer[0].attention.output.dense.weight
    assert torch.equal(dense[:, 8:16], torch.zeros(32, 8))
    assert torch.equal(dense[:, :8], original.encoder.layer[0].attention.output.dense.weight[:, :8])
    ids, mask = batch(padding="right")
    assert max_diff_on_tokens(swapped, exported, ids, mask) < 1e-5


def test_export_refuses_head_interventions():
    swapped = swapped_copy(build(transformers.BertModel, config("bert")), attn_implementation="sdpa")
    swapped_layers(swapped)[1].set_head_affine(torch.tensor([1.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="set_head_affine"):
        hf_bert.export(swapped)


def test_cross_attention_is_refused_and_nothing_changes():
    cfg = config("bert", is_decoder=True, add_cross_attention=True)
    model = build(transformers.BertModel, cfg)
    with pytest.raises(ValueError, match="cross-attention"):
        swap(model)
    assert not swapped_layers(model)


def test_swap_twice_is_a_no_op():
    model = swap(build(transformers.BertModel, config("bert")))
    modules = hf_bert.swapped(model)
    assert swap(model) is model and hf_bert.swapped(model) == modules
