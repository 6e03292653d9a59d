"""Audio inputs of a model that takes log-mel features (``main_input_name == "input_features"``: Whisper and
its kin): the features' shape the encoder requires, WAV files, samples turned into features by the model's own
feature extractor, and the labels of its positions.

Notation: features are ``(batch, n_mels, frames)``; samples are ``(n_samples,)``, mono, at the feature
extractor's sampling rate. headlab never resamples. The encoder's convolutions subsample the feature frames
(``encoder_stride`` of them per encoder position), so encoder position ``i`` starts ``i × stride × hop_length /
sampling_rate`` seconds into the recording: its label is ``frame 0.42 s`` (``Timeline``). An encoder-decoder's
sites run over two axes (``site_axes``): the encoder's frames (``FRAMES``) and the decoder's tokens (``TOKENS``),
labelled by the processor's tokenizer, or ``tok 50258`` (the id) without one.
"""

from __future__ import annotations

import math
import os
import warnings
import wave
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from headlab.models.media import Medium
from headlab.models.transcripts import token_labels
from headlab.models.truncation import TruncationWarning, cut_message

if TYPE_CHECKING:
    from headlab.models.site import AttentionSite

FEATURES = "input_features"  # the main input name of a model that takes log-mel features
PREPROCESSOR_FILE = "preprocessor_config.json"  # where a checkpoint keeps its feature extractor
Samples = str | os.PathLike[str] | np.ndarray | Tensor  # one recording: a WAV path or its samples
Audio = Samples | Sequence[Samples]  # one recording or several
RECORDINGS = Medium(suffixes=(".wav",), folder="a folder of WAV files", item="recording",  # 16-bit PCM WAV files
                    missing="a WAV file or a folder of them", nothing="a WAV file, a folder of them or samples",
                    given="recording")
FRAMES, TOKENS = "frames", "tokens"  # the axes of an audio encoder-decoder's sites: its encoder's, its decoder's


def takes_features(model: nn.Module) -> bool:
    """Whether ``model``'s main input is log-mel features (``main_input_name == "input_features"``)."""
    return getattr(model, "main_input_name", None) == FEATURES


def feature_shape(model: nn.Module) -> tuple[int, int]:
    """The ``(n_mels, frames)`` of the features ``model``'s encoder requires: ``config.num_mel_bins``, and
    ``encoder_positions`` × ``encoder_stride`` frames.

    Raises:
        ValueError: the config has no ``num_mel_bins`` or ``max_source_positions``, or the encoder no
            ``Conv1d``; the message names what is missing.
    """
    n_mels = getattr(getattr(model, "config", None), "num_mel_bins", None)
    if not isinstance(n_mels, int):
        raise ValueError(f"{type(model).__name__} takes input_features, but its config has no num_mel_bins: cannot "
                         "tell its mel bins")
    return n_mels, encoder_positions(model) * encoder_stride(model)


def encoder_positions(model: nn.Module) -> int:
    """The positions of ``model``'s encoder: ``config.max_source_positions`` (Whisper: 1500, its 30 s).

    Raises:
        ValueError: the config has none.
    """
    positions = getattr(getattr(model, "config", None), "max_source_positions", None)
    if not isinstance(positions, int):
        raise ValueError(f"{type(model).__name__} takes input_features, but its config has no max_source_positions: "
                         "cannot tell the frames its encoder requires")
    return positions


def encoder_stride(model: nn.Module) -> int:
    """Feature frames per encoder position: the product of the strides of the encoder's 1-D convolutions, which
    subsample the frames (Whisper's conv1 and conv2: 1 × 2).

    Raises:
        ValueError: the encoder has no ``Conv1d``.
    """
    # a transformers model's get_encoder is the model itself when it has no encoder
    encoder = cast(Any, model).get_encoder() if hasattr(model, "get_encoder") else model
    strides = [m.stride[0] for m in encoder.modules() if isinstance(m, nn.Conv1d)]
    if not strides:
        raise ValueError(f"{type(model).__name__} takes input_features, but its encoder has no Conv1d: cannot tell "
                         "how many frames make one of its max_source_positions")
    return int(np.prod(strides))


