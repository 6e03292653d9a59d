"""A tiny random Whisper saved as a checkpoint folder beside a tiny feature extractor, and WAV files written with the
``wave`` module: what the audio tests of the library, the commands and the browser share.

- ``extractor()``: a ``WhisperFeatureExtractor`` whose features the tiny model takes: 1 s at 16 kHz in hops of
  500 samples gives 32 frames of 8 mel bins, which the encoder's conv2 halves to its 16 positions (0.0625 s each).
- ``save_whisper(folder)``: a ``WhisperModel`` of ``tests.support.families.WHISPER`` (2 + 2 layers × 4 heads) with
  weights far larger than transformers' init, so that patterns are far from uniform, saved with ``extractor()``
  (``head=True``: a ``WhisperForConditionalGeneration``, whose greedy transcripts the decoder reads).
- ``tone(n)``, ``write_wav(path, samples)``, ``write_wavs(folder)``: 16-bit PCM recordings.
"""

from __future__ import annotations

import wave
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.families import WHISPER

RATE = 16_000  # samples per second
SECONDS = 0.0625  # seconds per encoder position: 2 (conv2's stride) × 500 (hop_length) / 16 000


def extractor(rate: int = RATE) -> Any:
    """The feature extractor of the tiny Whisper: 1 s at ``rate`` in hops of 1/32 s, 8 mel bins."""
    import transformers

    return transformers.WhisperFeatureExtractor(feature_size=8, sampling_rate=rate, hop_length=rate // 32,
                                                chunk_length=1, n_fft=400)


def tone(n: int = RATE // 2, *, hertz: float = 440.0) -> np.ndarray:
    """``n`` samples of a tone at ``hertz``, quantized to 16 bits (what a WAV file holds), float32."""
    signal = 0.5 * np.sin(2 * np.pi * hertz * np.arange(n) / RATE)
    return (np.round(signal * 32767).astype(np.int16) / 32768.0).astype(np.float32)


def write_wav(path: Path, samples: np.ndarray, *, rate: int = RATE, channels: int = 1) -> Path:
    """Write ``samples`` (floats in [-1, 1]) as a 16-bit PCM WAV file of ``channels`` equal channels; returns it."""
    pcm = np.repeat(np.round(samples * 32768).clip(-32768, 32767).astype("<i2")[:, None], channels, axis=1)
    with wave.open(str(path), "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(rate)
        file.writeframes(pcm.tobytes())
    return path


def write_wavs(folder: Path, n: int = 2) -> list[Path]:
    """Write ``n`` recordings (``clip0.wav``, …: tones of 0.25 s, 0.5 s, … at 300 Hz, 500 Hz, …) into ``folder``
    (made if missing); returns their paths in name order."""
    folder.mkdir(parents=True, exist_ok=True)
    return [write_wav(folder / f"clip{i}.wav", tone(RATE * (i + 1) // 4, hertz=300.0 + 200 * i)) for i in range(n)]


def save_whisper(folder: Path, *, processor: bool = True, head: bool = False) -> Path:
    """Save a tiny random ``WhisperModel`` (with ``head``: ``WhisperForConditionalGeneration``, which writes
    transcripts) into ``folder``, with its feature extractor unless not ``processor``; returns the folder."""
    import torch
    import transformers

    torch.manual_seed(0)
    model_class = transformers.WhisperForConditionalGeneration if head else transformers.WhisperModel
    model = model_class(transformers.WhisperConfig(**WHISPER, init_std=0.2))
    model.save_pretrained(folder)
    if processor:
        extractor().save_pretrained(folder)
    return folder
