"""``analyze_audio``: the head analyses of an audio encoder-decoder (Whisper) on recordings, as ``analyze`` runs them
on text and ``analyze_images`` on images.

One capture pass over the recordings (``headlab.capture.audio.capture_audio``: each padded to the encoder's window
by the feature extractor; the decoder reading the model's own greedy transcript of it, or its start token alone
without a language-model head) feeds ``AudioStats`` (entropy, the time between a frame and the frames it attends
to, the spread of cross-attention over the audio and how it follows the transcript, the shares on the first frame
and on the padding: ``headlab.analysis.frames``) and ``HeadSimilarity`` on the encoder's self-attention heads.
Importance (gradient; exact ablation without ``quick``) and the pruning curve measure the heads on the model's own
task, transcription, with its transcripts as the reference (``transcript_loss``, ``transcript_agreement``). What
only means something for text is skipped with the reason on record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from headlab.analysis.capture_pass import SIMILARITY_ROW_FRACTION
from headlab.analysis.frames import AudioStats, audio_roles
from headlab.analysis.result import AnalysisResult
from headlab.analysis.similarity import HeadSimilarity, SimilarityResult, mds
from headlab.capture.audio import AudioCorpus, capture_audio
from headlab.capture.batch import CaptureBatch
from headlab.capture.run import Consumer
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel, headed
from headlab.models.audio import FEATURES, FRAMES, Audio, site_axes

__all__ = ["AGREEMENT", "QUICK_RECORDINGS", "SKIPPED", "analyze_audio", "transcript_agreement", "transcript_batches",
           "transcript_loss"]

QUICK_RECORDINGS = 60  # recordings analysed with quick=True (the first, in order), as 60 corpus items are for text
TASK_RECORDINGS = (16, 64)  # recordings of the importance task and the pruning curve: (quick, full)
AGREEMENT = "transcript agreement"  # the pruning curve's metric: tokens of the transcripts still ranked first

# What ``analyze`` runs on text and not on recordings, and why (``AnalysisResult.skipped``).
SKIPPED = {
    "text statistics and roles": "to_prev, to_next, to_punct, to_sep and distance read a text's order, punctuation "
                                 "and separators; on audio the statistics are time_distance, time_spread, to_first, "
                                 "to_padding, entropy (headlab.analysis.frames), the roles sink, broad and local",
    "pattern classes": "Kovaleva et al.'s classes read a text's diagonal and sentences; a recording's frames lie in "
                       "time (time_distance measures how far a head looks)",
    "syntax": "dependency relations are a text's; a recording has none",
    "causal probes": "duplicate-token and induction probes need a causal text model",
    "retrieval and streaming heads": "both run on text (copied spans, the next-token loss)",
    "value-weighted attention and sink share by position": "their sink tokens and position bins are a text's; the "
                                                           "share on the first frame is to_first, on the padding "
                                                           "beyond the audio to_padding",
    "importance": "no audio task with a gradient: the model has no language-model head to write the transcripts "
                  "its heads would be measured on (a WhisperForConditionalGeneration has one)",
    "similarity of the decoder's and cross-attention heads": "head similarity compares heads on the same query rows "
                                                             "and keys: it runs on the encoder's self-attention heads "
                                                             "(frames × frames)",
}


def analyze_audio(
    model: HeadedModel | nn.Module,
    audio: Audio,
    *,
    heads: HeadSelection = None,
    quick: bool = False,
    importance: bool = True,
    progress: bool = True,
) -> AnalysisResult:
    """Run the head analyses that mean something for audio on an audio encoder-decoder.

    Args:
        model: an audio model's handle with its feature extractor (``headlab.load`` of a checkpoint with
            preprocessor_config.json).
        audio: a folder of WAV files, WAV files, 1-D sample arrays, or a list of them
            (``headlab.capture.audio.AudioCorpus``).
        heads: the heads of the capture pass; None for all.
        quick: the first ``QUICK_RECORDINGS`` recordings.
        importance: run gradient importance (and, without ``quick``, exact ablation) and the pruning curve on the
            transcripts (skipped with the reason for a model without a language-model head).
        progress: show the capture's progress bar.

    Returns:
        An ``AnalysisResult`` with ``timeline`` set: ``surface`` is ``AudioStats``' table, ``roles``
        ``audio_roles``, ``similarity`` the encoder's self-attention heads'; ``importance`` and ``pruning``
        (``AGREEMENT``) with a language-model head; ``skipped`` holds ``SKIPPED`` (importance's reason only without
        one).

    Raises:
        TypeError: a model without a feature extractor (the message names the file a checkpoint lacks).
        ValueError / OSError: bad recordings or selection.
    """
    handle = headed(model)
    corpus = AudioCorpus(handle, audio)
    if quick:
        corpus = corpus.first(QUICK_RECORDINGS)
    axes = {site.layer: site_axes(site) for site in handle.sites}
    selection = handle.heads(heads)
    encoder = {layer for layer in selection if axes[layer] == (FRAMES, FRAMES)}
    stats, similarity = AudioStats(timeline=corpus.timeline, axes=axes), HeadSimilarity(
        row_fraction=SIMILARITY_ROW_FRACTION)  # the encoder's rows: every batch's frames that hold audio
    run, line = capture_audio(handle, corpus, heads=selection, consumers=[stats, _Layers(similarity, encoder)],
                              progress=progress)
    surface = stats.result()
    similar = similarity.result() if encoder else SimilarityResult(np.zeros((0, 0)), [], 0, 0)
    skipped = dict(SKIPPED)
    if not encoder:
        skipped["similarity"] = "no layer of the encoder's self-attention selected (it runs on those alone)"
    result = AnalysisResult(capture=run, surface=surface, roles=audio_roles(surface), taxonomy=None, classes={},
                            similarity=similar, embedding=mds(similar.distances), skipped=skipped, timeline=line)
    if not importance:
        skipped["importance"] = "not asked for"
    elif corpus.transcripts is not None:
        del skipped["importance"]
        batches = transcript_batches(corpus, range(min(TASK_RECORDINGS[0 if quick else 1], len(corpus))),
                                     device=handle.device, dtype=handle.dtype)
        result.measure_importance(handle, batches, transcript_loss, {AGREEMENT: transcript_agreement(handle, batches)},
                                  quick=quick)
    return result


def transcript_batches(corpus: AudioCorpus, indices: Iterable[int], *, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32) -> list[dict[str, Tensor]]:
    """One batch per recording of ``indices`` for ``transcript_loss``: its features and its transcript
    (``AudioCorpus.transcripts``, which must be made), ``{"input_features": (1, n_mels, frames), "ids": (1,
    tokens)}`` on ``device``."""
    assert corpus.transcripts is not None  # made by the capture
    return [{FEATURES: corpus.features([i])[0].to(device=device, dtype=dtype),
             "ids": torch.tensor([corpus.transcripts[i].ids], device=device)} for i in indices]


def transcript_loss(net: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """The cross-entropy of a recording's own transcript, every token after the start read behind the ones before
    (teacher forcing): the task the model's heads serve, with its greedy transcript as the reference."""
    ids = batch["ids"]
    logits = net(input_features=batch[FEATURES], decoder_input_ids=ids[:, :-1], use_cache=False).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())


def transcript_agreement(model: HeadedModel | nn.Module, batches: list[dict[str, Tensor]]) -> Callable[[Any], float]:
    """A ``metric_fn``: the share of the transcripts' tokens (after the start) that the model, read behind the
    tokens before, still ranks first; 1 for the model that wrote them, which is the reference."""
    def agreement(current: Any) -> float:
        handle = headed(current)
        same = total = 0
        with handle.running(grad=False) as net:
            for batch in batches:
                ids = batch["ids"]
                logits = net(input_features=batch[FEATURES], decoder_input_ids=ids[:, :-1], use_cache=False).logits
                same += int((logits.argmax(-1) == ids[:, 1:]).sum())
                total += ids[:, 1:].numel()
        return same / max(total, 1)

    return agreement


class _Layers:
    """A consumer that hands ``consumer`` each batch with the ``layers`` alone (none: nothing)."""

    def __init__(self, consumer: Consumer, layers: set[int]) -> None:
        self.consumer, self.layers = consumer, layers

    def update(self, batch: CaptureBatch) -> None:
        kept = {layer: taken for layer, taken in batch.layers.items() if layer in self.layers}
        if kept:
            self.consumer.update(replace(batch, layers=kept))