def frame_seconds(model: nn.Module, extractor: Any) -> float:
    """Seconds per encoder position: ``encoder_stride × hop_length / sampling_rate`` (Whisper: 2 × 160 / 16 000 =
    0.02 s).

    Args:
        model: the model itself.
        extractor: its feature extractor (``feature_extractor``).

    Raises:
        ValueError: the extractor has no positive int ``hop_length`` or ``sampling_rate``, or the encoder no
            ``Conv1d``.
    """
    hop, rate = getattr(extractor, "hop_length", None), getattr(extractor, "sampling_rate", None)
    if not (isinstance(hop, int) and hop > 0 and isinstance(rate, int) and rate > 0):
        raise ValueError(f"{type(extractor).__name__} has hop_length={hop!r}, sampling_rate={rate!r}; expected "
                         "positive ints to tell the time of a frame")
    return encoder_stride(model) * hop / rate


@dataclass(frozen=True)
class Timeline:
    """Where an audio encoder's positions lie in time.

    Attributes:
        positions: the encoder's positions (``encoder_positions``).
        seconds: seconds per position (``frame_seconds``); None where no feature extractor tells.
    """

    positions: int
    seconds: float | None

    @property
    def unit(self) -> str:
        """What ``times`` counts: ``"s"``, or ``"frames"`` without ``seconds``."""
        return "frames" if self.seconds is None else "s"

    def labels(self) -> list[str]:
        """Every position's label: ``frame 0.42 s``, its start with as many decimals as keep two positions apart
        (at least 2); ``frame 3`` (the position) without ``seconds``."""
        if self.seconds is None:
            return [f"frame {i}" for i in range(self.positions)]
        decimals = max(2, math.ceil(-math.log10(self.seconds)))
        return [f"frame {i * self.seconds:.{decimals}f} s" for i in range(self.positions)]

    def times(self) -> Tensor:
        """``(positions,)`` float64: each position's start in ``unit`` (seconds, or positions)."""
        return torch.arange(self.positions, dtype=torch.float64) * (1.0 if self.seconds is None else self.seconds)

    def to_dict(self) -> dict[str, Any]:
        return {"positions": self.positions, "seconds": self.seconds}


def timeline(model: nn.Module, extractor: Any = None) -> Timeline:
    """The ``Timeline`` of ``model``'s encoder, its seconds from ``extractor`` (None: positions only).

    Raises:
        ValueError: as ``encoder_positions`` and ``frame_seconds`` raise.
    """
    return Timeline(positions=encoder_positions(model),
                    seconds=None if extractor is None else frame_seconds(model, extractor))


def site_axes(site: AttentionSite) -> tuple[str, str]:
    """The axes of a site's pattern, ``(queries, keys)``, in an audio encoder-decoder: cross-attention ``(TOKENS,
    FRAMES)``, the decoder's self-attention (the causal one) ``(TOKENS, TOKENS)``, the encoder's ``(FRAMES,
    FRAMES)``."""
    if site.cross:
        return TOKENS, FRAMES
    return (TOKENS, TOKENS) if site.causal else (FRAMES, FRAMES)


def axis_labels(model: nn.Module, tokenizer: Any, inputs: Mapping[str, Any]) -> dict[str, list[list[str]]]:
    """Each item's labels on the axes of an audio encoder-decoder: ``FRAMES`` (``Timeline.labels``, in seconds when
    the handle holds a feature extractor) and, when ``inputs`` has ``decoder_input_ids``, ``TOKENS``: the tokens of
    the processor's tokenizer, or ``tok {id}`` without one.

    Args:
        model: the model itself.
        tokenizer: the handle's tokenizer slot (a processor, a feature extractor, or None).
        inputs: keyword arguments of a forward, with ``input_features`` ``(batch, n_mels, frames)``.

    Raises:
        ValueError: inputs without ``input_features``.
    """
    features = inputs.get(FEATURES)
    if not isinstance(features, Tensor) or features.dim() != 3:
        raise ValueError(f"inputs have no {FEATURES} (batch, n_mels, frames); got {sorted(inputs)}")
    frames = timeline(model, held_extractor(tokenizer)).labels()
    out = {FRAMES: [list(frames) for _ in range(len(features))]}
    ids = inputs.get("decoder_input_ids")
    if isinstance(ids, Tensor) and ids.dim() == 2:
        out[TOKENS] = [token_labels(tokenizer, row) for row in ids.cpu().tolist()]
    return out


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
    found = held_extractor(tokenizer)
    if found is not None:
        return found
    held = "none" if tokenizer is None else f"a {type(tokenizer).__name__}"
    if os.path.isdir(source) and not (Path(source) / PREPROCESSOR_FILE).is_file():
        fix = f"{source} has no {PREPROCESSOR_FILE} (the checkpoint's feature extractor): add it"
    else:
        fix = ("headlab.attach(model, tokenizer=AutoProcessor.from_pretrained(checkpoint)) gives it one "
               "(a WhisperProcessor or WhisperFeatureExtractor)")
    raise TypeError(f"audio inputs need a feature extractor, and this {architecture} has {held}: {fix}, or pass "
                    "input features (batch, n_mels, frames)")


