"""Encoder-decoder models attach exactly: tiny random BART, Marian and T5 (whose relative position bias is added to
every score), their encoder's self-attention, the
decoder's causal self-attention and its cross-attention (queries over target positions, keys and values over
the source's), one site per module in the order they run.

For each: the sites say which is which; with nothing asked the attached model's output equals the plain SDPA
model's; ``output_attentions`` (encoder, decoder and cross) equal eager's; tapped patterns, z and results equal
what the model computes (float64); masking a cross head zeroes its z alone; pruning it equals masking it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import headlab
from headlab import heads
from tests.support.families import FAMILIES
from tests.support.reference import check_taps

transformers = pytest.importorskip("transformers")

BART_SITES = ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn", "decoder.layers.0.self_attn",
              "decoder.layers.0.encoder_attn", "decoder.layers.1.self_attn", "decoder.layers.1.encoder_attn"]
T5_SITES = ["encoder.block.0.layer.0.SelfAttention", "encoder.block.1.layer.0.SelfAttention",
            "decoder.block.0.layer.0.SelfAttention", "decoder.block.0.layer.1.EncDecAttention",
            "decoder.block.1.layer.0.SelfAttention", "decoder.block.1.layer.1.EncDecAttention"]
MODELS = {"bart": BART_SITES, "marian": BART_SITES, "t5": T5_SITES}  # T5: a relative position bias on every score
KINDS = [("self", False), ("self", False), ("self", True), ("cross", False), ("self", True), ("cross", False)]
CROSS = 3  # the first cross-attention site


def _build(name: str, implementation: str = "sdpa", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return FAMILIES[name].build(implementation, dtype)


def _inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(3, 100, (2, 7), generator=generator),
            "decoder_input_ids": torch.randint(3, 100, (2, 5), generator=generator)}


def _output(model: torch.nn.Module, **kwargs: Any) -> Any:
    with torch.no_grad():
        return model(**_inputs(), **kwargs)


@pytest.mark.parametrize("name", MODELS)
def test_sites_outputs_and_attentions_equal_transformers(name):
    handle = headlab.attach(_build(name))
    assert [s.name for s in handle.sites] == MODELS[name]
    assert [(s.kind, s.causal) for s in handle.sites] == KINDS
    assert "cross=True" in repr(handle.sites[CROSS])
    torch.testing.assert_close(_output(handle.model).last_hidden_state, _output(_build(name)).last_hidden_state,
                               rtol=1e-5, atol=1e-5)
    got, want = _output(handle.model, output_attentions=True), _output(_build(name, "eager"), output_attentions=True)
    for field in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
        for ours, theirs in zip(getattr(got, field), getattr(want, field), strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", MODELS)
def test_taps_equal_what_the_model_computes(name):
    """float64: a cross head's pattern is target × source positions and times its v gives its z; z is the output
    projection's input; the results and the projection's bias sum to its output."""
    handle = headlab.attach(_build(name, dtype=torch.float64))
    cache = check_taps(handle, _inputs())
    assert cache["pattern", CROSS].shape == (2, 4, 5, 7)


@pytest.mark.parametrize("name", MODELS)
def test_masking_a_cross_head_and_pruning_it_equal(name):
    handle = headlab.attach(_build(name))
    before = headlab.run_with_cache(handle, _inputs(), take="z")["z", CROSS]
    heads.mask(handle, {CROSS: [2]})
    after = headlab.run_with_cache(handle, _inputs(), take="z")["z", CROSS]
    assert not after[:, 2].any() and torch.equal(after[:, [0, 1, 3]], before[:, [0, 1, 3]])
    masked = _output(handle.model).last_hidden_state
    pruned = headlab.attach(_build(name))
    heads.prune(pruned, {CROSS: [2]})
    assert [s.n_heads for s in pruned.sites] == [4, 4, 4, 3, 4, 4]
    torch.testing.assert_close(_output(pruned.model).last_hidden_state, masked, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_analyze_and_view_run_on_an_encoder_decoder_checkpoint(name, tmp_path):
    """The commands serve it as any text model (its decoder reads the source shifted: BART by itself, Marian and
    T5 given it);
    the causal probes and the context heads are skipped with the reason."""
    import json

    from typer.testing import CliRunner

    from headlab.cli import app
    from headlab.models import default_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    ids = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.sep_token_id,
               decoder_start_token_id=tokenizer.cls_token_id)
    FAMILIES[name].build(**ids).save_pretrained(tmp_path / name)
    tokenizer.save_pretrained(tmp_path / name)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("The cat sat on the mat.\nHeads attend to words.\nA dog ran home, fast.\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / name), "--quick", "--no-syntax", "--streaming",
                                      "--text", str(corpus), "--json", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert len(document["heads"]) == 6 * 4 and "bidirectional layers" in document["summary"]["skipped"]["causal probes"]
    result = CliRunner().invoke(app, ["view", str(tmp_path / name), "The cat sat on the mat.",
                                      "--out", str(tmp_path / "view.html")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", MODELS)
def test_text_gives_the_decoder_the_source_shifted_and_pairs_the_target(name):
    """One rule for every encoder-decoder: text alone, the decoder reads the source shifted right behind the start
    token (what BART does by itself: the same output); a (source, target) pair, the target shifted."""
    from tests.support.text import word_piece_tokenizer

    tokenizer = word_piece_tokenizer()
    handle = headlab.attach(_build(name), tokenizer=tokenizer)
    start = handle.model.config.decoder_start_token_id
    kwargs = handle.inputs(["the cat sat", "a dog"])
    ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
    assert torch.equal(kwargs["decoder_input_ids"], torch.cat([torch.full_like(ids[:, :1], start), ids[:, :-1]], 1))
    assert torch.equal(kwargs["decoder_attention_mask"][:, 1:], mask[:, :-1])
    if name == "bart":  # BART shifts the source itself when given no decoder input (Marian and T5 need it given)
        with torch.no_grad():
            theirs = handle.model(input_ids=ids, attention_mask=mask).last_hidden_state
            ours = handle.model(**kwargs).last_hidden_state
        real = kwargs["decoder_attention_mask"].bool()
        torch.testing.assert_close(ours[real], theirs[real])
    pair = handle.inputs([("the cat sat", "a dog ran"), ("a dog", "the cat")])
    target = tokenizer(text_target=["a dog ran", "the cat"], padding=True, return_tensors="pt")["input_ids"]
    assert torch.equal(pair["input_ids"], ids)
    assert torch.equal(pair["decoder_input_ids"][:, 1:], target[:, :-1])
    one = handle.inputs(("the cat sat", "a dog ran"))  # target × source positions
    assert headlab.run_with_cache(handle, ("the cat sat", "a dog ran"), take="pattern")["pattern", CROSS].shape[-2:] \
        == (one["decoder_input_ids"].shape[1], one["input_ids"].shape[1])


@pytest.mark.parametrize("name", MODELS)
def test_each_site_says_which_side_of_a_pair_its_queries_and_keys_read(name):
    from headlab.models.seq2seq import SOURCE, TARGET, site_sides

    handle = headlab.attach(_build(name))
    encoder, decoder, cross = (SOURCE, SOURCE), (TARGET, TARGET), (TARGET, SOURCE)
    assert [site_sides(site) for site in handle.sites] == [encoder, encoder, decoder, cross, decoder, cross]


@pytest.mark.parametrize("name", MODELS)
def test_a_pruned_and_masked_model_saves_and_loads_identical(name, tmp_path):
    """A cross head pruned, an encoder head masked: the saved folder loads as it was."""
    handle = headlab.attach(_build(name))
    heads.prune(handle, {CROSS: [2]})
    heads.mask(handle, {0: [0]})
    path = heads.save(handle, tmp_path / name)
    loaded = headlab.load(path)
    assert [site.n_heads for site in loaded.sites] == [4, 4, 4, 3, 4, 4]
    assert torch.equal(_output(loaded.model).last_hidden_state, _output(handle.model).last_hidden_state)


def test_t5_one_heads_pattern_and_pruning_read_the_kept_heads_position_bias():
    """T5 makes its position bias in each stack's first layer, of every head, and hands it on: one tapped head's
    pattern (from the fused kernel's log-sum-exp, the bias a mask per head) equals eager's; pruning heads of the
    layer that owns the bias table, and of the one that makes the cross-attention's, equals masking them."""
    eager = _output(_build("t5", "eager"), output_attentions=True)
    handle = headlab.attach(_build("t5"))
    cache = headlab.run_with_cache(handle, _inputs(), take="pattern", heads={0: [1], 2: [3], CROSS: [2]})
    torch.testing.assert_close(cache["pattern", 0, 1], eager.encoder_attentions[0][:, 1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache["pattern", 2, 3], eager.decoder_attentions[0][:, 3], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cache["pattern", CROSS, 2], eager.cross_attentions[0][:, 2], rtol=1e-5, atol=1e-6)
    removed = {0: [0, 2], 2: [1], CROSS: [3]}
    heads.mask(handle, removed)
    masked = _output(handle.model).last_hidden_state
    pruned = headlab.attach(_build("t5"))
    heads.prune(pruned, removed)
    assert [s.n_heads for s in pruned.sites] == [2, 4, 3, 3, 4, 4]
    torch.testing.assert_close(_output(pruned.model).last_hidden_state, masked, rtol=1e-5, atol=1e-5)
    got = _output(pruned.model, output_attentions=True)
    torch.testing.assert_close(got.encoder_attentions[0], eager.encoder_attentions[0][:, [1, 3]], rtol=1e-5,
                               atol=1e-6)  # the first layer's kept heads, with their own bias


def test_patch_runs_on_an_encoder_decoder_with_the_metric_its_kind_has(tmp_path):
    """A decoder's causal layers do not make a language model: without logits the default metric is the output's
    similarity (``default_metric``), and its cross-attention heads are patched by name."""
    import json

    from typer.testing import CliRunner

    from headlab.analysis.patching import default_metric
    from headlab.cli import app
    from headlab.models import default_model_path

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(default_model_path()))
    FAMILIES["t5"].build(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         decoder_start_token_id=tokenizer.cls_token_id).save_pretrained(tmp_path / "t5")
    tokenizer.save_pretrained(tmp_path / "t5")
    assert default_metric(headlab.load(tmp_path / "t5")) == "similarity"
    result = CliRunner().invoke(app, ["patch", str(tmp_path / "t5"), "--clean", "The cat sat on the mat.",
                                      "--corrupt", "The dog sat on the mat.", "--layers", "decoder.blocks.*.cross_attn",
                                      "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["metric"].startswith("cosine similarity")
    assert {row["layer"] for row in document["results"][0]["heads"]["rows"]} == {3, 5}
