"""What each head of an audio encoder-decoder (Whisper) does on recordings: how far in time its encoder heads look,
how spread over the audio cross-attention reads, how much goes to the first frame and to the padding beyond the
audio, how spread its attention is.

Axis legend:
    pattern    (batch, head, query_pos, key_pos)   one layer's captured heads on a batch of recordings
    frames     the encoder's positions (``headlab.models.audio.Timeline``), of which the first ``lengths`` hold audio
    tokens     the decoder's positions: its transcript, or its start token alone (``headlab.capture.audio``)
    result     HeadTable                            a row per captured (layer, head)

A site's axes (``headlab.models.audio.site_axes``) say which statistics it has: the encoder's self-attention
(frames × frames) all of them, cross-attention (tokens × frames) those over the keys' time, the decoder's
self-attention (tokens × tokens) the distribution's own. Every statistic is a mean over the query rows: a frame
query counts only where it holds audio (the feature extractor's frame mask; Whisper pads every recording to 30 s
and never masks the padding, so its heads do attend to it: ``to_padding`` measures how much), every decoder row
counts. ``AudioStats`` is an accumulator (``update`` / ``merge`` / ``result``) over the batches of
``headlab.capture.audio.capture_audio``, float64 sums per (layer, head) as ``SurfaceStats`` keeps them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from headlab.analysis.patches import LOCAL
from headlab.analysis.per_head import HeadSums
from headlab.analysis.roles import BROAD, SINK
from headlab.capture.batch import CaptureBatch
from headlab.heads import HeadTable, head_label
from headlab.models.audio import FRAMES, Timeline

__all__ = ["AUDIO_STATISTICS", "AudioStats", "audio_roles", "audio_sentences", "audio_statistics", "site_kinds"]

# Statistic → what its sum is averaged over ("queries": every query row that counts; "attending": those rows with
# any attention on the audio frames, where a time attended exists). Times are in the timeline's unit (seconds).
AUDIO_STATISTICS: dict[str, str] = {
    "entropy": "queries",  # -Σ_j p_ij log p_ij over every key, nats
    "uniform_entropy": "queries",  # log(keys): uniform attention's entropy
    "to_first": "queries",  # p_i0: the first key (frame 0.00 s; the decoder's start token): the sink share
    "to_padding": "queries",  # keys that are frames: mass on the frames beyond the audio
    "time_distance": "attending",  # frames × frames: Σ_{j audio} p_ij |t_i − t_j| / Σ_{j audio} p_ij
    "uniform_distance": "queries",  # frames × frames: time_distance of attention spread evenly over the audio frames
    "time_spread": "attending",  # keys that are frames: the standard deviation of t_j under p_ij over the audio frames
    "to_self": "queries",  # self-attention: p_ii
    "confidence": "queries",  # max_j p_ij
    "time_order": "transcripts",  # tokens × frames, a transcript of ≥ 3 tokens: the Spearman correlation of each
    # token's place with the time it attends to (the mean of t_j under p_ij over the audio frames); 1: attention
    # moves through the audio as the transcript moves through its tokens (an alignment head)
}
ORDERED_TOKENS = 3  # fewest decoder tokens whose order time_order correlates with


class AudioStats(HeadSums):
    """Accumulates ``AUDIO_STATISTICS`` per (layer, head) over audio capture batches (patterns needed).

    Args:
        timeline: the encoder's positions in time (``headlab.capture.audio.capture_audio`` returns it).
        axes: ``{layer: (query axis, key axis)}`` of every site captured (``headlab.models.audio.site_axes``).
    """

    def __init__(self, *, timeline: Timeline, axes: Mapping[int, tuple[str, str]]) -> None:
        super().__init__()
        self.timeline, self.axes = timeline, dict(axes)

    def _settings(self) -> tuple[Any, ...]:
        return (self.timeline, tuple(sorted(self.axes.items())))

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch: its ``attention_mask`` marks the frames that hold audio, its layers carry patterns.

        Raises:
            ValueError: a layer captured without patterns, one of no known axes, or patterns whose frames axis is
                not the timeline's.
        """
        audio = batch.attention_mask.bool()  # (batch, frames)
        n = self.timeline.positions
        for layer, taken in batch.layers.items():
            p = taken.pattern
            if p is None:
                raise ValueError(f"layer {layer} was captured without patterns; capture with take=('pattern',)")
            if layer not in self.axes:
                raise ValueError(f"layer {layer} has no axes; expected one of the layers {sorted(self.axes)}")
            query, key = self.axes[layer]
            shape = tuple(p.shape[-2:])
            if (query == FRAMES and shape[0] != n) or (key == FRAMES and shape[1] != n):
                raise ValueError(f"layer {layer}'s patterns are {shape} ({query} × {key}); the encoder has {n} frames")
            rows = audio if query == FRAMES else torch.ones(p.shape[0], shape[0], dtype=torch.bool, device=p.device)
            stats = {"entropy": -torch.special.xlogy(p, p).sum(-1), "to_first": p[..., 0], "confidence": p.amax(-1)}
            per_row = {"uniform_entropy": torch.full(rows.shape, math.log(shape[1]), dtype=p.dtype, device=p.device)}
            if query == key:
                stats["to_self"] = torch.diagonal(p, dim1=-2, dim2=-1)
            attending = transcripts = order_sum = None
            if key == FRAMES:
                times = self.timeline.times().to(device=p.device, dtype=p.dtype)
                on_audio = p * audio[:, None, None, :]  # (batch, head, query, frame): the keys that hold audio
                mass = on_audio.sum(-1)
                attending = mass > 0
                weights = on_audio / mass.clamp_min(1e-30)[..., None]  # renormalised over the audio frames
                mean = (weights * times).sum(-1, keepdim=True)
                stats["to_padding"] = (p.sum(-1) - mass).clamp_min(0.0)
                stats["time_spread"] = (weights * (times - mean) ** 2).sum(-1).clamp_min(0.0).sqrt()
                if query != FRAMES and shape[0] >= ORDERED_TOKENS:
                    order = _rank_correlation(mean[..., 0])  # (batch, head), NaN where the times do not vary
                    ordered = ~order.isnan()
                    transcripts = ordered.sum(0, dtype=torch.float64)
                    order_sum = torch.where(ordered, order, 0.0).sum(0, dtype=torch.float64)
                if query == FRAMES:
                    gaps = (times[:, None] - times[None, :]).abs()  # (frame, frame)
                    stats["time_distance"] = (weights * gaps).sum(-1)
                    per_row["uniform_distance"] = (gaps * audio[:, None, :]).sum(-1) / audio.sum(-1, keepdim=True)
            kept = rows[:, None, :]  # (batch, 1, query)
            read = {"queries": kept, "attending": kept if attending is None else kept & attending}
            sums = {name: torch.where(read[AUDIO_STATISTICS[name]], value, 0.0).sum((0, 2), dtype=torch.float64)
                    for name, value in stats.items()}
            heads = len(taken.heads)
            sums |= {name: torch.where(rows, value, 0.0).sum(dtype=torch.float64).repeat(heads)
                     for name, value in per_row.items()}
            counts: dict[str, Any] = {"queries": int(rows.sum())}
            if attending is not None:
                counts["attending"] = read["attending"].sum((0, 2), dtype=torch.float64)
            if order_sum is not None:
                sums["time_order"], counts["transcripts"] = order_sum, transcripts
            self._add(layer, taken.heads, sums, counts)

    def result(self) -> HeadTable:
        """The means: a row per captured head, the columns ``n_queries`` (query rows averaged over) and every
        statistic of ``AUDIO_STATISTICS`` (float64; NaN where the head's site has none, or never attended to audio).

        Raises:
            ValueError: nothing was accumulated.
        """
        heads: list[tuple[int, int]] = []
        values: dict[str, list[float]] = {name: [] for name in ("n_queries", *AUDIO_STATISTICS)}
        for layer, head, i in self._order():
            heads.append((layer, head))
            sums, counts = self.sums[layer], self.counts[layer]
            values["n_queries"].append(float(counts["queries"]))
            for name, count in AUDIO_STATISTICS.items():
                if name not in sums:
                    values[name].append(math.nan)
                elif count in ("attending", "transcripts"):
                    values[name].append(float(self._mean(layer, name, count)[i]))
                else:
                    values[name].append(float(sums[name][i]) / max(counts["queries"], 1))
        return HeadTable(heads, {name: np.array(column, dtype=np.float64) for name, column in values.items()})


