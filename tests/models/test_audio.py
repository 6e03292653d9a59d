"""Audio encoder-decoders attach exactly: a tiny random Whisper (base model and the one with an LM head), probed
through seeded random log-mel features of the length its encoder requires (``main_input_name ==
"input_features"``): its encoder's self-attention, the decoder's causal self-attention and its cross-attention, one
site per module in the order they run.

With nothing asked the attached model's output equals the plain SDPA model's; ``output_attentions`` (encoder,
decoder and cross) equal eager's; tapped patterns, z and results equal what the model computes (float64); masking
a cross head zeroes its z alone; pruning it equals masking it; a pruned and masked model saves and loads identical.
``HeadedModel.inputs`` turns samples and WAV files into features through the feature extractor the handle holds,
and refuses in one line what it cannot read; ``HeadedModel.labels`` names each site's queries and keys: the frames in
seconds, the decoder's tokens. The commands on audio: tests/cli/test_audio_cli.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import headlab
from headlab import heads
from headlab.models.audio import Timeline, frame_seconds
from headlab.models.probe import probe_inputs
from tests.support.audio import RATE, extractor, tone, write_wav
from tests.support.families import WHISPER
from tests.support.reference import check_taps

transformers = pytest.importorskip("transformers")

FEATURES = (8, 32)  # (n_mels, frames): the encoder's conv2 halves 32 frames to its 16 positions
KINDS = [("encoder.layers.0.self_attn", "self", False), ("encoder.layers.1.self_attn", "self", False),
         ("decoder.layers.0.self_attn", "self", True), ("decoder.layers.0.encoder_attn", "cross", False),
         ("decoder.layers.1.self_attn", "self", True), ("decoder.layers.1.encoder_attn", "cross", False)]
CROSS = 3  # the first cross-attention site
MODELS = {"WhisperModel": "", "WhisperForConditionalGeneration": "model."}  # class: prefix of its sites' names


def _build(name: str = "WhisperModel", implementation: str = "sdpa",
           dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.WhisperConfig(**WHISPER)
    return getattr(transformers, name)._from_config(config, attn_implementation=implementation).to(dtype).eval()


def _inputs(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return {"input_features": torch.randn(2, *FEATURES, generator=generator, dtype=dtype),
            "decoder_input_ids": torch.randint(3, 100, (2, 5), generator=generator)}


def _output(model: torch.nn.Module, **kwargs: Any) -> Any:
    with torch.no_grad():
        return model(**_inputs(), **kwargs)


def test_the_probe_gives_features_of_the_encoders_length_and_a_shorter_decoder():
    inputs = probe_inputs(_build())
    assert inputs["input_features"].shape == (2, *FEATURES) and inputs["decoder_input_ids"].shape == (2, 4)
    assert not set(inputs["decoder_input_ids"].flatten().tolist()) & {0, 1, 2}  # no special token


@pytest.mark.parametrize("name", MODELS)
def test_sites_outputs_and_attentions_equal_transformers(name):
    handle = headlab.attach(_build(name))
    assert [(s.name, s.kind, s.causal) for s in handle.sites] == [(MODELS[name] + n, k, c) for n, k, c in KINDS]
    torch.testing.assert_close(_output(handle.model)[0], _output(_build(name))[0], rtol=1e-5, atol=1e-5)
    got, want = _output(handle.model, output_attentions=True), _output(_build(name, "eager"), output_attentions=True)
    for field in ("encoder_attentions", "decoder_attentions", "cross_attentions"):
        for ours, theirs in zip(getattr(got, field), getattr(want, field), strict=True):
            torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_taps_equal_what_the_model_computes():
    """float64: a cross head's pattern is target × source positions (the encoder's 16, after its convolutions) and
    times its v gives its z; z is the output projection's input; the results and its bias sum to its output."""
    handle = headlab.attach(_build(dtype=torch.float64))
    cache = check_taps(handle, _inputs(torch.float64))
    assert cache["pattern", 0].shape == (2, 4, 16, 16) and cache["pattern", CROSS].shape == (2, 4, 5, 16)


