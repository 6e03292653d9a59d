"""The seat of a headlab layer in a Hugging Face model: masks, cache view, taps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from headlab.interop.hf_attention import HFCache, SwappedAttention, Tap
from headlab.layer import AttentionConfig, MultiHeadAttention


def _seat():
    torch.manual_seed(0)
    return SwappedAttention(MultiHeadAttention(AttentionConfig(d_model=8, n_heads=2)), layer_index=3)


def test_bool_masks_mean_attend_and_float_masks_add():
    seat, x = _seat(), torch.randn(2, 4, 8)
    keep = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    keep[1, ..., 2:] = False  # Hugging Face: False = masked
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[1, 2:] = True  # headlab: True = padding
    want = seat.attn(x, key_padding_mask=pad)
    torch.testing.assert_close(seat.attend(x, attention_mask=keep), want)
    additive = torch.zeros(2, 1, 4, 4).masked_fill(~keep, torch.finfo(torch.float32).min)
    torch.testing.assert_close(seat.attend(x, attention_mask=additive), want)


@pytest.mark.parametrize("mask", [torch.ones(2, 4), torch.ones(4, 4, dtype=torch.bool), "mask"])
def test_other_masks_are_refused_naming_the_layer(mask):
    with pytest.raises(ValueError, match="layer 3: expected a 4-D attention mask"):
        _seat().attend(torch.randn(2, 4, 8), attention_mask=mask)


def test_a_tap_receives_only_what_it_asks_for():
    seat, received = _seat(), []
    seat.tap = Tap(sink=lambda layer, out: received.append((layer, out)), patterns=[1], z=[0, 1])
    out = seat.attend(torch.randn(2, 4, 8))
    (layer, got), = received
    assert layer == 3 and got.patterns.shape == (2, 1, 4, 4) and got.z.shape == (2, 2, 4, 4)
    assert got.head_outputs is None and torch.equal(out, got.output)


def test_cache_view_reports_the_keys_the_next_update_shows():
    class SlidingCache:  # keeps the last 3 positions, like a sliding-window layer with window 4
        def get_mask_sizes(self, query_len, layer_idx):
            return 3 + query_len, 0

        def get_seq_length(self, layer_idx):
            return 10

    view = HFCache(SimpleNamespace(self_attention_cache=SlidingCache()), layer_index=0, query_len=1)
    assert view.length == 3  # not the 10 positions seen
    plain = SimpleNamespace(get_seq_length=lambda layer_idx: 7)
    assert HFCache(plain, layer_index=0, query_len=2).length == 7


def test_a_head_mask_on_the_seat_gates_heads_and_carries_gradients():
    seat, x = _seat(), torch.randn(2, 4, 8)
    gate = torch.tensor([1.0, 0.0], requires_grad=True)
    seat.head_mask = gate
    out = seat.attend(x)
    torch.testing.assert_close(out, seat.attn(x, head_mask=gate.detach()))
    out.sum().backward()
    contributions = seat.attn(x, return_head_outputs=True).head_outputs.sum(dim=(0, 2, 3))
    torch.testing.assert_close(gate.grad, contributions.detach())