def _rank_correlation(times: Tensor) -> Tensor:
    """``(batch, head)``: Spearman's correlation of the token order with ``times`` ``(batch, head, tokens)`` (ties
    ranked by place); NaN where ``times`` are all equal."""
    n = times.shape[-1]
    ranks = times.double().argsort(dim=-1, stable=True).argsort(dim=-1).double()
    place = torch.arange(n, dtype=torch.float64, device=times.device)
    ranks, place = ranks - ranks.mean(-1, keepdim=True), place - place.mean()
    same = (times.amax(-1) - times.amin(-1)) <= 0
    order = (ranks * place).sum(-1) / place.square().sum()  # ranks, a permutation of the places, spread as they do
    return torch.where(same, math.nan, order)


def site_kinds(table: HeadTable) -> dict[tuple[int, int], str]:
    """Each head's site, as ``AudioStats`` measured it: ``"encoder"`` (frames × frames: ``time_distance``),
    ``"cross"`` (tokens × frames: ``time_spread`` alone), ``"decoder"`` (tokens × tokens)."""
    def kind(layer: int, head: int) -> str:
        if not math.isnan(table.value("uniform_distance", layer, head)):
            return "encoder"
        return "decoder" if math.isnan(table.value("to_padding", layer, head)) else "cross"

    return {(layer, head): kind(layer, head) for layer, head in table.heads}


