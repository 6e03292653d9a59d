"""Probing recovers each head's W_QK, w and W_OV exactly: headlab's own layers are the reference."""

from __future__ import annotations

import pytest
import torch

from headlab.audit import audit
from headlab.layer import AttentionConfig, MultiHeadAttention
from tests.support.layers import BlockCausal, Positional

CONFIGS = {
    "wide": dict(d_model=16, n_heads=4),
    "narrow": dict(d_model=16, n_heads=4, projection="narrow"),
    "shared": dict(d_model=16, n_heads=4, projection="shared"),
    "bilinear": dict(d_model=12, n_heads=3, projection="bilinear"),
    "collaborative": dict(d_model=16, n_heads=4, projection="collaborative", d_head=16, d_head_v=4),
    "grouped, irregular groups": dict(d_model=16, n_heads=4, n_kv_heads=2, kv_head_of=(0, 1, 1, 0)),
    "causal multi-query": dict(d_model=16, n_heads=4, n_kv_heads=1, causal=True),
    "wide heads": dict(d_model=12, n_heads=2, d_head=9, d_head_v=5),
}


def _layer(options: dict) -> MultiHeadAttention:
    torch.manual_seed(0)
    layer = MultiHeadAttention(AttentionConfig(**options))
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.3)  # biases start at zero; make every bias term count
    return layer


@pytest.fixture(scope="module")
def audits() -> dict:
    return {name: (_layer(options), audit(_layer(options))) for name, options in CONFIGS.items()}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_recovered_maps_equal_the_layers_own(name: str, audits) -> None:
    layer, result = audits[name]
    layer = layer.double()
    c, scale = layer.config, layer.config.softmax_scale
    torch.testing.assert_close(result.W_QK, layer.QK.AB * scale, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.W_OV, layer.OV.AB, rtol=0, atol=1e-12)
    assert result.qk_ranks == [int(r) for r in layer.QK.rank]
    assert result.causal == c.causal
    assert result.n_kv_heads == (c.n_kv_heads if c.projection == "wide" else c.n_heads)
    assert result.equivalent.verified, result.equivalent
    if c.projection in ("narrow", "shared", "bilinear"):
        assert result.variant == c.projection


def test_grouping_follows_kv_head_of(audits) -> None:
    _, result = audits["grouped, irregular groups"]
    assert result.kv_groups == [[0, 3], [1, 2]]
    assert result.equivalent.config["kv_head_of"] == (0, 1, 1, 0)


def test_head_size_from_ranks_when_the_call_hides_it(audits) -> None:
    _, result = audits["wide heads"]  # headlab's layer uses scaled_dot_product_attention: sizes from the call
    assert (result.d_head, result.d_head_v, result.size_sources) == (9, 5, {"d_head": "call", "d_head_v": "call"})
    assert result.qk_ranks == [9, 9] and result.ov_ranks == [5, 5]


@pytest.mark.parametrize("module", [
    lambda: MultiHeadAttention(AttentionConfig(d_model=16, n_heads=2, rotary=True)), Positional,
])
def test_scores_that_are_not_bilinear_are_flagged(module) -> None:
    torch.manual_seed(0)
    result = audit(module())
    assert not result.bilinear_scores and result.evidence.bilinear_residual > 1e-3
    assert any(line.startswith("warning: the scores are not a bilinear form of the inputs") for line in result.verdict)
    assert not result.standard and not result.equivalent.verified
    assert result.verdict[-2].startswith("closest headlab variant: 'wide'; no exact equivalent")


def test_a_module_with_a_length_limit_is_probed_in_blocks() -> None:
    torch.manual_seed(0)
    limited = BlockCausal(d_model=16, n_heads=2, block_size=10)  # the one-block probes need 34 and 17 positions
    unlimited = BlockCausal(d_model=16, n_heads=2, block_size=64)
    unlimited.qkv.load_state_dict(limited.qkv.state_dict())
    unlimited.out.load_state_dict(limited.out.state_dict())
    result, reference = audit(limited), audit(unlimited)
    assert (result.n_heads, result.d_head, result.causal, result.layout) == (2, 8, True, "standard")
    assert result.evidence.values_seen and result.equivalent.verified
    torch.testing.assert_close(result.W_QK, reference.W_QK, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.W_OV, reference.W_OV, rtol=0, atol=1e-12)
    assert result.to_dict()["heads"] == reference.to_dict()["heads"]


def _prober(module: torch.nn.Module):
    from headlab.audit.probes import Prober
    from headlab.audit.run import _prepare, candidate_widths

    working, dtype, detected = _prepare(module, candidate_widths(module), None, 0, inferred=True)
    prober = Prober(working, detected, dtype=dtype, seed=0)
    return prober, prober.observe(prober.random(8)).scores.shape[0]


def test_values_at_once_equal_head_by_head_or_step_aside() -> None:
    """Where every head's z is read from one forward per block, W_OV and the values equal those of one
    steered forward per head; a module whose output is not z W_O alone (a residual inside) or whose z is
    hidden gets the per-head probe instead."""
    from headlab.audit.examples import EXAMPLES, build
    from headlab.audit.probes import _values_at_once, _values_head_by_head

    at_once = set()
    makers = [(f"example {name}", lambda name=name: build(name)) for name in EXAMPLES]
    makers += [(f"layer {name}", lambda options=options: _layer(options)) for name, options in CONFIGS.items()]
    for name, make in makers:
        torch.manual_seed(0)
        prober, n_heads = _prober(make())
        fast = _values_at_once(prober, n_heads)
        if fast is None:
            continue
        at_once.add(name)
        slow = _values_head_by_head(prober, n_heads)
        scale = float(slow.W_OV.abs().max())
        assert float((fast.W_OV - slow.W_OV).abs().max()) <= 1e-10 * scale, name
        assert fast.value_width == slow.value_width and len(fast.values) == len(slow.values), name
        for a, b in zip(fast.values, slow.values):
            assert a.shape == b.shape and (a.numel() == 0 or float((a - b).abs().max()) <= 1e-10), name
    assert {"example gpt2_conv1d", "example nanogpt_config", "layer wide"} <= at_once
    assert "example residual_inside" not in at_once and "example prenorm" not in at_once
