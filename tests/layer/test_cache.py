"""Incremental decoding with the kv cache equals the full causal pass."""

from __future__ import annotations

import pytest
import torch

from headlab import AttentionConfig, KVCache, MultiHeadAttention
from tests.support.reference import layer_reference

CONFIGS = {
    "standard": dict(d_model=32, n_heads=4, causal=True),
    "grouped-query rotary": dict(d_model=32, n_heads=8, n_kv_heads=2, rotary=True, causal=True),
    "d_head_v independent": dict(d_model=24, n_heads=3, d_head=5, d_head_v=7, causal=True, rotary=True, rotary_dim=4),
}


def _layer(opts):
    layer = MultiHeadAttention(AttentionConfig(**opts)).double()
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "bias" in name:
                p.normal_(0, 0.5)
    return layer


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("chunks", [[1] * 9, [4, 1, 1, 3], [9]], ids=["token-by-token", "prefill+steps", "one-go"])
def test_decoding_equals_full_causal_pass(name, chunks):
    layer = _layer(CONFIGS[name])
    x = torch.randn(2, sum(chunks), layer.config.d_model, dtype=torch.float64)
    full = layer(x, return_pattern=True)
    cache = layer.new_kv_cache(batch_size=2, max_len=16)
    outputs, start = [], 0
    for n in chunks:
        step = layer(x[:, start : start + n], kv_cache=cache, return_pattern=True)
        # each step's pattern rows are the full pass's rows for those queries, over the keys so far
        torch.testing.assert_close(step.pattern, full.pattern[:, :, start : start + n, : start + n],
                                   atol=1e-12, rtol=0)
        outputs.append(step.output)
        start += n
    assert cache.length == sum(chunks)
    torch.testing.assert_close(torch.cat(outputs, dim=1), full.output, atol=1e-12, rtol=0)


def test_decoding_with_key_padding_matches_reference():
    layer = _layer(CONFIGS["grouped-query rotary"])
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    kpm = torch.zeros(2, 6, dtype=torch.bool)
    kpm[1, :2] = True  # left padding
    cache = layer.new_kv_cache(batch_size=2, max_len=6)
    first = layer(x[:, :4], kv_cache=cache, key_padding_mask=kpm[:, :4])
    second = layer(x[:, 4:], kv_cache=cache, key_padding_mask=kpm)
    expected = layer_reference(layer, x, key_padding_mask=kpm)[0]
    torch.testing.assert_close(torch.cat([first, second], dim=1), expected, atol=1e-10, rtol=1e-10)
    live = torch.ones(2, 6, dtype=torch.bool)
    live[1, :2] = False  # rows 0 and 1 of sequence 1 see only padding: output = b_O
    torch.testing.assert_close(first[1, :2], layer.b_O.detach().expand(2, -1))


def test_cache_reset_and_views():
    layer = _layer(CONFIGS["standard"])
    cache = layer.new_kv_cache(batch_size=1, max_len=4)
    assert isinstance(cache, KVCache) and cache.keys.dtype == torch.float64
    x = torch.randn(1, 3, 32, dtype=torch.float64)
    a = layer(x, kv_cache=cache)
    cache.reset()
    assert cache.length == 0
    torch.testing.assert_close(layer(x, kv_cache=cache), a)
