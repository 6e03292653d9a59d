"""Audio inputs of a model that takes log-mel features (``main_input_name == "input_features"``: Whisper and
its kin): the features' shape the encoder requires, WAV files, and samples turned into features by the
model's own feature extractor.

Notation: features are ``(batch, n_mels, frames)``; samples are ``(n_samples,)``, mono, at the feature
extractor's sampling rate. headlab never resamples.
"""

from __future__ import annotations

import inspect
import os
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

FEATURES = "input_features"  # the main input name of a model that takes log-mel features
PREPROCESSOR_FILE = "preprocessor_config.json"  # where a checkpoint keeps its feature extractor
Samples = str | os.PathLike[str] | np.ndarray | Tensor  # one recording: a WAV path or its samples
Audio = Samples | Sequence[Samples]  # one recording or several


def takes_features(model: nn.Module) -> bool:
    """Whether ``model``'s main input is log-mel features (``main_input_name == "input_features"``)."""
    return getattr(model, "main_input_name", None) == FEATURES


def feature_shape(model: nn.Module) -> tuple[int, int]:
    """The ``(n_mels, frames)`` of the features ``model``'s encoder requires.

    The frames are ``config.max_source_positions`` (the encoder's positions) times the strides of the
    encoder's 1-D convolutions, which subsample the frames (Whisper's conv1 and conv2: 1 × 2).

    Raises:
        ValueError: the config has no ``num_mel_bins`` or ``max_source_positions``, or the encoder no
            ``Conv1d``; the message names what is missing.
    """
    name, config = type(model).__name__, getattr(model, "config", None)
    n_mels, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
    if not isinstance(n_mels, int):
        raise ValueError(f"{name} takes input_features, but its config has no num_mel_bins: cannot tell its mel bins")
    if not isinstance(positions, int):
        raise ValueError(f"{name} takes input_features, but its config has no max_source_positions: cannot tell the "
                         "frames its encoder requires")
    # a transformers model's get_encoder is the model itself when it has no encoder
    encoder = cast(Any, model).get_encoder() if hasattr(model, "get_encoder") else model
    strides = [m.stride[0] for m in encoder.modules() if isinstance(m, nn.Conv1d)]
    if not strides:
        raise ValueError(f"{name} takes input_features, but its encoder has no Conv1d: cannot tell how many frames "
                         "make one of its max_source_positions")
    return n_mels, positions * int(np.prod(strides))


def takes_decoder_ids(model: nn.Module) -> bool:
    """Whether ``model``'s forward takes ``decoder_input_ids`` (an encoder-decoder, not its encoder alone)."""
    return "decoder_input_ids" in inspect.signature(model.forward).parameters


def decoder_start(model: nn.Module, batch: int, device: torch.device) -> Tensor:
    """A one-token decoder input per item: ``config.decoder_start_token_id``, ``(batch, 1)``.

    Raises:
        ValueError: the config sets no ``decoder_start_token_id``.
    """
    start = getattr(getattr(model, "config", None), "decoder_start_token_id", None)
    if not isinstance(start, int):
        raise ValueError(f"{type(model).__name__} sets no config.decoder_start_token_id: pass decoder_input_ids "
                         "with the input features in a dict")
    return torch.full((batch, 1), start, dtype=torch.long, device=device)


def check_features(features: Tensor, shape: tuple[int, int]) -> Tensor:
    """``features`` if it is a float ``(batch, n_mels, frames)`` tensor of the required ``shape``.

    Raises:
        ValueError: another dimension, dtype or size; the message gives the shape expected.
    """
    n_mels, frames = shape
    if features.dim() != 3 or not features.is_floating_point() or tuple(features.shape[1:]) != shape:
        raise ValueError(f"input features must be a float tensor (batch, {n_mels}, {frames}) = (batch, n_mels, "
                         f"frames); got {features.dtype} {tuple(features.shape)}")
    return features


