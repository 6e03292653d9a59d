"""Direct logit attribution: the parts (every head, rest, bias) sum to the model's own logit difference at every
position, a head's part equals the math done by hand in float64, the final norm's form is recognised (LayerNorm,
RMSNorm, Gemma's 1 + weight, none) or refused by name, and bad calls get clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import headlab
from headlab.capture.cache import run_with_cache
from headlab.circuits.logit import LogitAttribution, direct_logit_attribution, plot_logit_attribution
from headlab.experiments.model import TinyTransformer
from headlab.layer import AttentionConfig
from headlab.models.stream import stream_of
from tests.support.tiny import ARCHITECTURES, VOCAB, built, tiny, tiny_config

CAUSAL = [name for name, a in ARCHITECTURES.items() if a.causal]
ANSWER, WRONG = 5, 7


def _ids(batch: int = 2, length: int = 6) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, length), generator=torch.Generator().manual_seed(4))


def _own(model: nn.Module, inputs: torch.Tensor, answer: int = ANSWER, wrong: int = WRONG) -> np.ndarray:
    """The model's own logit difference per position, mean over the batch."""
    with torch.no_grad():
        logits = model(inputs).logits
    return (logits[..., answer] - logits[..., wrong]).mean(0).double().numpy()


def _tiny_transformer(final_norm: nn.Module | None = None) -> TinyTransformer:
    torch.manual_seed(0)
    model = TinyTransformer(vocab_sizes=[11], n_classes=5, max_len=12,
                            layers=[AttentionConfig(d_model=16, n_heads=4),
                                    AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2)]).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # norms' weights and biases away from 1 and 0
    if final_norm is not None:
        model.final_norm = final_norm
    return model


@pytest.mark.parametrize(("name", "form"), [("gpt2", "LayerNorm (mean removed), weight, bias"),
                                            ("llama", "RMSNorm, weight,"), ("gemma", "RMSNorm, 1 + weight")])
def test_parts_sum_to_the_models_logit_difference_at_every_position(name, form):
    model = built(name)
    ids = _ids()
    result = direct_logit_attribution(headlab.attach(model), ids, (ANSWER, WRONG))
    own = _own(model, ids)
    assert result.positions == list(range(6)) and result.contributions.shape == (8, 6)
    assert np.abs(result.total - own).max() < 1e-4
    assert np.abs(result.logit_diff - own).max() < 1e-4 and result.error < 1e-4
    assert form in result.norm
    assert np.abs(result.contributions).max() > 1e-3  # heads do contribute: the test is not 0 = 0


def test_a_tiny_transformer_sums_too():
    model = _tiny_transformer()
    inputs = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(1))
    result = direct_logit_attribution(headlab.attach(model), inputs, (1, 3))
    assert np.abs(result.total - _own(model, inputs, 1, 3)).max() < 1e-4
    assert len(result.heads) == 8 and "LayerNorm (mean removed)" in result.norm


@pytest.mark.parametrize("name", CAUSAL)
def test_every_causal_architecture_runs(name):
    model = built(name)
    ids = _ids(batch=1, length=5)
    result = direct_logit_attribution(headlab.attach(model), ids, (ANSWER, WRONG), positions=[-1])
    assert result.positions == [4] and result.error < 1e-4
    if getattr(model.config, "final_logit_softcapping", None):
        # Gemma 2 soft-caps its logits: the parts are the unembedding's output, before the cap; the note says so.
        assert "final_logit_softcapping" in result.note
        with torch.no_grad():
            raw = model.lm_head(model.model(ids).last_hidden_state)[0, -1]
        assert abs(result.total[-1] - float(raw[ANSWER] - raw[WRONG])) < 1e-4
        assert abs(result.total[-1] - _own(model, ids)[-1]) > 1e-3  # the cap does change it
    else:
        assert result.note == "" and abs(result.total[-1] - _own(model, ids)[-1]) < 1e-4


