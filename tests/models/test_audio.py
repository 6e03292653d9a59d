"""Audio encoder-decoders attach exactly: a tiny random Whisper (base model and the one with an LM head), probed
through seeded random log-mel features of the length its encoder requires (``main_input_name ==
"input_features"``): its encoder's self-attention, the decoder's causal self-attention and its cross-attention, one
site per module in the order they run.

With nothing asked the attached model's output equals the plain SDPA model's; ``output_attentions`` (encoder,
decoder and cross) equal eager's; tapped patterns, z and results equal what the model computes (float64); masking
a cross head zeroes its z alone; pruning it equals masking it; a pruned and masked model saves and loads identical.
``HeadedModel.inputs`` turns samples and WAV files into features through the feature extractor the handle holds,
and refuses in one line what it cannot read.
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import headlab
from headlab import heads
from headlab.models.probe import probe_inputs
from tests.support.families import WHISPER
from tests.support.reference import check_taps

transformers = pytest.importorskip("transformers")

FEATURES = (8, 32)  # (n_mels, frames): the encoder's conv2 halves 32 frames to its 16 positions
RATE = 16_000
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


def _extractor(rate: int = RATE) -> Any:
    """Features the tiny model takes: 1 s at ``rate`` in hops of 1/32 s gives 32 frames of 8 mel bins."""
    return transformers.WhisperFeatureExtractor(feature_size=8, sampling_rate=rate, hop_length=rate // 32,
                                                chunk_length=1, n_fft=400)


def _samples(n: int = RATE // 2) -> np.ndarray:
    """Half a second of a 440 Hz tone, quantized to 16 bits (what a WAV file holds)."""
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(n) / RATE)
    return (np.round(tone * 32767).astype(np.int16) / 32768.0).astype(np.float32)


def _wav(path: Path, samples: np.ndarray, *, rate: int = RATE, channels: int = 1) -> Path:
    pcm = np.repeat(np.round(samples * 32768).astype("<i2")[:, None], channels, axis=1)
    with wave.open(str(path), "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(pcm.tobytes())
    return path


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
    handle = headlab.attach(_build(), tokenizer=_extractor())
    heads.prune(handle, {CROSS: [2]})
    heads.mask(handle, {0: [0]})
    path = heads.save(handle, tmp_path / "whisper")
    loaded = headlab.load(path)
    assert [site.n_heads for site in loaded.sites] == [4, 4, 4, 3, 4, 4]
    assert torch.equal(_output(loaded.model).last_hidden_state, _output(handle.model).last_hidden_state)
    assert isinstance(loaded.tokenizer, transformers.WhisperFeatureExtractor)
    assert torch.equal(loaded.inputs(_samples())["input_features"], handle.inputs(_samples())["input_features"])
    (path / "preprocessor_config.json").unlink()
    with pytest.raises(TypeError, match=r"whisper has no preprocessor_config\.json") as refused:
        headlab.load(path).inputs(_samples())
    assert "\n" not in str(refused.value)


def test_samples_and_wav_files_become_the_feature_extractors_features(tmp_path):
    """Samples (an array, a tensor), a mono WAV and a stereo one (averaged to mono), one or a list: the features
    are the extractor's own, and an encoder-decoder's decoder reads decoder_start_token_id."""
    extractor, samples = _extractor(), _samples()
    want = extractor(samples, sampling_rate=RATE, return_tensors="pt")["input_features"]
    handle = headlab.attach(_build("WhisperForConditionalGeneration"), tokenizer=extractor)
    mono, stereo = _wav(tmp_path / "mono.wav", samples), _wav(tmp_path / "stereo.wav", samples, channels=2)
    for audio in (samples, torch.from_numpy(samples), mono, str(stereo)):
        kwargs = handle.inputs(audio)
        assert torch.equal(kwargs["input_features"], want) and kwargs["decoder_input_ids"].tolist() == [[0]]
    batch = handle.inputs([mono, samples[: RATE // 4]])
    assert batch["input_features"].shape == (2, *FEATURES) and torch.equal(batch["input_features"][:1], want)
    processor = type("Processor", (), {"feature_extractor": extractor})()  # a processor holds its feature extractor
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
    handle = headlab.attach(_build(), tokenizer=_extractor())
    low = _wav(tmp_path / "low.wav", _samples(4000), rate=8000)
    with pytest.raises(ValueError, match=r"low\.wav: sampled at 8000 Hz, but the feature extractor takes 16000 Hz"):
        handle.inputs(low)
    with pytest.raises(ValueError, match=r"audio samples must be a 1-D float array .* got int16"):
        handle.inputs(np.zeros(100, dtype=np.int16))
    bare = headlab.attach(_build())
    with pytest.raises(TypeError, match=r"audio inputs need a feature extractor, and this WhisperModel has none: "
                                        r"headlab\.attach\(model, tokenizer=AutoProcessor"):
        bare.inputs(_samples())
    speech = transformers.Speech2TextModel(transformers.Speech2TextConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, input_feat_per_channel=8))
    with pytest.raises(ValueError, match=r"Speech2TextModel takes input_features, but its config has no num_mel_bins"):
        headlab.attach(speech)


def test_the_commands_refuse_an_audio_model_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from headlab.cli import app

    _build().save_pretrained(tmp_path / "whisper")
    result = CliRunner().invoke(app, ["analyze", str(tmp_path / "whisper"), "--quick"])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "WhisperModel takes input_features, not text" in said, result.output
    assert len(result.output.strip().splitlines()) <= 3 and "Traceback" not in result.output