def held_extractor(tokenizer: Any) -> Any:
    """The feature extractor a handle's tokenizer slot holds (``feature_extractor``), or None."""
    from transformers.feature_extraction_utils import FeatureExtractionMixin

    for candidate in (tokenizer, getattr(tokenizer, "feature_extractor", None)):
        if isinstance(candidate, FeatureExtractionMixin) and isinstance(getattr(candidate, "sampling_rate", None), int):
            return candidate
    return None


def audio_sources(audio: Audio) -> list[tuple[str, Samples]]:
    """Each recording of ``audio`` with its name, not read yet: a folder becomes its WAV files, sorted by name.

    Args:
        audio: a WAV file, a folder of them, a 1-D array / tensor of samples, or a list of them.

    Returns:
        ``[(name, path or samples)]``: a file's name, or ``"clip {i}"`` for samples (``i``: its place).

    Raises:
        FileNotFoundError: a path that does not exist.
        NotADirectoryError / ValueError: a folder without recordings; no recording at all.
    """
    items = [audio] if isinstance(audio, (str, os.PathLike, np.ndarray, Tensor)) else list(audio)
    return RECORDINGS.sources(items, in_memory=lambda _, place: f"clip {place}")


def audio_features(audio: Audio, extractor: Any, shape: tuple[int, int]) -> Tensor:
    """Features of one recording or several, from ``extractor`` (a feature extractor): ``features_with_mask``'s
    features.

    Warns:
        TruncationWarning: recordings longer than the extractor's window, cut to it (``cut_message``).
    """
    features, _, cut = features_with_mask(audio, extractor, shape)
    if cut.any():
        warnings.warn(cut_message(cut.nonzero().flatten().tolist(), len(cut), window_seconds(extractor)),
                      TruncationWarning, stacklevel=4)
    return features


def features_with_mask(audio: Audio, extractor: Any, shape: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """Features of one recording or several, from ``extractor`` (a feature extractor), which frames hold audio and
    which recordings were cut.

    Args:
        audio: a WAV path or a 1-D float array / tensor of samples (at the extractor's sampling rate), or a
            list of them.
        extractor: a feature extractor (``feature_extractor``).
        shape: the ``(n_mels, frames)`` the model requires (``feature_shape``).

    Returns:
        ``(features (batch, n_mels, frames) float32, mask (batch, frames) bool, cut (batch,) bool)`` on the CPU: the
        mask is True at the frames that hold audio, the rest padding (the extractor's ``attention_mask``; every frame
        where it gives none); ``cut`` where a recording was longer than the extractor's window (``n_samples``, as
        ``window_seconds`` says) and the extractor cut it to the window.

    Raises:
        ValueError: a WAV file at another sampling rate than the extractor's, samples that are not a 1-D float
            array, or an extractor whose features do not have the model's ``shape``.
    """
    items = [audio] if isinstance(audio, (str, os.PathLike, np.ndarray, Tensor)) else list(audio)
    samples = [samples_at(item, extractor.sampling_rate) for item in items]
    made = extractor(samples, sampling_rate=extractor.sampling_rate, return_tensors="pt", return_attention_mask=True)
    features = made[FEATURES]
    mask = made.get("attention_mask")
    if tuple(features.shape[1:]) != shape:
        raise ValueError(f"{type(extractor).__name__} gives features {tuple(features.shape)}, but the model takes "
                         f"(batch, {shape[0]}, {shape[1]}): its feature_size, chunk_length and hop_length do not "
                         "match the model's num_mel_bins and frames")
    frames = torch.ones(features.shape[0], shape[1], dtype=torch.bool) if mask is None else mask.bool()
    window = getattr(extractor, "n_samples", None)
    cut = torch.tensor([isinstance(window, int) and len(s) > window for s in samples], dtype=torch.bool)
    return features, frames, cut


def window_seconds(extractor: Any) -> float:
    """The longest recording ``extractor`` keeps whole, in seconds: ``n_samples / sampling_rate`` (Whisper: 30)."""
    return float(getattr(extractor, "n_samples", 0)) / extractor.sampling_rate


def samples_at(item: Samples, rate: int) -> np.ndarray:
    """One recording's samples at ``rate``: read from a WAV path, or an array / tensor checked.

    Raises:
        ValueError: a WAV file at another rate than ``rate``, or samples that are not a 1-D float array.
    """
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