@pytest.mark.parametrize("name", ["gpt2", "gemma"])
def test_one_heads_part_equals_the_math_by_hand_in_float64(name):
    model = built(name)
    handle = headlab.attach(model)
    ids = _ids(batch=1)
    layer, head = 1, 2
    result = direct_logit_attribution(handle, ids, (ANSWER, WRONG))
    stream = stream_of(handle, handle.inputs(ids))
    record: dict = {}
    with stream.hooked(record=record):
        cache = run_with_cache(handle, ids, take="result", heads={layer: [head]})
    c = cache["result", layer, head][0].double()  # (pos, d_model)
    x = record["final"][0].double()
    norm = stream.final_norm
    u = (model.lm_head.weight[ANSWER] - model.lm_head.weight[WRONG]).double()
    if name == "gpt2":  # LayerNorm: centre, divide by the run's standard deviation, times the weight
        scale = 1 / torch.sqrt(x.var(-1, unbiased=False) + norm.eps)
        expected = scale * ((c - c.mean(-1, keepdim=True)) @ (norm.weight.double() * u))
    else:  # Gemma's RMSNorm: divide by the run's root mean square, times 1 + weight
        scale = 1 / torch.sqrt(x.pow(2).mean(-1) + norm.eps)
        expected = scale * (c @ ((1 + norm.weight.double()) * u))
    row = result.heads.index((layer, head))
    assert np.allclose(result.contributions[row], expected.detach().numpy(), atol=1e-5)


@pytest.mark.parametrize(("norm", "form"), [(nn.RMSNorm(16), "RMSNorm, weight, eps 1.19e-07"),
                                            (nn.LayerNorm(16, elementwise_affine=False), "mean removed), eps"),
                                            (nn.Identity(), "none")])
def test_other_final_norms_are_recognised(norm, form):
    model = _tiny_transformer(norm)
    inputs = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(2))
    result = direct_logit_attribution(headlab.attach(model), inputs, (0, 4))
    assert form in result.norm
    assert np.abs(result.total - _own(model, inputs, 0, 4)).max() < 1e-4