def read_wav(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """A 16-bit PCM WAV file's samples (stereo averaged to mono) as floats in [-1, 1], and its sampling rate.

    Returns:
        ``(samples (n_samples,) float32, sampling rate in Hz)``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a PCM WAV file, or samples of another width than 16 bits.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; expected a 16-bit PCM WAV file")
    try:
        with wave.open(str(path), "rb") as file:
            width, channels, rate = file.getsampwidth(), file.getnchannels(), file.getframerate()
            frames = file.readframes(file.getnframes())
    except (wave.Error, EOFError) as err:
        raise ValueError(f"{path}: not a PCM WAV file ({err or type(err).__name__})") from err
    if width != 2:
        raise ValueError(f"{path}: {8 * width}-bit samples; headlab reads 16-bit PCM WAV files")
    samples = np.frombuffer(frames, dtype="<i2").reshape(-1, channels).astype(np.float32) / 32768.0
    return samples.mean(axis=1), rate


def feature_extractor(tokenizer: Any, *, architecture: str, source: str) -> Any:
    """The feature extractor a handle's tokenizer slot holds: the slot itself (a ``WhisperFeatureExtractor``)
    or a processor's ``feature_extractor`` (a ``WhisperProcessor``).

    Args:
        tokenizer: the handle's ``tokenizer``.
        architecture: the model's class name, for the error.
        source: the handle's ``source`` (a checkpoint folder, a hub id or "in memory"), for the error.

    Raises:
        TypeError: the slot holds neither; the message says what to pass, or which file the folder lacks.
    """
    from transformers.feature_extraction_utils import FeatureExtractionMixin

    for candidate in (tokenizer, getattr(tokenizer, "feature_extractor", None)):
        if isinstance(candidate, FeatureExtractionMixin) and isinstance(getattr(candidate, "sampling_rate", None), int):
            return candidate
    held = "none" if tokenizer is None else f"a {type(tokenizer).__name__}"
    if os.path.isdir(source) and not (Path(source) / PREPROCESSOR_FILE).is_file():
        fix = f"{source} has no {PREPROCESSOR_FILE} (the checkpoint's feature extractor): add it"
    else:
        fix = ("headlab.attach(model, tokenizer=AutoProcessor.from_pretrained(checkpoint)) gives it one "
               "(a WhisperProcessor or WhisperFeatureExtractor)")
    raise TypeError(f"audio inputs need a feature extractor, and this {architecture} has {held}: {fix}, or pass "
                    "input features (batch, n_mels, frames)")


def audio_features(audio: Audio, extractor: Any, shape: tuple[int, int]) -> Tensor:
    """Features of one recording or several, from ``extractor`` (a feature extractor).

    Args:
        audio: a WAV path or a 1-D float array / tensor of samples (at the extractor's sampling rate), or a
            list of them.
        extractor: a feature extractor (``feature_extractor``).
        shape: the ``(n_mels, frames)`` the model requires (``feature_shape``).

    Returns:
        ``(batch, n_mels, frames)`` float32 on the CPU.

    Raises:
        ValueError: a WAV file at another sampling rate than the extractor's, samples that are not a 1-D float
            array, or an extractor whose features do not have the model's ``shape``.
    """
    items = [audio] if isinstance(audio, (str, os.PathLike, np.ndarray, Tensor)) else list(audio)
    samples = [_samples(item, extractor.sampling_rate) for item in items]
    features = extractor(samples, sampling_rate=extractor.sampling_rate, return_tensors="pt")[FEATURES]
    if tuple(features.shape[1:]) != shape:
        raise ValueError(f"{type(extractor).__name__} gives features {tuple(features.shape)}, but the model takes "
                         f"(batch, {shape[0]}, {shape[1]}): its feature_size, chunk_length and hop_length do not "
                         "match the model's num_mel_bins and frames")
    return features


def _samples(item: Samples, rate: int) -> np.ndarray:
    """One recording's samples at ``rate``: read from a WAV path, or an array / tensor checked."""
    if isinstance(item, (str, os.PathLike)):
        samples, found = read_wav(item)
        if found != rate:
            raise ValueError(f"{os.fspath(item)}: sampled at {found} Hz, but the feature extractor takes {rate} Hz; "
                             "resample it first (headlab does not resample)")
        return samples
    array = item.detach().cpu().numpy() if isinstance(item, Tensor) else item
    if not isinstance(array, np.ndarray) or array.ndim != 1 or not np.issubdtype(array.dtype, np.floating):
        described = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(item).__name__
        raise ValueError(f"audio samples must be a 1-D float array or tensor (n_samples,), or a WAV path; got "
                         f"{described}")
    return array.astype(np.float32, copy=False)
