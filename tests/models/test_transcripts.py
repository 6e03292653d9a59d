"""A Whisper with a language-model head writes each recording's transcript and its decoder reads it: greedy decoding
equals a step-by-step reference that reruns the whole model; captured cross-attention over the transcript equals
eager's ``output_attentions``, whatever the batch size; ``time_order`` is 1 for attention that moves through the
audio with the tokens, -1 backwards; importance and the pruning curve measure the heads on the transcripts; a
recording longer than the feature extractor's window is cut with the same one sentence at every entry point.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import headlab
from headlab.analysis.audio import AGREEMENT, analyze_audio
from headlab.analysis.frames import AudioStats
from headlab.capture.audio import AudioCorpus, audio_batch, capture_audio
from headlab.capture.batch import LayerCapture
from headlab.models.audio import FRAMES, TOKENS, Timeline
from headlab.models.transcripts import transcribe
from headlab.models.truncation import TruncationWarning
from tests.support.audio import RATE, save_whisper, tone, write_wavs

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_whisper(tmp_path_factory.mktemp("whisper"), head=True)


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clips")
    write_wavs(folder, n=3)
    return folder


def test_a_checkpoint_with_a_head_that_writes_text_loads_with_it(whisper, tmp_path):
    assert headlab.load(str(whisper)).architecture == "WhisperForConditionalGeneration"
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=128, d_model=16, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=32)
    transformers.BartForConditionalGeneration(config).save_pretrained(tmp_path / "bart")
    assert headlab.load(str(tmp_path / "bart")).architecture == "BartForConditionalGeneration"


def test_greedy_transcripts_equal_a_reference_that_reruns_the_whole_model(whisper, clips):
    handle = headlab.load(str(whisper))
    features = AudioCorpus(handle, clips).features([0, 1, 2])[0]
    made = transcribe(handle.model, features, max_tokens=8)
    assert made is not None
    eager = transformers.WhisperForConditionalGeneration.from_pretrained(whisper, attn_implementation="eager").eval()
    end = eager.config.eos_token_id
    for row, transcript in enumerate(made):
        ids = [eager.config.decoder_start_token_id]
        while len(ids) < 9 and (len(ids) == 1 or ids[-1] != end):
            with torch.no_grad():
                logits = eager(input_features=features[row:row + 1], decoder_input_ids=torch.tensor([ids])).logits
            ids.append(int(logits[0, -1].argmax()))
        assert list(transcript.ids) == ids
        assert transcript.ended == (ids[-1] == end)
        assert transcript.read == tuple(ids[:-1] if transcript.ended else ids)


def test_a_model_without_a_head_has_no_transcript(tmp_path):
    handle = headlab.load(str(save_whisper(tmp_path / "base")))
    assert transcribe(handle.model, torch.zeros(1, 8, 32)) is None
    with pytest.raises(ValueError, match=r"max_tokens=-1; expected an int ≥ 0"):
        transcribe(handle.model, torch.zeros(1, 8, 32), max_tokens=-1)


@pytest.mark.parametrize("batch_size", [1, 3])
def test_captured_patterns_over_the_transcripts_equal_eagers(whisper, clips, batch_size):
    handle = headlab.load(str(whisper))
    taken: dict[int, dict[int, torch.Tensor]] = {}

    class Keep:
        def update(self, batch):
            for row, index in enumerate(batch.corpus_indices.tolist()):
                taken[index] = {layer: t.pattern[row].clone() for layer, t in batch.layers.items()}

    corpus = AudioCorpus(handle, clips)
    run, _ = capture_audio(handle, corpus, consumers=[Keep()], batch_size=batch_size, transcript_tokens=6,
                           progress=False)
    assert run.corpus["decoder"]["reads"] == "transcripts" and corpus.transcripts is not None
    eager = transformers.WhisperForConditionalGeneration.from_pretrained(whisper, attn_implementation="eager").eval()
    for index, transcript in enumerate(corpus.transcripts):
        features = corpus.features([index])[0]
        with torch.no_grad():
            out = eager(input_features=features, decoder_input_ids=torch.tensor([transcript.read]),
                        output_attentions=True)
        expected = [*out.encoder_attentions, out.decoder_attentions[0], out.cross_attentions[0],
                    out.decoder_attentions[1], out.cross_attentions[1]]
        for layer, pattern in enumerate(expected):
            torch.testing.assert_close(taken[index][layer], pattern[0], atol=1e-5, rtol=1e-4)
        assert taken[index][3].shape == (4, len(transcript.read), 16)


def _cross(pattern: torch.Tensor) -> AudioStats:
    stats = AudioStats(timeline=Timeline(positions=pattern.shape[-1], seconds=0.5), axes={0: (TOKENS, FRAMES)})
    frames = torch.ones(1, pattern.shape[-1], dtype=torch.bool)
    batch = audio_batch(stats.timeline, ["a"], [0], frames, torch.zeros(1, dtype=torch.bool))
    batch.layers = {0: LayerCapture(layer=0, heads=(0, 1, 2), pattern=pattern)}
    stats.update(batch)
    return stats


def test_time_order_is_one_for_attention_in_step_with_the_tokens_and_minus_one_backwards():
    eye = torch.eye(5, dtype=torch.float64)
    pattern = torch.stack([eye, eye.flip(0), torch.full((5, 5), 0.2, dtype=torch.float64)])[None]  # (1, 3, 5, 5)
    table = _cross(pattern).result()
    assert table.value("time_order", 0, 0) == pytest.approx(1.0)
    assert table.value("time_order", 0, 1) == pytest.approx(-1.0)
    assert np.isnan(table.value("time_order", 0, 2))  # the time attended never moves: undefined, not 0
    short = _cross(pattern[..., :2, :]).result()  # two tokens: too few to have an order
    assert np.isnan(short.value("time_order", 0, 0))


def test_importance_and_the_pruning_curve_run_on_the_transcripts(whisper, clips):
    result = analyze_audio(headlab.load(str(whisper)), clips, quick=True, progress=False)
    assert "importance" not in result.skipped and "gradient" in result.importance
    assert len(result.importance["gradient"].table) == 24 and list(result.pruning) == [AGREEMENT]
    curve = result.pruning[AGREEMENT]
    assert curve.values[0] == pytest.approx(1.0)  # the model that wrote the transcripts agrees with all of them
    cross = [row for row in result.rows() if row["layer"] in (3, 5)]
    assert all(-1 <= row["time_order"] <= 1 for row in cross if row["time_order"] is not None)
    assert result.summary()["decoder"]["reads"] == "transcripts"


def test_a_recording_longer_than_the_window_is_cut_with_one_sentence_everywhere(whisper):
    handle = headlab.load(str(whisper))
    recordings = [tone(RATE * 2), tone(RATE // 2), tone(RATE * 3)]  # the tiny extractor's window: 1 s
    said = ("2 of 3 recordings are longer than the feature extractor's window of 1 s (what the encoder takes) and "
            "were cut to it (recordings 0, 2)")
    for run in (lambda: handle.inputs(recordings),
                lambda: capture_audio(handle, recordings, transcript_tokens=0, progress=False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run()
        assert [str(w.message) for w in caught if w.category is TruncationWarning] == [said]