class CubeNorm(nn.Module):
    """A "norm" of no form headlab knows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / x.pow(3).mean(-1, keepdim=True).abs().pow(1 / 3).add(1e-5)


def test_a_final_norm_of_no_known_form_is_refused_by_name():
    model = _tiny_transformer(CubeNorm())
    tried = r"final norm final_norm \(CubeNorm\).*with eps 1e-05 or 1e-06 or 1e-12 or 1e-08: .*RMSNorm: 2\.1e-01"
    with pytest.raises(ValueError, match=tried):
        direct_logit_attribution(headlab.attach(model), torch.zeros(1, 4, dtype=torch.long), (0, 1))


def test_selected_heads_keep_their_parts_and_the_others_join_rest():
    model = built("llama")
    handle = headlab.attach(model)
    ids = _ids()
    every = direct_logit_attribution(handle, ids, (ANSWER, WRONG))
    some = direct_logit_attribution(handle, ids, (ANSWER, WRONG), heads={1: [0, 3]}, positions=[0, -1])
    assert some.heads == [(1, 0), (1, 3)] and some.positions == [0, 5]
    rows = [every.heads.index(h) for h in some.heads]
    assert np.allclose(some.contributions, every.contributions[rows][:, [0, 5]], atol=1e-6)
    others = np.delete(every.contributions, rows, axis=0).sum(0)[[0, 5]]
    assert np.allclose(some.rest, every.rest[[0, 5]] + others, atol=1e-5)


def test_directions_as_tensors_per_item_pairs_and_texts():
    model = built("gpt2")
    handle = headlab.attach(model)
    ids = _ids()
    pair = direct_logit_attribution(handle, ids, (ANSWER, WRONG))
    vector = torch.zeros(VOCAB)
    vector[ANSWER], vector[WRONG] = 1.0, -1.0
    assert np.allclose(direct_logit_attribution(handle, ids, vector).contributions, pair.contributions, atol=1e-6)
    per_item = direct_logit_attribution(handle, ids, ([ANSWER, 9], [WRONG, 11]))
    first = direct_logit_attribution(handle, ids[:1], (ANSWER, WRONG))
    second = direct_logit_attribution(handle, ids[1:], (9, 11))
    assert np.allclose(per_item.contributions, (first.contributions + second.contributions) / 2, atol=1e-6)
    worded = tiny("gpt2")
    by_text = direct_logit_attribution(worded, ["the cat sat", "a dog ran"], ("cat", "dog"))
    cat, dog = worded.tokenizer.convert_tokens_to_ids(["cat", "dog"])
    by_id = direct_logit_attribution(worded, ["the cat sat", "a dog ran"], (cat, dog))
    assert np.allclose(by_text.contributions, by_id.contributions)
    assert by_text.direction == "logit('cat') − logit('dog')"
    assert by_text.tokens is not None and by_text.tokens[-1] == "[SEP]"


def test_bad_calls_are_refused_clearly():
    with pytest.raises(ValueError, match=r"BertModel: direct logit attribution needs logits.*no unembedding"):
        direct_logit_attribution(headlab.attach(built("bert")), _ids(), (ANSWER, WRONG))
    masked_lm = pytest.importorskip("transformers").AutoModelForMaskedLM.from_config(tiny_config("bert")).eval()
    with pytest.raises(ValueError, match=r"BertForMaskedLM has heads that see later tokens \(an encoder\)"):
        direct_logit_attribution(headlab.attach(masked_lm), _ids(), (ANSWER, WRONG))
    handle = headlab.attach(built("gpt2"))
    ids = _ids()
    with pytest.raises(ValueError, match="padded"):
        direct_logit_attribution(handle, {"input_ids": ids, "attention_mask": torch.tensor([[1] * 6, [0] + [1] * 5])},
                                 (ANSWER, WRONG))
    with pytest.raises(ValueError, match=r"positions=\[6\]"):
        direct_logit_attribution(handle, ids, (ANSWER, WRONG), positions=[6])
    with pytest.raises(ValueError, match=r"token 100: expected an id in \[0, 100\)"):
        direct_logit_attribution(handle, ids, (ANSWER, VOCAB))
    with pytest.raises(ValueError, match=r"\(vocab,\) = \(100,\)"):
        direct_logit_attribution(handle, ids, torch.ones(3))
    with pytest.raises(ValueError, match="'the cat' is 2 tokens"):
        direct_logit_attribution(tiny("gpt2"), "a dog ran", ("the cat", "dog"))
    with pytest.raises(ValueError, match="no tokenizer"):
        direct_logit_attribution(handle, ids, ("cat", "dog"))


def test_the_result_shows_itself_and_writes_json_and_plots(tmp_path):
    result = direct_logit_attribution(headlab.attach(built("gpt2")), _ids(), (ANSWER, WRONG))
    assert isinstance(result, LogitAttribution)
    table = result.table()
    assert table.heads == result.heads and np.allclose(table["contribution"], result.contributions[:, -1])
    assert np.allclose(result.table(2)["contribution"], result.contributions[:, 2])
    with pytest.raises(ValueError, match="position 9 was not read"):
        result.table(9)
    text = repr(result)
    assert text.startswith("LogitAttribution: 8 heads × 6 positions, logit(5) − logit(7)")
    assert "at position 5: model" in text and "largest |head|" in text
    assert "<table" in result._repr_html_()
    data = json.loads(json.dumps(result.to_dict()))
    assert data["heads"][0] == [0, 0] and len(data["contributions"]) == 8 and len(data["rest"]) == 6
    for by_position in (False, True):
        path = plot_logit_attribution(result, tmp_path / f"dla-{by_position}.png", by_position=by_position)
        assert path.read_bytes().startswith(b"\x89PNG")
    some = direct_logit_attribution(headlab.attach(built("gpt2")), _ids(), (ANSWER, WRONG), positions=[1, 3])
    assert np.allclose(some.table()["contribution"], some.contributions[:, 1])  # the last position read
    assert plot_logit_attribution(some, tmp_path / "some.png", position=1).is_file()