def test_masking_a_cross_head_and_pruning_it_equal():
    handle = headlab.attach(_build())
    before = headlab.run_with_cache(handle, _inputs(), take="z")["z", CROSS]
    heads.mask(handle, {CROSS: [2]})
    after = headlab.run_with_cache(handle, _inputs(), take="z")["z", CROSS]
    assert not after[:, 2].any() and torch.equal(after[:, [0, 1, 3]], before[:, [0, 1, 3]])
    masked = _output(handle.model).last_hidden_state
    pruned = headlab.attach(_build())
    heads.prune(pruned, {CROSS: [2]})
    assert [s.n_heads for s in pruned.sites] == [4, 4, 4, 3, 4, 4]
    torch.testing.assert_close(_output(pruned.model).last_hidden_state, masked, rtol=1e-5, atol=1e-5)


def test_a_pruned_and_masked_model_saves_and_loads_identical_with_its_feature_extractor(tmp_path):
    """A cross head pruned, an encoder head masked: the folder loads as it was, its feature extractor with it;
    without preprocessor_config.json, audio is refused in one line naming the file."""
    handle = headlab.attach(_build(), tokenizer=extractor())
    heads.prune(handle, {CROSS: [2]})
    heads.mask(handle, {0: [0]})
    path = heads.save(handle, tmp_path / "whisper")
    loaded = headlab.load(path)
    assert [site.n_heads for site in loaded.sites] == [4, 4, 4, 3, 4, 4]
    assert torch.equal(_output(loaded.model).last_hidden_state, _output(handle.model).last_hidden_state)
    assert isinstance(loaded.tokenizer, transformers.WhisperFeatureExtractor)
    assert torch.equal(loaded.inputs(tone())["input_features"], handle.inputs(tone())["input_features"])
    (path / "preprocessor_config.json").unlink()
    with pytest.raises(TypeError, match=r"whisper has no preprocessor_config\.json") as refused:
        headlab.load(path).inputs(tone())
    assert "\n" not in str(refused.value)


