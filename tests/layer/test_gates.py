"""The per-call gates of a head's z and inputs (headlab.layer.gates): replacements of some heads at every position
or at some, additive deltas, and their refusals; and both attentions (transformers' through headlab's function,
headlab's own layer) applying an input replacement before the weights are computed."""

from __future__ import annotations

import pytest
import torch

import headlab
from headlab.capture.cache import run_with_cache
from headlab.heads.scoped import intervening
from headlab.layer.gates import Replacement, gate_input
from tests.support.tiny import build


def test_a_replacement_sets_its_heads_at_its_positions_only():
    x = torch.randn(2, 4, 5, 3)  # (batch, heads, positions, d)
    values = torch.randn(2, 2, 2, 3)
    out = Replacement(torch.tensor([1, 3]), values, torch.tensor([0, 4])).apply(x, what="q")
    expected = x.clone()
    expected[:, 1][:, [0, 4]] = values[:, 0]
    expected[:, 3][:, [0, 4]] = values[:, 1]
    assert torch.equal(out, expected)
    whole = Replacement(torch.tensor([2]), torch.zeros(2, 1, 5, 3)).apply(x, what="q")
    assert torch.equal(whole[:, 2], torch.zeros(2, 5, 3)) and torch.equal(whole[:, [0, 1, 3]], x[:, [0, 1, 3]])


def test_a_delta_adds_and_nothing_set_leaves_the_tensor():
    x = torch.randn(1, 2, 3, 4)
    assert gate_input(x, what="k") is x
    delta = torch.randn_like(x)
    assert torch.equal(gate_input(x, delta=delta, what="k"), x + delta)


def test_mismatches_are_refused_with_the_shapes():
    x = torch.randn(2, 4, 5, 3)
    with pytest.raises(ValueError, match=r"replacement v has shape \(2, 1, 4, 3\); this call needs \(2, 1, 5, 3\)"):
        Replacement(torch.tensor([0]), torch.zeros(2, 1, 4, 3)).apply(x, what="v")
    with pytest.raises(ValueError, match=r"replacement q sets position 7; this call has 5 positions"):
        Replacement(torch.tensor([0]), torch.zeros(2, 1, 1, 3), torch.tensor([7])).apply(x, what="q")
    with pytest.raises(ValueError, match=r"the k delta has shape \(1, 4, 5, 3\); this call's k is \(2, 4, 5, 3\)"):
        gate_input(x, delta=torch.zeros(1, 4, 5, 3), what="k")


@pytest.mark.parametrize("model", ["llama", "tiny"])
def test_both_attentions_read_a_replaced_key(model):
    """A key/value head's key replaced at one position: what the taps see, and the pattern computed from it."""
    if model == "llama":
        handle = headlab.attach(build("llama"))  # 4 query heads read 2 key/value heads
        inputs = torch.randint(3, 100, (1, 6))
    else:
        from headlab.experiments.model import TinyTransformer
        from headlab.layer import AttentionConfig

        handle = headlab.attach(TinyTransformer(vocab_sizes=[20], n_classes=20, max_len=8, layers=[
            AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2)] * 2))
        inputs = torch.randint(0, 20, (1, 6))
    plain = run_with_cache(handle, inputs, take=("k", "pattern"))
    d_head = plain["k", 1, 0].shape[-1]
    new = torch.randn(1, 1, 1, d_head)
    with intervening(handle) as sites:
        sites[1].input_replacements = {"k": Replacement(torch.tensor([0]), new, torch.tensor([2]))}
        replaced = run_with_cache(handle, inputs, take=("k", "pattern"))
    for head in (0, 1):  # the query heads of key/value head 0 both read the new key
        expected = plain["k", 1, head].clone()
        expected[:, 2] = new[0, 0, 0]
        assert torch.allclose(replaced["k", 1, head], expected)
        assert not torch.allclose(replaced["pattern", 1, head], plain["pattern", 1, head])
    for head in (2, 3):  # key/value head 1's query heads are untouched
        assert torch.allclose(replaced["pattern", 1, head], plain["pattern", 1, head])
    assert torch.allclose(replaced["pattern", 0, 0], plain["pattern", 0, 0])  # and so is layer 0
