"""Save an intervened or pruned model; headlab.load gives it back identical."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

import headlab
from headlab import heads
from headlab.interop import swap
from headlab.models import LoadedModel, attention_layers, attention_modules
from tests.interop.hf_models import batch, build, config, first_output


def _run(model):
    ids, mask = batch(padding="left")
    with torch.no_grad():
        return first_output(model(input_ids=ids, attention_mask=mask))[mask.bool()]


@pytest.mark.parametrize("kind", ["bert", "llama"])
def test_round_trip_of_a_pruned_and_intervened_model(tmp_path, kind):
    model_class = transformers.BertModel if kind == "bert" else transformers.LlamaForCausalLM
    model = swap(build(model_class, config(kind), attn_implementation="sdpa"))
    heads.prune(model, [(0, 1), (1, 2), (1, 3)])
    heads.scale(model, [(0, 0)], 0.5)
    layer = attention_layers(model)[1]
    heads.mean_ablate(model, [(1, 0)], {1: torch.randn(layer.config.n_heads, layer.config.d_head_v)})
    loaded = LoadedModel(model=model, tokenizer=None, source="tiny", family=kind)
    heads.save(loaded, tmp_path)

    record = json.loads((tmp_path / "headlab.json").read_text())
    assert [entry["head_ids"] for entry in record["layers"]] == [[0, 2, 3], [0, 1]]
    assert {(r["layer"], r["head"], r["kind"]) for r in record["interventions"]} == {(0, 0, "scaled"),
                                                                                      (1, 0, "mean-ablated")}
    again = headlab.load(tmp_path)
    assert [m.head_ids for m in attention_modules(again.model)] == [[0, 2, 3], [0, 1]]
    assert heads.summary(again.model) == heads.summary(model)
    torch.testing.assert_close(_run(again.model), _run(model), atol=0, rtol=0)


def test_saving_the_real_minilm_keeps_its_tokenizer(tmp_path):
    loaded = headlab.load()
    heads.mask(loaded.model, {2: [0, 5]})
    heads.save(loaded, tmp_path)
    again = headlab.load(tmp_path)
    enc = again.tokenizer(["Heads are first-class.", "A longer second sentence, with padding."], padding=True,
                          return_tensors="pt")
    with torch.no_grad():
        a, b = loaded.model(**enc).last_hidden_state, again.model(**enc).last_hidden_state
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_a_broken_record_is_named(tmp_path):
    model = swap(build(transformers.BertModel, config("bert"), attn_implementation="sdpa"))
    heads.save(LoadedModel(model=model, tokenizer=None, source="tiny", family="bert"), tmp_path)
    (tmp_path / "headlab.json").write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="headlab.json: expected a JSON object with format"):
        headlab.load(tmp_path)
