"""``capture_images``: run an image model (a vision transformer) over images in batches and hand the selected heads
to consumers, as ``capture`` does over a text corpus.

Each batch reaches the consumers as a ``CaptureBatch`` whose positions are the model's (``headlab.models.images``:
the leading special tokens, then the patches row by row), so that the accumulators read an image's patterns as
they read a text's: ``tokens`` holds the positions' labels (``[CLS]``, ``reg 0``, ``patch r3c7``), the special
tokens are marked in ``special_tokens_mask``, every patch is its own word (``word_ids``), and ``texts`` holds each
image's name. Every image of a run has the same size (the image processor's), so nothing is padded.

A windowed model (Swin) runs each layer on windows of its stage's grid; its consumers get every layer's tensors laid
on that layer's grid (``PatchGrid.of``, ``headlab.models.windows.Windows.scatter``): a pattern ``(batch, head,
patch, patch)`` with zeros outside each query's window, z, result, q, k and v ``(batch, head, patch, d)``. The
batch's own positions (``tokens``, the masks) are the first stage's grid; ``on_first_grid`` lays every layer's
patterns over it, for a consumer that reads every layer on the same positions (head similarity, the viewer).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headlab.capture.batch import CaptureBatch, LayerCapture
from headlab.capture.run import CaptureResult, Consumer, check_batch_size, checked_consumers, feed
from headlab.layer.selection import HeadSelection
from headlab.layer.taps import TAKE, check_take
from headlab.models import HeadedModel, headed
from headlab.models.images import (
    PIXELS,
    PatchGrid,
    grid_of,
    image_processor,
    image_sources,
    open_image,
)

__all__ = ["ImageCorpus", "capture_images", "image_batch", "image_grid", "on_first_grid"]


class ImageCorpus:
    """Images to run, by name, each turned into pixel values when its batch comes (so that a folder of any size
    costs the memory of one batch).

    Args:
        model: an image model's handle (``headlab.load``), or an attached model whose handle has its processor.
        images: pixel values ``(batch, channels, height, width)`` (named ``image 0``, …), or what
            ``headlab.models.images.image_sources`` reads: an image file, a folder of them, a PIL image, a list.

    Attributes:
        names: each image's name, in order (a file's name, or ``image {i}``).

    Raises:
        TypeError: images without an image processor (the message names the file a checkpoint lacks).
        ValueError / OSError: pixel values that are not ``(batch, channels, height, width)`` floats; a path that
            does not exist, a folder without images.
    """

    def __init__(self, model: HeadedModel | nn.Module, images: Any) -> None:
        handle = headed(model)
        self.processor: Any = None
        self._pixels: Tensor | None = None
        self._sources: list[Any] = []
        if isinstance(images, Tensor):
            if images.dim() != 4 or not images.is_floating_point() or len(images) == 0:
                raise ValueError(f"pixel values must be a float tensor (batch, channels, height, width) of at least "
                                 f"one image; got {images.dtype} {tuple(images.shape)}")
            self._pixels = images.detach().float().cpu()
            self.names = [f"image {i}" for i in range(len(images))]
            return
        self.processor = image_processor(handle.tokenizer, architecture=handle.architecture, source=handle.source)
        found = image_sources(images)
        self.names, self._sources = [name for name, _ in found], [source for _, source in found]

    def __len__(self) -> int:
        return len(self.names)

    def first(self, n: int) -> ImageCorpus:
        """The first ``n`` images (all of them when there are fewer), as a corpus of their own."""
        kept = copy.copy(self)
        kept.names, kept._sources = self.names[:n], self._sources[:n]
        kept._pixels = None if self._pixels is None else self._pixels[:n]
        return kept

    def pixels(self, indices: Sequence[int]) -> Tensor:
        """``(len(indices), channels, height, width)`` float32 on the CPU: the images ``indices``.

        Raises:
            ValueError: a file Pillow cannot read.
        """
        if self._pixels is not None:
            return self._pixels[list(indices)]
        pictures = [open_image(self._sources[i]) for i in indices]
        return self.processor(images=pictures, return_tensors="pt")[PIXELS].float()


def image_batch(grid: PatchGrid, names: Sequence[str], indices: Sequence[int], *,
                device: torch.device | str = "cpu") -> CaptureBatch:
    """The ``CaptureBatch`` of the images ``indices`` (corpus order) of a run whose positions ``grid`` lays out.

    Args:
        grid: the model's patch grid on these images (``headlab.models.images.patch_grid``).
        names: every image's name, in corpus order.
        indices: the batch's images.
        device: where the tensors go (the model's device).

    Returns:
        A batch with no layer captured yet: ids all 0 (an image has none), every position real, the special
        tokens marked, each patch its own word (special tokens -1), each image's name as its text and the
        positions' labels as its tokens.
    """
    batch, n = len(indices), grid.n_positions
    special = torch.zeros(n, dtype=torch.bool)
    special[: grid.n_special] = True
    word_ids = torch.where(special, -1, torch.arange(n) - grid.n_special)
    labels = grid.labels()
    return CaptureBatch(
        input_ids=torch.zeros(batch, n, dtype=torch.long, device=device),
        attention_mask=torch.ones(batch, n, dtype=torch.long, device=device),
        lengths=torch.full((batch,), n, dtype=torch.long, device=device),
        offsets=torch.zeros(batch, n, 2, dtype=torch.long, device=device),
        word_ids=word_ids.repeat(batch, 1).to(device), special_tokens_mask=special.repeat(batch, 1).to(device),
        corpus_indices=torch.as_tensor(list(indices), dtype=torch.long, device=device),
        truncated=torch.zeros(batch, dtype=torch.bool, device=device),
        texts=[names[i] for i in indices], tokens=[list(labels) for _ in indices],
    )


def image_grid(model: HeadedModel | nn.Module, pixels: Tensor) -> PatchGrid:
    """The patch grid of ``model`` on pixel values of ``pixels``' size (``headlab.models.images.grid_of``: one
    forward of one image counts the positions, or reads a windowed model's windows).

    Raises:
        ValueError: a model whose positions do not fit its grid, or without ``config.patch_size``.
    """
    handle = headed(model)
    with handle.running(grad=False):
        return grid_of(handle.model, handle.sites, pixels[:1].to(device=handle.device, dtype=handle.dtype))


class _OnGrids:
    """A consumer that lays a windowed model's layers on their grids (``Windows.scatter``), then hands the batch on."""

    def __init__(self, grid: PatchGrid, consumers: Sequence[Consumer]) -> None:
        self.grid, self.consumers = grid, consumers

    def update(self, batch: CaptureBatch) -> None:
        batch.layers = {layer: self._scattered(taken) for layer, taken in batch.layers.items()}
        for consumer in self.consumers:
            consumer.update(batch)

    def _scattered(self, taken: LayerCapture) -> LayerCapture:
        windows = self.grid.of(taken.layer).windows
        if windows is None:
            return taken
        laid: dict[str, Any] = {name: windows.scatter(value, square=name == "pattern") for name in TAKE
                                if (value := getattr(taken, name)) is not None}
        return dataclasses.replace(taken, **laid)


class _OnFirstGrid:
    """``on_first_grid``'s consumer."""

    def __init__(self, grid: PatchGrid, consumer: Consumer) -> None:
        self.grid, self.consumer = grid, consumer

    def update(self, batch: CaptureBatch) -> None:
        layers = batch.layers
        batch.layers = {layer: taken if taken.pattern is None else
                        dataclasses.replace(taken, pattern=self.grid.onto(taken.pattern, layer))
                        for layer, taken in layers.items()}
        try:
            self.consumer.update(batch)
        finally:
            batch.layers = layers


def on_first_grid(grid: PatchGrid, consumer: Consumer) -> Consumer:
    """``consumer``, given every layer's patterns over ``grid``'s own positions (``PatchGrid.onto``: a later stage's
    patch's weight spread evenly over the first-stage patches it covers); ``consumer`` itself where every layer
    runs over ``grid``.

    Args:
        grid: the patch grid ``capture_images`` returns.
        consumer: an object with ``update(batch)`` that reads every layer on the batch's positions.
    """
    return _OnFirstGrid(grid, consumer) if grid.layers else consumer


def capture_images(
    model: HeadedModel | nn.Module,
    images: Any,
    *,
    heads: HeadSelection = None,
    take: str | Sequence[str] = ("pattern",),
    consumers: Iterable[Consumer] = (),
    batch_size: int = 16,
    progress: bool = True,
) -> tuple[CaptureResult, PatchGrid]:
    """Run an image model over ``images`` and give every consumer each batch's selected heads (``capture``'s loop,
    ``headlab.capture.run.feed``).

    Args:
        model: an image model's handle with its image processor (or pixel values as ``images``).
        images: an ``ImageCorpus``, or what it takes: pixel values, or image files, folders and PIL images.
        heads: the heads to take (``headlab.heads.selection``); None for every head.
        take: any of ``headlab.layer.taps.TAKE``: "pattern", "z", "result", "q", "k", "v".
        consumers: objects with ``update(batch: CaptureBatch)``, called in order per batch.
        batch_size: most images per forward.
        progress: show a progress bar over batches.

    Returns:
        ``(counts and throughput, the patch grid)``: ``tokens`` counts positions (special tokens included; a
        windowed model's: its first stage's patches); the corpus is described by its image names.

    Raises:
        TypeError: a consumer without ``update``; images without an image processor.
        ValueError / OSError: bad images (``ImageCorpus``), images of different sizes, a bad selection or
            ``batch_size``, or a model whose positions do not fit its grid or that has no ``config.patch_size``.
    """
    start = time.perf_counter()
    take = check_take(take)
    check_batch_size(batch_size, "images per forward")
    handle = headed(model)
    consumers = checked_consumers(consumers)
    selection = handle.heads(heads)
    corpus = images if isinstance(images, ImageCorpus) else ImageCorpus(handle, images)
    names, device, dtype = corpus.names, handle.device, handle.dtype
    first_pixels = corpus.pixels([0])
    grid = image_grid(handle, first_pixels)
    starts = range(0, len(names), batch_size)

    def step(first: int) -> tuple[CaptureBatch, dict[str, Any], int]:
        indices = list(range(first, min(first + batch_size, len(names))))
        pixels = corpus.pixels(indices)
        if pixels.shape[1:] != first_pixels.shape[1:]:
            raise ValueError(f"images {names[indices[0]]!r}… give pixel values {tuple(pixels.shape[1:])}, the first "
                             f"{tuple(first_pixels.shape[1:])}: every image of a run needs one size")
        kwargs = {PIXELS: pixels.to(device=device, dtype=dtype)}
        return image_batch(grid, names, indices, device=device), kwargs, len(indices) * grid.n_positions

    if grid.layers:
        consumers = (_OnGrids(grid, consumers),)
    feed(handle, selection, take, consumers, (step(first) for first in starts), total=len(starts),
         progress=progress, start=start)
    n_tokens = len(names) * grid.n_positions
    run = CaptureResult(items=len(names), tokens=n_tokens, padded_tokens=n_tokens, batches=len(starts), truncated=[],
                        max_length=None, layers=selection, take=take, seconds=time.perf_counter() - start,
                        corpus={"images": len(names), "names": names[:10], "grid": grid.to_dict()})
    return run, grid
