"""``AudioStats`` (``headlab.analysis.frames``): an audio encoder-decoder's heads on hand-made patterns over a known
timeline, where every statistic can be worked out by hand: only the frames that hold audio count as queries, the
padding's share is measured, each site has the statistics of its axes; merging halves gives the whole; the roles
follow their thresholds; the sentences cite the table.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headlab.analysis.frames import AudioStats, audio_roles, audio_sentences, audio_statistics, site_kinds
from headlab.capture import LayerCapture
from headlab.capture.audio import audio_batch
from headlab.models.audio import FRAMES, TOKENS, Timeline

LINE = Timeline(positions=4, seconds=0.5)  # frames at 0, 0.5, 1 and 1.5 s
AXES = {0: (FRAMES, FRAMES), 1: (TOKENS, FRAMES), 2: (TOKENS, TOKENS)}  # the encoder, cross-attention, the decoder


def _batch(encoder: torch.Tensor, cross: torch.Tensor, audio: list[int], first: int = 0):
    """A recording batch: ``encoder`` ``(batch, head, 4, 4)`` as layer 0, ``cross`` ``(batch, head, 1, 4)`` as
    layer 1, the decoder's 1 × 1 as layer 2; ``audio[i]`` frames of item ``i`` hold audio."""
    held = torch.arange(4)[None, :] < torch.tensor(audio)[:, None]
    batch = audio_batch(LINE, [f"clip {i}" for i in range(first + len(audio))], range(first, first + len(audio)), held,
                        torch.zeros(len(audio), dtype=torch.bool))
    batch.layers = {0: LayerCapture(layer=0, heads=tuple(range(encoder.shape[1])), pattern=encoder),
                    1: LayerCapture(layer=1, heads=tuple(range(cross.shape[1])), pattern=cross),
                    2: LayerCapture(layer=2, heads=(0,), pattern=torch.ones(len(audio), 1, 1, 1, dtype=encoder.dtype))}
    return batch


def _patterns() -> tuple[torch.Tensor, torch.Tensor]:
    """One recording whose first 2 frames hold audio. The encoder: head 0 puts half on the first frame and half on
    the last (padding); head 1 spreads evenly; head 2 attends to itself. Cross-attention: head 0 reads frame 1
    alone, head 1 frames 0 and 1 evenly."""
    encoder = torch.zeros(1, 3, 4, 4, dtype=torch.float64)
    encoder[0, 0, :, 0] = encoder[0, 0, :, 3] = 0.5
    encoder[0, 1] = 0.25
    encoder[0, 2] = torch.eye(4)
    encoder[0, :, 2:] = 9.0  # the padding's own rows: left out of every statistic
    cross = torch.zeros(1, 2, 1, 4, dtype=torch.float64)
    cross[0, 0, 0, 1] = 1.0
    cross[0, 1, 0, :2] = 0.5
    return encoder, cross


def test_every_statistic_as_worked_out_by_hand():
    stats = AudioStats(timeline=LINE, axes=AXES)
    stats.update(_batch(*_patterns(), audio=[2]))
    table = stats.result()
    assert table.value("n_queries", 0, 0) == 2 and table.value("n_queries", 1, 0) == 1  # audio frames; the token
    # head 0: half on frame 0, half on the padding; among the audio, frame 0 alone: 0 s from frame 0, 0.5 s from 1
    assert table.value("to_first", 0, 0) == pytest.approx(0.5) and table.value("to_padding", 0, 0) == pytest.approx(0.5)
    assert table.value("time_distance", 0, 0) == pytest.approx(0.25) and table.value("time_spread", 0, 0) == 0
    assert table.value("entropy", 0, 0) == pytest.approx(math.log(2)) and table.value("to_self", 0, 0) == 0.25
    # head 1: even, so its distance is even attention's (0.25 s), its spread that of {0, 0.5 s}
    assert table.value("time_distance", 0, 1) == pytest.approx(table.value("uniform_distance", 0, 1)) == 0.25
    assert table.value("time_spread", 0, 1) == pytest.approx(0.25) and table.value("to_padding", 0, 1) == 0.5
    assert table.value("entropy", 0, 1) == pytest.approx(math.log(4)) == table.value("uniform_entropy", 0, 1)
    assert table.value("time_distance", 0, 2) == 0 and table.value("to_self", 0, 2) == 1
    # cross-attention: a time spread and a padding share, no distance (its query is no frame), no to_self
    assert table.value("time_spread", 1, 0) == 0 and table.value("time_spread", 1, 1) == pytest.approx(0.25)
    assert table.value("to_first", 1, 1) == 0.5 and table.value("confidence", 1, 0) == 1
    assert math.isnan(table.value("time_distance", 1, 0)) and math.isnan(table.value("to_self", 1, 0))
    # the decoder's start token alone: its own distribution, no time
    assert table.value("to_self", 2, 0) == 1 and math.isnan(table.value("time_spread", 2, 0))
    assert site_kinds(table) == {(0, 0): "encoder", (0, 1): "encoder", (0, 2): "encoder", (1, 0): "cross",
                                 (1, 1): "cross", (2, 0): "decoder"}
    # roles for heads of more than one key: the decoder's single key is everything's, and no role
    assert audio_roles(table) == {(0, 0): (), (0, 1): ("broad",), (0, 2): ("local",), (1, 0): (), (1, 1): (),
                                  (2, 0): ()}
    assert audio_statistics(table) == ("entropy", "to_first", "to_padding", "time_distance", "time_spread", "to_self",
                                       "confidence")


def test_merged_halves_give_the_whole():
    encoder, cross = _patterns()
    encoder, cross = torch.cat([encoder, encoder.flip(1)]), torch.cat([cross, cross.flip(1)])  # heads swapped
    whole, first, second = (AudioStats(timeline=LINE, axes=AXES) for _ in range(3))
    whole.update(_batch(encoder, cross, audio=[2, 3]))
    first.update(_batch(encoder[:1], cross[:1], audio=[2]))
    second.update(_batch(encoder[1:], cross[1:], audio=[3], first=1))
    merged = first.merge(second).result()
    for name in whole.result().columns:
        np.testing.assert_allclose(merged[name], whole.result()[name], rtol=1e-12)
    with pytest.raises(ValueError, match="cannot merge"):
        AudioStats(timeline=LINE, axes=AXES).merge(AudioStats(timeline=Timeline(positions=4, seconds=1.0), axes=AXES))


def test_patterns_over_other_frames_are_refused():
    encoder, cross = _patterns()
    with pytest.raises(ValueError, match=r"layer 0's patterns are \(3, 3\) \(frames × frames\); the encoder has 4"):
        AudioStats(timeline=LINE, axes=AXES).update(_batch(encoder[..., :3, :3], cross, audio=[2]))


def test_sentences_cite_the_table():
    stats = AudioStats(timeline=LINE, axes=AXES)
    stats.update(_batch(*_patterns(), audio=[2]))
    table = stats.result()
    said = " ".join(audio_sentences(table, audio_roles(table), LINE))
    assert "Of the 6 heads analysed (3 of the encoder's self-attention, 2 of cross-attention, 1 of the" in said
    assert "1 are local" in said and "1 broad and 0 sinks" in said
    assert "head L0 H2 looks nearest (0.000 s" in said and "head L0 H0 farthest (0.250 s)" in said
    assert "evenly over the audio would give 0.250" in said and "33% on the padding beyond the audio" in said
    assert "Cross-attention spreads over 0.125 s of audio" in said
