"""Every example of headlab's variants gets the right verdict, and its equivalent headlab layer reproduces it."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from headlab.audit.examples import EXAMPLES
from headlab.layer import AttentionConfig
from headlab.layer.accounting import account
from tests.support.audit import CORPUS

# name: (call, batch_first, attention function, n_heads, n_kv_heads, d_head, d_head_v, reads, shared,
#        causal, W_QK rank, layout, variant, standard, the headlab layer that reproduces it)
EXPECTED = {
    "slice_shared": ("vkq", True, "torch.softmax", 4, 4, 16, 16, "narrow", True, False, 16, "shared", "shared", False,
                   AttentionConfig(d_model=64, n_heads=4, projection="shared")),
    "narrow": ("self", True, "torch.nn.functional.softmax", 4, 4, 16, 16, "narrow", False, False, 16, "narrow",
               "narrow", False, AttentionConfig(d_model=64, n_heads=4, projection="narrow")),
    "separate_qkv": ("qkv", True, "Tensor.softmax", 8, 8, 8, 8, "wide", False, False, 8, "standard", "wide", True,
                     AttentionConfig(d_model=64, n_heads=8)),
    "fused_causal": ("self", True, "torch.nn.functional.scaled_dot_product_attention", 4, 4, 16, 16, "wide", False,
                     True, 16, "standard", "wide", True, AttentionConfig(d_model=64, n_heads=4, causal=True)),
    "einsum_heads": ("self", True, "torch.nn.functional.softmax", 6, 6, 6, 6, "wide", False, False, 6, "standard",
                     "wide", True, AttentionConfig(d_model=48, n_heads=6, d_head=6)),
    "torch_mha": ("qkv", False, "torch.nn.functional.multi_head_attention_forward", 8, 8, 8, 8, "wide", False, False,
                  8, "standard", "wide", True, AttentionConfig(d_model=64, n_heads=8)),
    "grouped_query": ("self", True, "torch.softmax", 8, 2, 8, 8, "wide", False, False, 8, "grouped-query",
                      "grouped-query", False, AttentionConfig(d_model=64, n_heads=8, n_kv_heads=2)),
    "multi_query": ("self", True, "torch.nn.functional.scaled_dot_product_attention", 8, 1, 8, 8, "wide", False,
                    False, 8, "multi-query", "multi-query", False,
                    AttentionConfig(d_model=64, n_heads=8, n_kv_heads=1)),
    "bilinear": ("self", True, "torch.softmax", 4, 4, 32, 8, "wide", False, False, 32, "bilinear", "bilinear", False,
                 AttentionConfig(d_model=32, n_heads=4, d_head=32, d_head_v=8, projection="bilinear")),
    "single_head": ("self", True, "Tensor.softmax", 1, 1, 32, 32, "wide", False, False, 32, "single-head", "wide",
                    False, AttentionConfig(d_model=64, n_heads=1, d_head=32)),
    "same_weights": ("self", True, "torch.softmax", 4, 1, 16, 16, "wide", True, False, 16, "wide-shared",
                     "multi-query", False, AttentionConfig(d_model=64, n_heads=4, n_kv_heads=1)),
}


def test_every_example_has_an_expected_verdict() -> None:
    assert set(EXPECTED) | set(CORPUS) == set(EXAMPLES) and not set(EXPECTED) & set(CORPUS)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_verdict_fields(name: str, example_audits) -> None:
    module, r = example_audits[name]
    (call, batch_first, function, n_heads, n_kv, d_head, d_head_v, reads, shared, causal, rank, layout, variant,
     standard, config) = EXPECTED[name]
    assert (r.call, r.batch_first, r.attention_function) == (call, batch_first, function)
    assert (r.n_heads, r.n_kv_heads, r.d_head, r.d_head_v) == (n_heads, n_kv, d_head, d_head_v)
    assert (r.reads, r.shared, r.causal, r.layout, r.variant, r.standard) == (reads, shared, causal, layout, variant,
                                                                              standard)
    assert r.qk_ranks == [rank] * n_heads
    assert r.bilinear_scores and r.evidence.interception_change <= 1e-12
    assert r.dtype == "float64" and r.d_model == config.d_model
    # Parameters: the module's own, headlab's standard layer, and the matching variant.
    assert r.parameters.module == sum(p.numel() for p in module.parameters())
    standard_config = AttentionConfig(d_model=config.d_model, n_heads=n_heads,
                                      d_head=None if config.d_model % n_heads == 0 else d_head)
    assert r.parameters.standard == account(standard_config).total_parameters
    assert r.parameters.variant == account(config).total_parameters
    assert r.parameters.variant_name == variant
    # The equivalent layer is the expected headlab config, verified.
    assert r.equivalent.verified and r.equivalent.max_abs_diff < 1e-12
    assert r.equivalent.config == config.to_dict()
    assert r.layer is not None and r.layer.config == config
    json.dumps(r.to_dict())  # one JSON-ready document


def _native(name: str, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Call an example its own way on batch-first ``x``."""
    if name == "slice_shared":
        return module(x, x, x, None)
    if name == "separate_qkv":
        return module(x, x, x)
    if name == "torch_mha":  # sequence-first, returns (output, weights)
        t = x.transpose(0, 1)
        return module(t, t, t)[0].transpose(0, 1)
    return module(x)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_equivalent_layer_reproduces_the_module(name: str, example_audits) -> None:
    module, r = example_audits[name]
    reference = copy.deepcopy(module).double().eval()
    x = torch.randn(3, 11, r.d_model, dtype=torch.float64)  # other batch and length than the audit used
    with torch.no_grad():
        torch.testing.assert_close(r.layer(x), _native(name, reference, x), rtol=0, atol=1e-12)


def test_grouped_query_groups_are_the_consecutive_query_heads(example_audits) -> None:
    _, r = example_audits["grouped_query"]
    assert r.kv_groups == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [h.kv_group for h in r.heads] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_multi_query_shares_values_but_not_query_key_forms(example_audits) -> None:
    _, r = example_audits["multi_query"]
    assert r.evidence.kv_heads_in_call == 1  # scaled_dot_product_attention received one key/value head
    assert r.shared_v is True and r.shared_qk is False
    assert "1 key/value head shared by all 8 query heads (multi-query attention)" in r.verdict


def test_bilinear_heads_have_full_rank_forms_and_narrow_values(example_audits) -> None:
    _, r = example_audits["bilinear"]
    assert r.ov_ranks == [8] * 4
    assert any("rank 32 = d_model: a full bilinear form per head" in line for line in r.verdict)


def test_same_weights_heads_are_copies(example_audits) -> None:
    _, r = example_audits["same_weights"]
    assert r.shared_qk and r.shared_v and r.kv_groups == [[0, 1, 2, 3]]
    assert r.evidence.same_slice_spread == 0.0
    assert any("the heads are 4 copies of one head" in line for line in r.verdict)


def test_standard_layers_are_said_to_be_standard(example_audits) -> None:
    for name, (_, r) in example_audits.items():
        said = "this is standard multi-head attention (Vaswani et al. 2017)" in r.verdict
        assert said == r.standard, name
        assert any("not the multi-head attention of Vaswani et al." in line for line in r.verdict) == r.shared, name
