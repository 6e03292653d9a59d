"""Save an intervened or pruned model; headlab.load gives it back identical."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import headlab
from headlab import heads
from headlab.models import HeadedModel, headed
from tests.support.tiny import batch, built, first_output


def _run(model):
    ids, mask = batch(padding="left")
    with torch.no_grad():
        return first_output(model(input_ids=ids, attention_mask=mask))[mask.bool()]


def _loaded(kind):
    return HeadedModel(model=headlab.attach(built(kind, attn_implementation="sdpa")).model, tokenizer=None,
                       source="tiny")


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_round_trip_of_a_pruned_and_intervened_model(tmp_path, kind):
    loaded = _loaded(kind)
    heads.prune(loaded, [(0, 1), (1, 2), (1, 3)])
    heads.scale(loaded, [(0, 0)], 0.5)
    site = headed(loaded).sites[1]
    heads.mean_ablate(loaded, [(1, 0)], {1: torch.randn(site.n_heads, site.d_head_v)})
    heads.save(loaded, tmp_path)

    record = json.loads((tmp_path / "headlab.json").read_text())
    assert [entry["head_ids"] for entry in record["layers"]] == [[0, 2, 3], [0, 1]]
    assert {(r["layer"], r["head"], r["kind"]) for r in record["interventions"]} == {(0, 0, "scaled"),
                                                                                      (1, 0, "mean-ablated")}
    again = headlab.load(tmp_path)
    assert [s.head_ids for s in headed(again).sites] == [[0, 2, 3], [0, 1]]
    assert [s.kv_head_of for s in headed(again).sites] == [s.kv_head_of for s in headed(loaded).sites]
    assert heads.summary(again) == heads.summary(loaded)
    torch.testing.assert_close(_run(again.model), _run(loaded.model), atol=0, rtol=0)


def test_an_unpruned_save_is_an_ordinary_checkpoint(tmp_path):
    loaded = _loaded("llama")
    heads.mask(loaded, [(0, 1)])
    heads.save(loaded, tmp_path)
    plain = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa").eval()
    heads.restore(loaded)
    torch.testing.assert_close(_run(plain), _run(loaded.model), atol=0, rtol=0)  # weights untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "headlab.json", "headlab.safetensors",
                                                           "model.safetensors"]


def test_saving_the_real_minilm_keeps_its_tokenizer(tmp_path):
    loaded = headlab.load()
    heads.mask(loaded, {2: [0, 5]})
    heads.save(loaded, tmp_path)
    again = headlab.load(tmp_path)
    enc = again.tokenizer(["Heads are first-class.", "A longer second sentence, with padding."], padding=True,
                          return_tensors="pt")
    with torch.no_grad():
        a, b = loaded.model(**enc).last_hidden_state, again.model(**enc).last_hidden_state
    torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("record, message", [
    ('{"format": "something else"}', "headlab.json: expected a JSON object with format"),
    ('{"format": "headlab-model/1", "layers": []}', "saved by an older headlab"),
    ("not json", "not a readable headlab record"),
    ('{"format": "headlab-model/2", "layers": []}', "saved by an older headlab"),
    ('{"format": "headlab-model/3", "layers": [{"layer": 7, "name": "encoder.layer.7.attention.self", '
     '"head_ids": [0]}]}', "layer 7 names module 'encoder.layer.7.attention.self'"),
    ('{"format": "headlab-model/3", "layers": [{"layer": 0, "name": "encoder.layer.0.attention.self", '
     '"head_ids": [9]}]}', r"head_ids \[9\] are not heads of its 4"),
])
def test_a_broken_record_is_named(tmp_path, record, message):
    heads.save(_loaded("bert"), tmp_path)
    (tmp_path / "headlab.json").write_text(record)
    with pytest.raises(ValueError, match=message):
        headlab.load(tmp_path)


def test_broken_interventions_are_named(tmp_path):
    from safetensors.torch import save_file

    heads.save(_loaded("bert"), tmp_path)
    save_file({"layers.0.scale": torch.ones(3)}, str(tmp_path / "headlab.safetensors"))
    with pytest.raises(ValueError, match=r"headlab.safetensors: layer 0: scale has shape \(3,\); expected \(4,\)"):
        headlab.load(tmp_path)
    save_file({"something": torch.ones(3)}, str(tmp_path / "headlab.safetensors"))
    with pytest.raises(ValueError, match="unexpected tensor 'something'"):
        headlab.load(tmp_path)


def test_a_config_that_asks_for_attentions_saves_and_loads(tmp_path):
    from tests.support.tiny import build

    model = headlab.attach(build("gpt2", output_attentions=True)).model  # as a checkpoint's config.json may say
    heads.save(HeadedModel(model=model, tokenizer=None, source="tiny"), tmp_path)
    again = headlab.load(tmp_path)
    ids, mask = batch(padding="left")
    with torch.no_grad():
        out = again.model(input_ids=ids, attention_mask=mask)
    assert again.model.config.output_attentions and len(out.attentions) == 2


def test_an_attached_model_saves_without_a_wrapper(tmp_path):
    model = headlab.attach(built("bert", attn_implementation="sdpa")).model
    heads.mask(model, [(1, 2)])
    heads.save(model, tmp_path)
    again = headlab.load(tmp_path)
    assert json.loads((tmp_path / "headlab.json").read_text())["source"] == "in memory"
    assert heads.summary(again) == heads.summary(model) and again.tokenizer is None
    torch.testing.assert_close(_run(again.model), _run(model), atol=0, rtol=0)


def test_a_pruned_model_loads_without_the_unpruned_weights(tmp_path, monkeypatch):
    # Every parameter the architecture registers is on the meta device; the only real ones are the file's, of the
    # pruned shapes: the unpruned weights are never allocated nor initialised.
    loaded = _loaded("llama")
    heads.prune(loaded, [(0, 1), (1, 2), (1, 3)])
    heads.save(loaded, tmp_path)
    saved = {tuple(p.shape) for p in loaded.model.parameters()}
    registered: list[tuple[tuple[int, ...], bool]] = []
    register = torch.nn.Module.register_parameter

    def spy(module, name, parameter):
        if parameter is not None:
            registered.append((tuple(parameter.shape), parameter.is_meta))
        register(module, name, parameter)

    monkeypatch.setattr(torch.nn.Module, "register_parameter", spy)
    again = headlab.load(tmp_path)
    real = {shape for shape, meta in registered if not meta}
    assert registered and real <= saved and any(meta for _, meta in registered)
    unpruned = tuple(headed(_loaded("llama")).sites[0].module.q_proj.weight.shape)
    assert unpruned not in real and unpruned != tuple(headed(again).sites[0].module.q_proj.weight.shape)
    torch.testing.assert_close(_run(again.model), _run(loaded.model), atol=0, rtol=0)
