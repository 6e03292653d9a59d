"""``capture_audio``: run an audio encoder-decoder (Whisper) over recordings in batches and hand the selected heads to
consumers, as ``capture`` does over a text corpus and ``capture_images`` over images.

Each recording becomes features through the checkpoint's own feature extractor, which pads (or cuts) it to the
encoder's fixed length (Whisper: 30 s), and the decoder reads ``config.decoder_start_token_id`` alone
(``HeadedModel.inputs``): one token, so that nothing but the audio decides the patterns. Each batch reaches the
consumers as a ``CaptureBatch`` whose positions are the encoder's (``headlab.models.audio.Timeline``): ``tokens``
holds their labels (``frame 0.42 s``), ``attention_mask`` and ``lengths`` the positions that hold audio (the
extractor's frame mask, one in ``encoder_stride`` frames: the rest is padding the model still attends to, never
masked), every position is its own word, and ``texts`` holds each recording's name. A layer's patterns keep the
shape its site gives them (``headlab.models.audio.site_axes``): the encoder's ``(batch, head, frames, frames)``,
the decoder's and cross-attention's ``(batch, head, 1, 1)`` and ``(batch, head, 1, frames)``.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headlab.capture.batch import CaptureBatch
from headlab.capture.run import (
    CaptureResult,
    Consumer,
    RateProgress,
    check_batch_size,
    checked_consumers,
    feed,
)
from headlab.layer.selection import HeadSelection
from headlab.layer.taps import check_take
from headlab.models import HeadedModel, headed
from headlab.models.audio import (
    FEATURES,
    Audio,
    Timeline,
    audio_sources,
    encoder_stride,
    feature_extractor,
    feature_shape,
    features_with_mask,
    samples_at,
    timeline,
    window_seconds,
)
from headlab.models.transcripts import TRANSCRIPT_TOKENS, Transcript, transcribe
from headlab.models.truncation import TruncationWarning, cut_message

__all__ = ["AudioCorpus", "audio_batch", "capture_audio"]


class AudioCorpus:
    """Recordings to run, by name, each read and turned into features when its batch comes (so that a folder of any
    size costs the memory of one batch).

    Args:
        model: an audio model's handle whose tokenizer slot holds its feature extractor (``headlab.load`` of a
            checkpoint with preprocessor_config.json).
        audio: what ``headlab.models.audio.audio_sources`` reads: a WAV file, a folder of them, samples, a list.

    Attributes:
        names: each recording's name, in order (a file's name, or ``clip {i}``).
        extractor: the feature extractor.
        timeline: the encoder's positions in time (``headlab.models.audio.timeline``).
        transcripts: each recording's greedy transcript once ``transcribe`` (``capture_audio``) made them; None
            before, or for a model without a language-model head.

    Raises:
        TypeError: a model whose handle holds no feature extractor (the message names the file a checkpoint lacks).
        ValueError / OSError: a path that does not exist, a folder without WAV files.
    """

    def __init__(self, model: HeadedModel | nn.Module, audio: Audio) -> None:
        handle = headed(model)
        self.extractor = feature_extractor(handle.tokenizer, architecture=handle.architecture, source=handle.source)
        self.timeline = timeline(handle.model, self.extractor)
        self._shape, self._stride = feature_shape(handle.model), encoder_stride(handle.model)
        found = audio_sources(audio)
        self.names, self._sources = [name for name, _ in found], [source for _, source in found]
        self.transcripts: list[Transcript] | None = None

    def __len__(self) -> int:
        return len(self.names)

    def transcribe(self, model: HeadedModel | nn.Module, *, max_tokens: int = TRANSCRIPT_TOKENS, batch_size: int = 1,
                   progress: bool = True) -> list[Transcript] | None:
        """Each recording's greedy transcript by ``model`` as it is now (``headlab.models.transcripts.transcribe``),
        kept as ``transcripts``.

        Args:
            model: the model's handle (or the attached model).
            max_tokens: most tokens after the start token; 0: none (the decoder reads its start token alone).
            batch_size: most recordings per forward.
            progress: show a progress bar over batches.

        Returns:
            One ``Transcript`` per recording, or None (kept as ``transcripts`` too) when the model has no language-model
            head or ``max_tokens`` is 0.
        """
        handle = headed(model)
        start, done, found = time.perf_counter(), 0, []
        starts = range(0, len(self), batch_size) if max_tokens else range(0)
        with handle.running(grad=False) as net, RateProgress(progress and bool(starts), len(starts),
                                                             label="transcribe") as bar:
            for first in starts:
                features = self.features(range(first, min(first + batch_size, len(self))))[0]
                made = transcribe(net, features.to(device=handle.device, dtype=handle.dtype), max_tokens=max_tokens)
                if made is None:
                    break
                found.extend(made)
                done += sum(len(t.ids) for t in made)
                bar.advance(done / max(time.perf_counter() - start, 1e-9))
        self.transcripts = found if found else None
        return self.transcripts

    def first(self, n: int) -> AudioCorpus:
        """The first ``n`` recordings (all of them when there are fewer), as a corpus of their own."""
        kept = copy.copy(self)
        kept.names, kept._sources = self.names[:n], self._sources[:n]
        kept.transcripts = None if self.transcripts is None else self.transcripts[:n]
        return kept

    def features(self, indices: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
        """The recordings ``indices``, read.

        Returns:
            ``(features (batch, n_mels, frames) float32, audio (batch, positions) bool, truncated (batch,) bool)`` on
            the CPU: ``audio`` is True at the encoder positions that hold audio (the extractor's frame mask, one in
            ``encoder_stride`` frames); ``truncated`` where a recording was longer than the extractor's window
            (``n_samples``) and was cut to it.

        Raises:
            ValueError: a WAV file at another sampling rate than the extractor's, or not a 16-bit PCM WAV file.
        """
        samples = [samples_at(self._sources[i], self.extractor.sampling_rate) for i in indices]
        features, frames, cut = features_with_mask(samples, self.extractor, self._shape)
        return features, frames[:, :: self._stride][:, : self.timeline.positions], cut


def audio_batch(line: Timeline, names: Sequence[str], indices: Sequence[int], audio: Tensor, truncated: Tensor, *,
                device: torch.device | str = "cpu") -> CaptureBatch:
    """The ``CaptureBatch`` of the recordings ``indices`` (corpus order), its positions the encoder's.

    Args:
        line: the encoder's timeline.
        names: every recording's name, in corpus order.
        indices: the batch's recordings.
        audio: ``(batch, positions)`` bool, True at the positions that hold audio (``AudioCorpus.features``).
        truncated: ``(batch,)`` bool, the recordings cut to the extractor's window.
        device: where the tensors go (the model's device).

    Returns:
        A batch with no layer captured yet: ids all 0 (a recording has none), ``attention_mask`` and ``lengths`` the
        positions that hold audio, no special token, each position its own word, each recording's name as its text
        and the positions' labels as its tokens.
    """
    batch, n = len(indices), line.positions
    labels = line.labels()
    return CaptureBatch(
        input_ids=torch.zeros(batch, n, dtype=torch.long, device=device),
        attention_mask=audio.long().to(device), lengths=audio.sum(1).to(device),
        offsets=torch.zeros(batch, n, 2, dtype=torch.long, device=device),
        word_ids=torch.arange(n, device=device).repeat(batch, 1),
        special_tokens_mask=torch.zeros(batch, n, dtype=torch.bool, device=device),
        corpus_indices=torch.as_tensor(list(indices), dtype=torch.long, device=device),
        truncated=truncated.to(device), texts=[names[i] for i in indices], tokens=[list(labels) for _ in indices],
    )


def capture_audio(
    model: HeadedModel | nn.Module,
    audio: Audio | AudioCorpus,
    *,
    heads: HeadSelection = None,
    take: str | Sequence[str] = ("pattern",),
    consumers: Iterable[Consumer] = (),
    batch_size: int = 1,
    transcript_tokens: int | None = TRANSCRIPT_TOKENS,
    progress: bool = True,
) -> tuple[CaptureResult, Timeline]:
    """Run an audio encoder-decoder over ``audio`` and give every consumer each batch's selected heads (``capture``'s
    loop, ``headlab.capture.run.feed``).

    A model with a language-model head first writes each recording's transcript (``AudioCorpus.transcribe``: greedy,
    up to ``transcript_tokens``), and its decoder reads that; without one, or with ``transcript_tokens=0``, the
    decoder reads its start token alone. A batch holds recordings whose transcripts are equally long (consecutive
    ones, up to ``batch_size``), so no decoder position is padding.

    Args:
        model: an audio model's handle with its feature extractor.
        audio: an ``AudioCorpus``, or what it takes: WAV files, folders of them, samples.
        heads: the heads to take (``headlab.heads.selection``); None for every head.
        take: any of ``headlab.layer.taps.TAKE``: "pattern", "z", "result", "q", "k", "v".
        consumers: objects with ``update(batch: CaptureBatch)``, called in order per batch.
        batch_size: most recordings per forward: one by default, as every recording runs the encoder's every position
            (Whisper: 1500) and the patterns of every captured layer are held at once.
        transcript_tokens: most tokens of each transcript after its start token; 0: none; None: the transcripts the
            corpus holds as they are (``AudioCorpus.transcripts``, made by its ``transcribe``; none: the start token).
        progress: show progress bars over batches.

    Returns:
        ``(counts and throughput, the encoder's timeline)``: ``tokens`` counts the positions that hold audio,
        ``padded_tokens`` every encoder position run; ``truncated`` lists the recordings cut to the extractor's
        window; the corpus is described by the recordings' names, the timeline and what the decoder read
        (``decoder``: "transcripts" with their mean length in tokens and how many ended by themselves, or "start
        token"). The transcripts stay on the corpus (``AudioCorpus.transcripts``).

    Raises:
        TypeError: a consumer without ``update``; a model without a feature extractor.
        ValueError / OSError: bad recordings (``AudioCorpus``), a bad selection, ``batch_size`` or
            ``transcript_tokens``.

    Warns:
        TruncationWarning: recordings longer than the extractor's window, cut to it (``cut_message``).
    """
    start = time.perf_counter()
    take = check_take(take)
    check_batch_size(batch_size, "recordings per forward")
    handle = headed(model)
    consumers = checked_consumers(consumers)
    selection = handle.heads(heads)
    corpus = audio if isinstance(audio, AudioCorpus) else AudioCorpus(handle, audio)
    names, device, line = corpus.names, handle.device, corpus.timeline
    transcripts = corpus.transcripts if transcript_tokens is None else corpus.transcribe(
        handle, max_tokens=transcript_tokens, batch_size=batch_size, progress=progress)
    batches = _batches(len(names), batch_size, None if transcripts is None else [len(t.read) for t in transcripts])
    real: list[int] = []
    truncated: list[int] = []

    def step(indices: list[int]) -> tuple[CaptureBatch, dict[str, Any], int]:
        features, frames, cut = corpus.features(indices)
        real.append(int(frames.sum()))
        truncated.extend(i for i, flag in zip(indices, cut.tolist()) if flag)
        given: dict[str, Any] = {FEATURES: features.to(dtype=handle.dtype)}
        if transcripts is not None:
            given["decoder_input_ids"] = torch.tensor([transcripts[i].read for i in indices])
        kwargs = handle.inputs(given)  # no transcript: the decoder reads its start token alone
        return audio_batch(line, names, indices, frames, cut, device=device), kwargs, real[-1]

    feed(handle, selection, take, consumers, (step(indices) for indices in batches), total=len(batches),
         progress=progress, start=start)
    if truncated:
        warnings.warn(cut_message(truncated, len(names), window_seconds(corpus.extractor)), TruncationWarning,
                      stacklevel=2)
    decoder: dict[str, Any] = {"reads": "start token"} if transcripts is None else {
        "reads": "transcripts", "mean_tokens": sum(len(t.read) for t in transcripts) / len(transcripts),
        "ended": sum(t.ended for t in transcripts)}
    run = CaptureResult(items=len(names), tokens=sum(real), padded_tokens=len(names) * line.positions,
                        batches=len(batches), truncated=truncated, max_length=None, layers=selection, take=take,
                        seconds=time.perf_counter() - start,
                        corpus={"recordings": len(names), "names": names[:10], "timeline": line.to_dict(),
                                "decoder": decoder})
    return run, line


def _batches(n: int, batch_size: int, lengths: Sequence[int] | None) -> list[list[int]]:
    """Consecutive runs of the ``n`` recordings, each at most ``batch_size`` long and of one transcript length
    (``lengths``; None: any)."""
    out: list[list[int]] = []
    for i in range(n):
        if out and len(out[-1]) < batch_size and (lengths is None or lengths[out[-1][0]] == lengths[i]):
            out[-1].append(i)
        else:
            out.append([i])
    return out
