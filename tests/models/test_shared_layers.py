"""A module run in several layers with the same weights (ALBERT): one site per call, each its own layer.

A tiny random ALBERT of 4 layers over 2 layer groups (each attention module runs twice per forward) attaches
with 4 sites in call order, two per module. Its outputs equal transformers' SDPA model, its attentions eager's,
and its taps what it computes (float64); masking a head of one layer leaves the same head of the module's other
layer alone; pruning a head from every layer of a module equals masking it there, and pruning it from one alone
is refused in one line; a pruned and masked model saves and loads identical; the commands run on a checkpoint.
"""

from __future__ import annotations

import json

import pytest
import torch

import headlab
from headlab import heads
from tests.support.families import FAMILIES
from tests.support.reference import check_taps

transformers = pytest.importorskip("transformers")

MODULES = ["encoder.albert_layer_groups.0.albert_layers.0.attention",
           "encoder.albert_layer_groups.1.albert_layers.0.attention"]


def _build(implementation: str = "sdpa", dtype: torch.dtype = torch.float32, **changes):
    return FAMILIES["albert"].build(implementation, dtype, **changes)


def _ids() -> torch.Tensor:
    return torch.randint(3, 90, (2, 7), generator=torch.Generator().manual_seed(1))


def _hidden(model, **kwargs):
    with torch.no_grad():
        return model(_ids(), **kwargs)


def test_one_site_per_call_and_outputs_and_attentions_equal_transformers():
    handle = headlab.attach(_build())
    assert [(s.layer, s.name) for s in handle.sites] == [(0, MODULES[0]), (1, MODULES[0]), (2, MODULES[1]),
                                                          (3, MODULES[1])]
    assert handle.sites[0].module is handle.sites[1].module is not handle.sites[2].module
    torch.testing.assert_close(_hidden(handle.model).last_hidden_state, _hidden(_build()).last_hidden_state,
                               rtol=1e-5, atol=1e-5)
    got, want = _hidden(handle.model, output_attentions=True), _hidden(_build("eager"), output_attentions=True)
    assert len(got.attentions) == 4
    for ours, theirs in zip(got.attentions, want.attentions, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_taps_are_each_layers_own_in_float64():
    handle = headlab.attach(_build(dtype=torch.float64))
    cache = check_taps(handle, _ids())
    assert not torch.allclose(cache["pattern", 0], cache["pattern", 1])  # the same weights, another layer's input


def test_masking_is_per_layer_and_pruning_every_layer_of_a_module_equals_masking():
    handle = headlab.attach(_build())
    before = headlab.run_with_cache(handle, _ids(), take="z")
    heads.mask(handle, {0: [2]})
    after = headlab.run_with_cache(handle, _ids(), take="z")
    assert not after["z", 0][:, 2].any() and torch.equal(after["z", 0][:, [0, 1, 3]], before["z", 0][:, [0, 1, 3]])
    assert after["z", 1][:, 2].abs().sum() > 0  # the module's next layer keeps its head 2
    heads.mask(handle, {1: [2], 2: [0], 3: [0]})
    masked = _hidden(handle.model).last_hidden_state
    pruned = headlab.attach(_build())
    with pytest.raises(ValueError, match=r"layers \[0, 1\] run one attention module .* pruned from all of them or "
                                         r"none; layer 0 would lose heads \[2\] and layer 1 \[\]"):
        heads.prune(pruned, {0: [2]})
    assert pruned.n_heads == [4, 4, 4, 4]
    heads.prune(pruned, {0: [2], 1: [2], 2: [0], 3: [0]})
    assert pruned.n_heads == [3, 3, 3, 3] and pruned.sites[1].head_ids == [0, 1, 3]
    torch.testing.assert_close(_hidden(pruned.model).last_hidden_state, masked, rtol=1e-5, atol=1e-5)


def test_a_pruned_and_masked_model_saves_and_loads_identical(tmp_path):
    handle = headlab.attach(_build())
    heads.prune(handle, {2: [1], 3: [1]})
    heads.mask(handle, {1: [0]})
    loaded = headlab.load(heads.save(handle, tmp_path / "albert"))
    assert loaded.n_heads == [4, 4, 3, 3]
    assert torch.equal(_hidden(loaded.model).last_hidden_state, _hidden(handle.model).last_hidden_state)


def test_analyze_and_view_run_on_a_checkpoint(tmp_path):
    from typer.testing import CliRunner

    from headlab.cli import app
    from headlab.models import default_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    _build(vocab_size=len(tokenizer)).save_pretrained(tmp_path / "albert")
    tokenizer.save_pretrained(tmp_path / "albert")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat.\nHeads attend to words.\nA dog ran home, fast.\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "albert"), "--quick", "--no-syntax",
                                      "--text", str(corpus), "--json", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["heads"]) == 4 * 4
    result = CliRunner().invoke(app, ["view", str(tmp_path / "albert"), "The cat sat on the mat.",
                                      "--out", str(tmp_path / "view.html")])
    assert result.exit_code == 0, result.output
