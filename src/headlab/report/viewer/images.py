"""``image_view_data``: what the attention viewer shows of a vision transformer: each image as the model saw it, under
its patch grid, with every selected head's pattern over the image's positions (``[CLS]``, the registers, ``patch
r3c7`` …: ``headlab.models.images``) and each head's statistics on these images (``headlab.analysis.patches``).

Axis legend:
    patterns   (head, query_pos, key_pos)   one image's shown heads, encoded (``encoding.quantize``)
    pos        the image's positions: its leading special tokens, then its patches row by row

One capture pass (``headlab.capture.images.capture_images``) feeds the collector below, which encodes each image's
patterns as its batch arrives and computes its rollout (and, for at most ``flow_max_length`` positions, its flow)
through every layer up to the last shown one, and ``PatchStats``. The page draws a head's attention from a hovered
patch as heat over the picture (``static/image.js``).

A windowed model (Swin) runs each stage on its own grid: its positions here are the first stage's patches, and a
later stage's pattern is laid over them (``headlab.capture.images.on_first_grid``: a query reads its stage patch's
row, a stage patch's weight is spread over the first-stage patches it covers); the page sums them back, so that the
heat over the picture is on the open head's own grid (``ImagePanel``'s grids).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from headlab.analysis.flow import FLOW_MAX_LENGTH, attention_flow, rollout
from headlab.analysis.patches import PATCH_STATISTICS, PatchStats, patch_roles
from headlab.capture import CaptureBatch
from headlab.capture.images import ImageCorpus, capture_images, image_grid, on_first_grid
from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel, headed
from headlab.models.images import PatchGrid, picture
from headlab.report.provenance import model_name
from headlab.report.viewer.encoding import quantize, thumbnails
from headlab.report.viewer.payload import MAX_ENTRIES, HeadInfo, ImagePanel, Level, ViewerData, ViewerItem

__all__ = ["MAX_SIDE", "image_view_data"]

MAX_SIDE = 448  # the longest side of a picture the page carries, in pixels: a larger model input is shrunk to it


def image_view_data(
    model: HeadedModel | nn.Module,
    images: Any,
    *,
    heads: HeadSelection = None,
    corpus_rows: Sequence[Mapping[str, Any]] | None = None,
    max_entries: int = MAX_ENTRIES,
    flow_max_length: int = FLOW_MAX_LENGTH,
    progress: bool = False,
) -> ViewerData:
    """Run a vision transformer on ``images`` and encode what the viewer shows.

    Args:
        model: an image model's handle with its image processor (``headlab.load`` of a checkpoint with
            preprocessor_config.json), or an attached model whose handle has one; pixel values need none.
        images: an image file, a folder of them, a PIL image, a list of them, or pixel values ``(batch, channels,
            height, width)`` (``headlab.capture.images.ImageCorpus``); the viewer switches between them.
        heads: the heads to show (``headlab.heads.selection``); None for all.
        corpus_rows: per-head rows of a corpus-wide analysis (``AnalysisResult.rows()``), shown beside the
            statistics measured on ``images``.
        max_entries: most pattern entries (heads × positions², rollout and flow counting as a head per layer) the
            page may carry.
        flow_max_length: compute attention flow for images of at most this many positions; 0 for none.
        progress: show the capture's progress bar.

    Returns:
        The viewer's data: one item per image, its positions at the ``pieces`` level (no word level; a windowed
        model's: its first stage's patches), its picture and grid in ``ViewerItem.image``; each head's ``PatchStats``
        and ``patch_roles``.

    Raises:
        ValueError: a bad selection or ``flow_max_length``, more than ``max_entries`` entries (the message gives the
            count and how to cut it), bad images, or a model whose positions do not fit its grid.
        TypeError: images without an image processor (the message names the file a checkpoint lacks).
    """
    if isinstance(flow_max_length, bool) or not isinstance(flow_max_length, int) or flow_max_length < 0:
        raise ValueError(f"flow_max_length={flow_max_length!r}; expected an int >= 0 (positions; 0: no flow)")
    handle = headed(model)
    corpus = ImageCorpus(handle, images)
    n_heads = handle.n_heads
    shown = [(layer, h) for layer, hs in handle.heads(heads).items() for h in hs]
    grid = image_grid(handle, corpus.pixels([0]))
    n = grid.n_positions
    depth = 1 + max(layer for layer, _ in shown)  # rollout and flow run through every layer up to the last shown
    entries = len(corpus) * (len(shown) + depth * (1 + (n <= flow_max_length))) * n * n
    if entries > max_entries:
        raise ValueError(f"{len(corpus)} image(s) of {n} positions × {len(shown)} heads need {entries:,} pattern "
                         f"entries, more than max_entries={max_entries:,}; show fewer heads (--layers/--heads) or "
                         "fewer images")
    collector, stats = _Collector(shown, grid, flow_max_length=flow_max_length), PatchStats(grid=grid)
    every_head = {layer: list(range(n_heads[layer])) for layer in range(depth)}  # rollout averages every head
    capture_images(handle, corpus, heads=every_head, take=("pattern",),
                   consumers=[on_first_grid(grid, collector), stats], progress=progress)
    table = stats.result()
    roles = patch_roles(table, grid)
    by_head = {(int(r["layer"]), int(r["head"])): dict(r) for r in corpus_rows or ()}
    info = []
    for layer, head in shown:
        values = {name: table.value(name, layer, head) for name in PATCH_STATISTICS if name in table.columns}
        info.append(HeadInfo(layer=layer, head=head, roles=roles.get((layer, head), ()), pattern_class="",
                             stats={k: v for k, v in values.items() if v == v},  # NaN: not measurable here
                             corpus=by_head.get((layer, head))))
    items = [ViewerItem(text=name, full_length=n, truncated=False, pieces=collector.levels[k], words=None,
                        image=_panel(corpus.pixels([k])[0], corpus.processor, grid))
             for k, name in enumerate(corpus.names)]
    return ViewerData(name=model_name(handle.source), source=handle.source, architecture=handle.architecture,
                      causal=False, n_heads=n_heads, heads=shown, info=info, items=items, max_length=None,
                      flow_max_length=flow_max_length)


def _panel(pixels: torch.Tensor, processor: Any, grid: PatchGrid) -> ImagePanel:
    """An image's picture as the model saw it (``headlab.models.images.picture``), at most ``MAX_SIDE`` pixels a
    side, as a PNG data URL."""
    shown = picture(pixels, processor)
    if max(shown.size) > MAX_SIDE:
        scale = MAX_SIDE / max(shown.size)
        shown = shown.resize((max(1, round(shown.width * scale)), max(1, round(shown.height * scale))))
    png = io.BytesIO()
    shown.save(png, format="PNG", optimize=True)
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode("ascii")
    height, width = pixels.shape[1:]
    cover = (grid.columns * grid.patch_size[1] / width, grid.rows * grid.patch_size[0] / height)
    return ImagePanel(data_url=url, width=shown.width, height=shown.height, grid=grid, cover=cover)


class _Collector:
    """A capture consumer that encodes each image's shown heads, rollout and flow as its batch arrives."""

    def __init__(self, shown: list[tuple[int, int]], grid: PatchGrid, *, flow_max_length: int) -> None:
        self.shown, self.grid, self.flow_max_length = shown, grid, flow_max_length
        self.levels: dict[int, Level] = {}

    def update(self, batch: CaptureBatch) -> None:
        layers = batch.layers
        patterns = {layer: taken.pattern for layer, taken in layers.items() if taken.pattern is not None}
        n = self.grid.n_positions
        labels = self.grid.labels()
        for row in range(len(batch)):
            stack = torch.stack([patterns[layer][row, layers[layer].heads.index(head)]
                                 for layer, head in self.shown]).float().cpu()  # (head, n, n)
            means = [patterns[layer][row].float().mean(0, keepdim=True).cpu() for layer in sorted(patterns)]
            flow = attention_flow(means, max_length=self.flow_max_length) if n <= self.flow_max_length else None
            size, thumbs = thumbnails(stack)
            self.levels[int(batch.corpus_indices[row])] = Level(
                name="pieces", labels=labels, gaps=[""] + [" "] * (n - 1), tail="",
                special=[i < self.grid.n_special for i in range(n)], pieces=[1] * n,
                patterns=[quantize(p) for p in stack], thumb_size=size, thumbs=thumbs,
                rollout=[quantize(p) for p in rollout(means)],
                flow=None if flow is None else [quantize(p) for p in flow])