def test_samples_and_wav_files_become_the_feature_extractors_features(tmp_path):
    """Samples (an array, a tensor), a mono WAV and a stereo one (averaged to mono), one or a list: the features
    are the extractor's own, and an encoder-decoder's decoder reads decoder_start_token_id."""
    made, samples = extractor(), tone()
    want = made(samples, sampling_rate=RATE, return_tensors="pt")["input_features"]
    handle = headlab.attach(_build("WhisperForConditionalGeneration"), tokenizer=made)
    mono, stereo = write_wav(tmp_path / "mono.wav", samples), write_wav(tmp_path / "stereo.wav", samples, channels=2)
    for audio in (samples, torch.from_numpy(samples), mono, str(stereo)):
        kwargs = handle.inputs(audio)
        assert torch.equal(kwargs["input_features"], want) and kwargs["decoder_input_ids"].tolist() == [[0]]
    batch = handle.inputs([mono, samples[: RATE // 4]])
    assert batch["input_features"].shape == (2, *FEATURES) and torch.equal(batch["input_features"][:1], want)
    processor = type("Processor", (), {"feature_extractor": made})()  # a processor holds its feature extractor
    assert torch.equal(headlab.attach(_build(), tokenizer=processor).inputs(mono)["input_features"], want)
    logits = headlab.run_with_cache(handle, mono, take="pattern").output.logits
    assert logits.shape == (1, 1, WHISPER["vocab_size"])
    ids = torch.tensor([[0, 5, 6]])
    assert torch.equal(handle.inputs({"input_features": want, "decoder_input_ids": ids})["decoder_input_ids"], ids)


def test_features_tensors_pass_as_they_are_and_a_wrong_shape_is_refused():
    handle = headlab.attach(_build())
    features = _inputs()["input_features"]
    kwargs = handle.inputs(features)
    assert torch.equal(kwargs["input_features"], features) and kwargs["decoder_input_ids"].tolist() == [[0], [0]]
    for bad in (features[:, :, :20], features.long(), features[0]):
        with pytest.raises(ValueError, match=r"input features must be a float tensor \(batch, 8, 32\)"):
            handle.inputs(bad)


def test_what_cannot_be_read_is_refused_in_one_line(tmp_path):
    handle = headlab.attach(_build(), tokenizer=extractor())
    low = write_wav(tmp_path / "low.wav", tone(4000), rate=8000)
    with pytest.raises(ValueError, match=r"low\.wav: sampled at 8000 Hz, but the feature extractor takes 16000 Hz"):
        handle.inputs(low)
    with pytest.raises(ValueError, match=r"audio samples must be a 1-D float array .* got int16"):
        handle.inputs(np.zeros(100, dtype=np.int16))
    bare = headlab.attach(_build())
    with pytest.raises(TypeError, match=r"audio inputs need a feature extractor, and this WhisperModel has none: "
                                        r"headlab\.attach\(model, tokenizer=AutoProcessor"):
        bare.inputs(tone())
    speech = transformers.Speech2TextModel(transformers.Speech2TextConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, input_feat_per_channel=8))
    with pytest.raises(ValueError, match=r"Speech2TextModel takes input_features, but its config has no num_mel_bins"):
        headlab.attach(speech)


def test_labels_give_each_sites_queries_and_keys_frames_in_seconds_tokens_by_id():
    """The encoder's self-attention frames × frames, the decoder's tokens × tokens, cross-attention tokens × frames:
    the labels of each site are as long as its pattern's axes; a frame's time is its position × 2 (conv2's stride)
    × 500 (hop_length) / 16 000 Hz."""
    handle = headlab.attach(_build(), tokenizer=extractor())
    inputs = handle.inputs(tone())
    frames = [f"frame {i * 2 * 500 / RATE:.2f} s" for i in range(16)]
    assert frames[:4] == ["frame 0.00 s", "frame 0.06 s", "frame 0.12 s", "frame 0.19 s"]
    assert handle.labels(inputs) == [frames]
    want = {"self": (frames, frames), "cross": (["tok 0"], frames)}
    cache = headlab.run_with_cache(handle, inputs, take="pattern")
    for layer, (_, kind, causal) in enumerate(KINDS):
        [(queries, keys)] = handle.labels(inputs, layer=layer)
        assert (queries, keys) == ((["tok 0"], ["tok 0"]) if causal else want[kind])
        assert cache["pattern", layer].shape[-2:] == (len(queries), len(keys))


def test_the_processors_tokenizer_names_the_decoders_tokens_and_no_extractor_numbers_the_frames():
    class Words:
        def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
            return [f"<|{i}|>" for i in ids]

    processor = type("Processor", (), {"feature_extractor": extractor(), "tokenizer": Words()})()
    handle = headlab.attach(_build(), tokenizer=processor)
    ids = torch.tensor([[0, 7]] * 2)
    inputs = handle.inputs({"input_features": _inputs()["input_features"], "decoder_input_ids": ids})
    assert handle.labels(inputs, layer=CROSS)[1][0] == ["<|0|>", "<|7|>"]
    bare = headlab.attach(_build())
    assert bare.labels(bare.inputs(_inputs()["input_features"]))[0][:2] == ["frame 0", "frame 1"]
    seconds = frame_seconds(_build(), transformers.WhisperFeatureExtractor())  # Whisper's: 2 × 160 / 16 000 Hz
    assert seconds == 0.02 and Timeline(positions=1500, seconds=seconds).labels()[21] == "frame 0.42 s"


def test_a_layer_it_has_not_and_a_decoder_site_without_decoder_ids_are_refused():
    handle = headlab.attach(_build(), tokenizer=extractor())
    with pytest.raises(ValueError, match=r"layer=6; expected a layer of WhisperModel, 0 to 5"):
        handle.labels(handle.inputs(tone()), layer=6)
    with pytest.raises(ValueError, match=r"layer 3 is its decoder's and the inputs have no decoder_input_ids"):
        handle.labels({"input_features": _inputs()["input_features"]}, layer=CROSS)
