"""``audio_view_data``: what the attention viewer shows of an audio encoder-decoder (Whisper): each recording's encoder
frames as a strip of times beside its decoder's tokens, every selected head's pattern over its site's axes
(``headlab.models.audio.site_axes``: the encoder's frames × frames, the decoder's tokens × tokens, cross-attention's
tokens × frames) and each head's statistics on these recordings (``headlab.analysis.frames``).

Axis legend:
    patterns   (head, query_pos, key_pos)   one recording's shown heads, encoded (``encoding.quantize``), each over
                                            its own axes (``ViewerData.axes``)
    frames     the encoder's positions (``frame 0.42 s``), of which the first ``FrameStrip.audio`` hold audio
    tokens     the decoder's positions: the recording's transcript by the model (``headlab.models.transcripts``), or
               its start token alone for a model without a language-model head

One capture pass (``headlab.capture.audio.capture_audio``) feeds the collector below, which encodes each recording's
patterns as its batch arrives, and ``AudioStats``. Rollout and flow multiply a layer's pattern into the next one's,
which two sequences do not allow: the page has neither. It draws a head's attention from a hovered token or frame
as heat over the frames (``static/audio.js``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from headlab.analysis.frames import AUDIO_STATISTICS, AudioStats, audio_roles
from headlab.capture import CaptureBatch
from headlab.capture.audio import AudioCorpus, capture_audio
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel, headed
from headlab.models.audio import FRAMES, TOKENS, Audio, site_axes
from headlab.models.seq2seq import start_token
from headlab.models.transcripts import token_labels
from headlab.report.provenance import model_name
from headlab.report.viewer.encoding import quantize, thumbnails
from headlab.report.viewer.payload import MAX_ENTRIES, FrameStrip, HeadInfo, Level, ViewerData, ViewerItem

__all__ = ["audio_view_data"]


def audio_view_data(
    model: HeadedModel | nn.Module,
    audio: Audio,
    *,
    heads: HeadSelection = None,
    corpus_rows: Sequence[Mapping[str, Any]] | None = None,
    max_entries: int = MAX_ENTRIES,
    progress: bool = False,
) -> ViewerData:
    """Run an audio encoder-decoder on ``audio`` and encode what the viewer shows.

    Args:
        model: an audio model's handle with its feature extractor (``headlab.load`` of a checkpoint with
            preprocessor_config.json), or an attached model whose handle has one.
        audio: a WAV file, a folder of them, samples, or a list of them (``headlab.capture.audio.AudioCorpus``); the
            viewer switches between them.
        heads: the heads to show (``headlab.heads.selection``); None for all.
        corpus_rows: per-head rows of a corpus-wide analysis (``AnalysisResult.rows()``), shown beside the
            statistics measured on ``audio``.
        max_entries: most pattern entries (Σ over heads of queries × keys, every recording) the page may carry.
        progress: show the capture's progress bar.

    Returns:
        The viewer's data: one item per recording, its decoder tokens at the ``pieces`` level (no word level), its
        frames in ``ViewerItem.frames``; each head's axes in ``ViewerData.axes``, its ``AudioStats`` and
        ``audio_roles``; no rollout, no flow.

    Raises:
        ValueError: a bad selection, more than ``max_entries`` entries (the message gives the count and how to cut
            it), bad recordings.
        TypeError: a model without a feature extractor (the message names the file a checkpoint lacks).
    """
    handle = headed(model)
    corpus = AudioCorpus(handle, audio)
    n_heads = handle.n_heads
    selection = handle.heads(heads)
    shown = [(layer, h) for layer, hs in selection.items() for h in hs]
    axes = {site.layer: site_axes(site) for site in handle.sites}
    frames = corpus.timeline.labels()
    transcripts = corpus.transcribe(handle, progress=progress)  # None: the decoder reads its start token alone
    start = (start_token(handle.model),) if any(TOKENS in pair for pair in axes.values()) else ()
    tokens = [token_labels(handle.tokenizer, start if transcripts is None else transcripts[k].read)
              for k in range(len(corpus))]
    sizes = [{FRAMES: len(frames), TOKENS: len(t)} for t in tokens]
    entries = sum(size[axes[layer][0]] * size[axes[layer][1]] for size in sizes for layer, _ in shown)
    if entries > max_entries:
        raise ValueError(f"{len(corpus)} recording(s) × {len(shown)} heads need {entries:,} pattern entries, more than "
                         f"max_entries={max_entries:,}; show fewer heads (--layers/--heads) or fewer recordings")
    collector, stats = _Collector(shown, tokens), AudioStats(timeline=corpus.timeline, axes=axes)
    capture_audio(handle, corpus, heads=selection, take=("pattern",), consumers=[collector, stats],
                  transcript_tokens=None, progress=progress)
    table = stats.result()
    roles = audio_roles(table)
    by_head = {(int(r["layer"]), int(r["head"])): dict(r) for r in corpus_rows or ()}
    info = []
    for layer, head in shown:
        values = {name: table.value(name, layer, head) for name in AUDIO_STATISTICS}
        info.append(HeadInfo(layer=layer, head=head, roles=roles.get((layer, head), ()), pattern_class="",
                             stats={k: v for k, v in values.items() if v == v},  # NaN: not this site's
                             corpus=by_head.get((layer, head))))
    items = [ViewerItem(text=name, full_length=len(tokens[k]), truncated=False, pieces=collector.levels[k],
                        words=None, frames=FrameStrip(labels=frames, audio=collector.audio[k]))
             for k, name in enumerate(corpus.names)]
    return ViewerData(name=model_name(handle.source), source=handle.source, architecture=handle.architecture,
                      causal=False, n_heads=n_heads, heads=shown, info=info, items=items, max_length=None,
                      axes=[axes[layer] for layer, _ in shown])


class _Collector:
    """A capture consumer that encodes each recording's shown heads as its batch arrives."""

    def __init__(self, shown: list[tuple[int, int]], tokens: list[list[str]]) -> None:
        self.shown, self.tokens = shown, tokens  # each recording's decoder tokens
        self.levels: dict[int, Level] = {}
        self.audio: dict[int, int] = {}

    def update(self, batch: CaptureBatch) -> None:
        layers = batch.layers
        for row in range(len(batch)):
            index = int(batch.corpus_indices[row])
            labels = self.tokens[index]
            n = len(labels)
            patterns = []
            for layer, head in self.shown:
                pattern = layers[layer].pattern
                assert pattern is not None  # captured with take=("pattern",)
                patterns.append(pattern[row, layers[layer].heads.index(head)].float().cpu())
            size, thumbs = thumbnails(patterns)
            gaps = ["" if i == 0 else " " for i in range(n)]
            self.levels[index] = Level(name="pieces", labels=list(labels), gaps=gaps, tail="", special=[False] * n,
                                       pieces=[1] * n, patterns=[quantize(p) for p in patterns], thumb_size=size,
                                       thumbs=thumbs)
            self.audio[index] = int(batch.lengths[row])