def audio_roles(table: HeadTable) -> dict[tuple[int, int], tuple[str, ...]]:
    """``{(layer, head): labels}`` of an ``AudioStats`` result, in a fixed order (possibly none), for heads of more
    than one key: ``sink`` (over ``SINK`` of its attention on the first key), ``broad`` (entropy ≥ ``BROAD`` ×
    uniform attention's), ``local`` (the encoder's: ``time_distance`` ≤ ``LOCAL`` × ``uniform_distance``)."""
    out = {}
    for layer, head in table.heads:
        labels = []
        uniform = table.value("uniform_entropy", layer, head)
        if uniform > 0 and table.value("to_first", layer, head) > SINK:
            labels.append("sink")
        if uniform > 0 and table.value("entropy", layer, head) >= BROAD * uniform:
            labels.append("broad")
        if table.value("time_distance", layer, head) <= LOCAL * table.value("uniform_distance", layer, head):
            labels.append("local")  # NaN (no distance: not the encoder's) compares False
        out[(layer, head)] = tuple(labels)
    return out


def audio_statistics(table: HeadTable) -> tuple[str, ...]:
    """The statistics of an ``AudioStats`` result that tell heads apart (its heatmaps' columns): every one of
    ``AUDIO_STATISTICS`` some head has, but the uniform attention's."""
    return tuple(name for name in AUDIO_STATISTICS
                 if not name.startswith("uniform_") and not np.isnan(table[name]).all())


def audio_sentences(table: HeadTable, roles: Mapping[tuple[int, int], tuple[str, ...]],
                    timeline: Timeline) -> list[str]:
    """A few sentences about what the heads do on recordings, every number taken from ``table`` and ``timeline``.

    Args:
        table: ``AudioStats``' result.
        roles: ``audio_roles`` of it.
        timeline: the encoder's positions in time.

    Returns:
        The heads counted by site and role; the encoder heads that look nearest and farthest in time against even
        attention, and their shares on the first frame and on the padding; cross-attention's spread.
    """
    kinds = site_kinds(table)
    unit = timeline.unit

    def count(role: str) -> int:
        return sum(role in labels for labels in roles.values())

    def mean(column: str, kind: str) -> float:
        return float(np.nanmean([table.value(column, *key) for key, k in kinds.items() if k == kind]))

    encoder = [key for key, kind in kinds.items() if kind == "encoder"]
    cross = [key for key, kind in kinds.items() if kind == "cross"]
    out = [f"Of the {len(table)} heads analysed ({len(encoder)} of the encoder's self-attention, {len(cross)} of "
           f"cross-attention, {len(table) - len(encoder) - len(cross)} of the decoder's self-attention), "
           f"{count('local')} are local (mean time attended ≤ {LOCAL:.0%} of even attention's), "
           f"{count('broad')} broad and {count('sink')} sinks (over half their attention on the first "
           "key)."]
    if encoder:
        near = min(encoder, key=lambda key: table.value("time_distance", *key))
        far = max(encoder, key=lambda key: table.value("time_distance", *key))
        out.append(f"In the encoder, head {head_label(*near)} looks nearest ({table.value('time_distance', *near):.3f} "
                   f"{unit} from each frame on average) and head {head_label(*far)} farthest "
                   f"({table.value('time_distance', *far):.3f} {unit}), where attention spread evenly over the audio "
                   f"would give {mean('uniform_distance', 'encoder'):.3f}; the mean encoder head puts "
                   f"{mean('to_first', 'encoder'):.0%} of its attention on the first frame and "
                   f"{mean('to_padding', 'encoder'):.0%} on the padding beyond the audio.")
    if cross:
        out.append(f"Cross-attention spreads over {mean('time_spread', 'cross'):.3f} {unit} of audio (the standard "
                   f"deviation of the time attended) in the mean head, with {mean('to_first', 'cross'):.0%} of its "
                   f"attention on the first frame and {mean('to_padding', 'cross'):.0%} on the padding.")
        ordered = [key for key in cross if not math.isnan(table.value("time_order", *key))]
        if ordered:
            best = max(ordered, key=lambda key: table.value("time_order", *key))
            out.append(f"Over the transcripts, head {head_label(*best)} follows the audio most closely: the time it "
                       f"attends to rises with the token's place at a rank correlation of "
                       f"{table.value('time_order', *best):.2f} (1: in step, as an alignment head; the mean cross "
                       f"head {mean('time_order', 'cross'):.2f}).")
    return out
