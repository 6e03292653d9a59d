"""The adapter registry: dispatch by config class, clear refusals, layer order, lazy imports."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

from headlab.interop import export, supported, swap, swapped_layers, swapped_modules  # noqa: E402
from headlab.interop.hf_registry import FAMILIES, adapter_for, family_of  # noqa: E402
from tests.interop.hf_models import build, config  # noqa: E402


@pytest.mark.parametrize("make", [
    lambda: transformers.T5Model(transformers.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                                       num_heads=4)),
    lambda: transformers.ViTModel(transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                         intermediate_size=64, image_size=8, patch_size=4)),
], ids=["t5", "vit"])
def test_unsupported_architecture_lists_the_supported_ones(make):
    model = make()
    name = type(model.config).__name__
    with pytest.raises(ValueError, match=name) as info:
        swap(model)
    for family in FAMILIES.values():
        assert f"{family.config_class} ({family.model_type})" in str(info.value)
    with pytest.raises(ValueError, match="supported: BertConfig"):
        export(model)


def test_every_registered_family_imports_and_has_the_adapter_functions():
    for family in FAMILIES.values():
        adapter = adapter_for(getattr(transformers, family.config_class)())
        assert all(callable(getattr(adapter, name)) for name in ("swap", "export", "swapped"))
    assert "Qwen2Config (qwen2)" in supported()


def test_a_config_subclass_finds_its_family():
    class MyBertConfig(transformers.BertConfig):
        pass

    assert family_of(MyBertConfig()).config_class == "BertConfig"


def test_swapped_modules_are_in_layer_order():
    model = build(transformers.GPT2Model, config("gpt2", n_layer=4))
    assert swapped_modules(model) == []
    swap(model)
    assert [m.layer_index for m in swapped_modules(model)] == [0, 1, 2, 3]
    assert swapped_layers(model) == [m.attn for m in swapped_modules(model)]


def test_a_mask_that_is_not_4d_is_refused_clearly():
    model = swap(build(transformers.BertModel, config("bert")))
    module = swapped_modules(model)[0]
    with pytest.raises(ValueError, match="4-D attention mask"):
        module(torch.randn(2, 5, 32), torch.ones(2, 5, dtype=torch.bool))


def test_headlab_interop_and_models_do_not_import_transformers():
    code = ("import sys, headlab.interop, headlab.models; "
            "assert 'transformers' not in sys.modules, sorted(m for m in sys.modules if 'transformers' in m)")
    subprocess.run([sys.executable, "-c", code], check=True)
