"""Layers by name: every site's address (TransformerLens' names where it has them), by stack and kind, and the
selections, cache names and ``--layers`` that take them.

A model of one stack has ``blocks.{layer}.attn``; an encoder-decoder ``encoder.blocks.{i}.attn``,
``decoder.blocks.{i}.attn`` and ``decoder.blocks.{i}.cross_attn``, ``i`` counting the stack's sites of that kind.
A selection names layers by address, by stack or by pattern, mixed with indices; a name that names no layer is one
clear error; the cache takes addresses.
"""

from __future__ import annotations

import pytest
import torch

import headlab
from headlab import heads
from headlab.layer.selection import Heads, named_layers, resolve

transformers = pytest.importorskip("transformers")

CONFIGS = {"bart": lambda: transformers.BartConfig(vocab_size=64, d_model=16, encoder_layers=2, decoder_layers=2,
                                                  encoder_attention_heads=4, decoder_attention_heads=4,
                                                  encoder_ffn_dim=32, decoder_ffn_dim=32),
           "t5": lambda: transformers.T5Config(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4,
                                               decoder_start_token_id=0)}
BART = ["encoder.blocks.0.attn", "encoder.blocks.1.attn", "decoder.blocks.0.attn", "decoder.blocks.0.cross_attn",
        "decoder.blocks.1.attn", "decoder.blocks.1.cross_attn"]


def _build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(CONFIGS[name]()).eval()


def _inputs() -> dict[str, torch.Tensor]:
    return {"input_ids": torch.tensor([[5, 6, 7, 8, 9]]), "decoder_input_ids": torch.tensor([[5, 6, 7]])}


@pytest.mark.parametrize("name", CONFIGS)
def test_an_encoder_decoders_sites_are_named_by_stack_and_kind(name):
    handle = headlab.attach(_build(name))
    assert [site.address for site in handle.sites] == BART
    assert [(site.stack, site.block) for site in handle.sites] == [
        ("encoder", 0), ("encoder", 1), ("decoder", 0), ("decoder", 0), ("decoder", 1), ("decoder", 1)]
    assert "address='decoder.blocks.0.cross_attn'" in repr(handle.sites[3])


def test_a_model_of_one_stack_keeps_transformerlens_names():
    from tests.support.tiny import built

    handle = headlab.attach(built("llama"))
    assert [site.address for site in handle.sites] == ["blocks.0.attn", "blocks.1.attn"]
    assert all(site.stack == "" for site in handle.sites) and "address" not in repr(handle.sites[0])


def test_names_resolve_by_address_stack_and_pattern():
    n_heads = [4] * 6
    assert named_layers("decoder", BART) == [2, 3, 4, 5]
    assert named_layers("decoder.blocks.1", BART) == [4, 5]
    assert named_layers("*.cross_attn", BART) == [3, 5]
    assert resolve(Heads(layers=["encoder.blocks.1.attn", 5], heads=[0]), n_heads, BART) == {1: [0], 5: [0]}
    assert resolve({"decoder.blocks.*.cross_attn": [1, 2], 0: None}, n_heads, BART) == {
        0: [0, 1, 2, 3], 3: [1, 2], 5: [1, 2]}
    assert resolve([("encoder", 3)], n_heads, BART) == {0: [3], 1: [3]}
    with pytest.raises(ValueError, match=r"layers has 'encoder.blocks.7.attn', which names no layer: expected a "
                                         r"layer 0..5, an address such as 'encoder.blocks.0.attn', "
                                         r"'decoder.blocks.1.cross_attn'"):
        resolve(Heads(layers=["encoder.blocks.7.attn"]), n_heads, BART)
    with pytest.raises(TypeError, match=r"layers has 'encoder', but these layers have no names"):
        resolve(Heads(layers=["encoder"]), n_heads)


def test_interventions_and_the_cache_take_names():
    handle = headlab.attach(_build("bart"))
    assert handle.heads({"decoder.blocks.*.cross_attn": [2]}) == {3: [2], 5: [2]}
    heads.mask(handle, {"*.cross_attn": [2]})
    assert [site.scale is not None for site in handle.sites] == [False, False, False, True, False, True]
    cache = headlab.run_with_cache(handle, _inputs(), take="z", heads=Heads(layers=["decoder.blocks.0"]))
    assert cache.keys() == ["decoder.blocks.0.attn.z", "decoder.blocks.0.cross_attn.z"]
    assert torch.equal(cache["decoder.blocks.0.cross_attn.z"], cache["z", 3])
    assert torch.equal(cache["blocks.3.attn.z"], cache["z", 3])  # by the layer's index, in every model
    assert not cache["z", 3][:, 2].any()
    with pytest.raises(KeyError, match=r"'decoder.blocks.0.bogus' is not a cache name; expected "
                                       r"'encoder.blocks.0.attn.<name>'"):
        cache["decoder.blocks.0.bogus"]
