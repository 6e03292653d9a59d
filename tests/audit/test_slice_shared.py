"""The tutorial layer's layout (examples/slice_shared.py) shares its weights, with the evidence; the standard
layer does not."""

from __future__ import annotations

import pytest
import torch

from headlab.audit import audit
from headlab.audit.examples import SliceSharedAttention


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(1)
    tutorial = SliceSharedAttention(embed_size=32, heads=4)
    standard = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    return tutorial, audit(tutorial), audit(standard)


def test_recovered_query_key_forms_are_the_one_shared_product(pair) -> None:
    tutorial, result, _ = pair
    W_q = tutorial.query_proj.weight.detach().double().T  # x W_q: (head_dim, head_dim)
    W_k = tutorial.key_proj.weight.detach().double().T
    block = W_q @ W_k.T / 32**0.5  # the scores divide by sqrt(embed_size)
    for h in range(4):
        s = slice(8 * h, 8 * (h + 1))
        torch.testing.assert_close(result.W_QK[h][s, s], block, rtol=0, atol=1e-12)
        outside = result.W_QK[h].clone()
        outside[s, s] = 0
        assert outside.abs().max() == 0  # nothing outside its own slice


def test_recovered_output_value_circuits_use_the_one_value_projection(pair) -> None:
    tutorial, result, _ = pair
    W_v = tutorial.value_proj.weight.detach().double().T
    W_o = tutorial.merge.weight.detach().double().T  # (heads·head_dim, embed)
    for h in range(4):
        s = slice(8 * h, 8 * (h + 1))
        torch.testing.assert_close(result.W_OV[h][s], W_v @ W_o[s], rtol=0, atol=1e-12)


def test_evidence_of_sharing(pair) -> None:
    _, tutorial, _standard = pair
    assert tutorial.shared and tutorial.shared_qk and tutorial.shared_v and tutorial.reads == "narrow"
    assert [h.qk_difference for h in tutorial.heads] == [0.0] * 4
    assert [h.value_difference for h in tutorial.heads] == [0.0] * 4
    assert [(h.reads_q.slice_index, h.reads_k.slice_index, h.reads_v.slice_index) for h in tutorial.heads] == [
        (h, h, h) for h in range(4)]
    assert tutorial.evidence.same_slice_spread == 0.0  # identical slices → identical patterns in every head
    assert tutorial.same_slice_patterns.shape == (4, 8, 8)
    assert tutorial.verdict[:2] == [
        "4 heads of size 8 (the rank of each head's W_QK); each head reads only its 8-wide slice of the input "
        "(queries, keys and values)",
        "all 4 heads share one 8×8 query, key and value projection: on an input whose slices are all the same, "
        "every head's pattern is the same (largest difference 0.0e+00) — this is not the multi-head attention of "
        "Vaswani et al.",
    ]
    assert tutorial.layout == "shared" and tutorial.equivalent.verified
    assert tutorial.layer.projection.q_weight.shape == (1, 8, 8)  # one matrix serves every head


def test_the_standard_layer_shares_nothing(pair) -> None:
    _, _, standard = pair
    assert not standard.shared and not standard.shared_qk and standard.shared_v is False
    assert standard.reads == "wide" and standard.standard and standard.layout == "standard"
    assert min(h.qk_difference for h in standard.heads[1:]) > 0.1
    assert standard.evidence.same_slice_spread > 0.01
    assert standard.verdict[0] == ("4 heads of size 8; each head reads all 32 input dimensions "
                                   "(queries, keys and values)")
    assert standard.parameters.module == standard.parameters.standard == 4 * 32 * 32 + 4 * 32
