"""Image inputs of a model that takes pixels (``main_input_name == "pixel_values"``: ViT, DeiT, DINOv2, BEiT,
CLIP's and SigLIP's vision towers, Swin): images turned into pixel values by the model's own image processor, the
picture the model sees, and the labels of its positions.

Notation: pixel values are ``(batch, channels, height, width)``. A vision transformer's positions are its
leading special tokens (``[CLS]``, DeiT's distillation token ``[DIST]``, DINOv2's registers ``reg 0``,
``reg 1``, …), then the patches row by row: ``patch r3c7`` is row 3, column 7 of the patch grid (from 0). A
windowed model (Swin) has no special token and a grid per stage (``PatchGrid.of``), each labelled the same way.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from headlab.models.audio import PREPROCESSOR_FILE  # where a checkpoint keeps its image processor too
from headlab.models.media import Medium
from headlab.models.site import AttentionSite
from headlab.models.windows import Windows, window_geometry

PIXELS = "pixel_values"  # the main input name of a model that takes pixels
PICTURES = Medium(suffixes=(".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp"),
                  folder="a folder of images", item="image file", missing="an image or a folder of images",
                  nothing="an image file, a folder of images or a PIL image", given="image")
Images = Any  # a path (an image file or a folder of them), a PIL image, or a list of paths and PIL images


def takes_pixels(model: nn.Module) -> bool:
    """Whether ``model``'s main input is pixel values (``main_input_name == "pixel_values"``)."""
    return getattr(model, "main_input_name", None) == PIXELS


def is_images(inputs: Any) -> bool:
    """Whether ``inputs`` is what ``image_sources`` reads: a path, a PIL image, or a non-empty list of them."""
    from PIL import Image

    def one(item: Any) -> bool:
        return isinstance(item, (str, os.PathLike, Image.Image))

    return one(inputs) or (isinstance(inputs, Sequence) and bool(inputs) and all(one(item) for item in inputs))


def image_sources(images: Images) -> list[tuple[str, Any]]:
    """Each image of ``images`` with its name, not read yet: a folder becomes its image files, sorted by name.

    Args:
        images: an image file, a folder, a PIL image, or a list of them.

    Returns:
        ``[(name, path or PIL image)]``: a file's name, or ``"image {i}"`` for a PIL image (``i``: its place).

    Raises:
        FileNotFoundError: a path that does not exist.
        NotADirectoryError / ValueError: a folder without images; no image at all.
        TypeError: an item that is neither a path nor a PIL image.
    """
    from PIL import Image

    def in_memory(item: Any, place: int) -> str:
        if not isinstance(item, Image.Image):
            raise TypeError(f"an image must be a path, a folder or a PIL image; got {type(item).__name__}")
        return f"image {place}"

    items = [images] if isinstance(images, (str, os.PathLike, Image.Image)) else list(images)
    return PICTURES.sources(items, in_memory=in_memory)


def open_image(source: Any) -> Any:
    """One image of ``image_sources`` in RGB: a PIL image as it is, a file read.

    Raises:
        ValueError: a file Pillow cannot read.
    """
    from PIL import Image, UnidentifiedImageError

    if isinstance(source, Image.Image):
        return source.convert("RGB")
    try:
        with Image.open(source) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as err:
        raise ValueError(f"{source}: not an image Pillow can read ({type(err).__name__})") from err


def image_processor(tokenizer: Any, *, architecture: str, source: str) -> Any:
    """The image processor a handle's tokenizer slot holds: the slot itself (a ``ViTImageProcessor``, say) or a
    processor's ``image_processor``.

    Args:
        tokenizer: the handle's ``tokenizer``.
        architecture: the model's class name, for the error.
        source: the handle's ``source`` (a checkpoint folder, a hub id or "in memory"), for the error.

    Raises:
        TypeError: the slot holds neither; the message says which file the folder lacks, or what to pass.
    """
    from transformers.image_processing_base import ImageProcessingMixin

    for candidate in (tokenizer, getattr(tokenizer, "image_processor", None)):
        if isinstance(candidate, ImageProcessingMixin):
            return candidate
    held = "none" if tokenizer is None else f"a {type(tokenizer).__name__}"
    if os.path.isdir(source) and not (Path(source) / PREPROCESSOR_FILE).is_file():
        fix = f"{source} has no {PREPROCESSOR_FILE} (the checkpoint's image processor): add it"
    else:
        fix = "headlab.attach(model, tokenizer=AutoImageProcessor.from_pretrained(checkpoint)) gives it one"
    raise TypeError(f"images need an image processor, and this {architecture} has {held}: {fix}, or pass pixel "
                    "values (batch, channels, height, width)")


def pixel_values(images: Images, processor: Any) -> Tensor:
    """The pixel values of ``images`` (``image_sources``, each read by ``open_image``), made by ``processor`` (an
    image processor).

    Returns:
        ``(batch, channels, height, width)`` float32 on the CPU.
    """
    pictures = [open_image(source) for _, source in image_sources(images)]
    return processor(images=pictures, return_tensors="pt")[PIXELS].float()


def picture(pixels: Tensor, processor: Any = None) -> Any:
    """The picture the model sees: one item's pixel values as an RGB PIL image (after the processor's resizing
    and cropping, so that the patch grid lies on it as on the model's input).

    The processor's normalisation is undone (``x · image_std + image_mean``, clipped to [0, 1]) when it says how
    it normalised; otherwise (no processor, or one that does not say) each channel is stretched to [0, 1].

    Args:
        pixels: ``(channels, height, width)``, 3 channels (or 1: grey).
        processor: the image processor that made them, or None.

    Raises:
        ValueError: not a ``(1 or 3, height, width)`` tensor.
    """
    from PIL import Image

    if pixels.dim() != 3 or pixels.shape[0] not in (1, 3):
        raise ValueError(f"pixels must be (channels, height, width) with 1 or 3 channels; got {tuple(pixels.shape)}")
    x = pixels.detach().double().cpu()
    mean, std = getattr(processor, "image_mean", None), getattr(processor, "image_std", None)
    if getattr(processor, "do_normalize", False) and mean is not None and std is not None:
        x = x * torch.as_tensor(std, dtype=x.dtype)[:, None, None] + torch.as_tensor(mean, dtype=x.dtype)[:, None, None]
    else:
        low = x.flatten(1).amin(1)[:, None, None]
        x = (x - low) / (x.flatten(1).amax(1)[:, None, None] - low).clamp(min=1e-12)
    rgb = (x.clamp(0, 1) * 255).round().to(torch.uint8).expand(3, -1, -1).permute(1, 2, 0).contiguous()
    return Image.fromarray(rgb.numpy(), mode="RGB")


@dataclass(frozen=True)
class PatchGrid:
    """Where a vision transformer's positions lie: its leading special tokens, then a grid of patches.

    A windowed model (Swin) runs each stage on its own grid, halved by patch merging from one stage to the next: its
    grid is the first stage's, and ``layers`` holds every layer's own (``of``), each with its ``windows``.

    Attributes:
        rows, columns: the patch grid (the input's height and width over the patch size).
        special: the labels of the leading special tokens, in order (``("[CLS]",)``, ``("[CLS]", "reg 0")``).
        patch_size: the patch's ``(height, width)`` in pixels.
        stride: how many first-stage patches one patch spans, ``(down, across)``: ``(1, 1)`` but on a later stage of
            a windowed model. Coordinates and distances are in first-stage patches.
        windows: the windows its attention runs over (``headlab.models.windows``); None: the whole image.
        layers: every layer's own grid, in layer order, where the layers' grids differ (windowed models); empty: each
            layer runs over this grid.
    """

    rows: int
    columns: int
    special: tuple[str, ...]
    patch_size: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    windows: Windows | None = None
    layers: tuple[PatchGrid, ...] = ()

    @property
    def n_special(self) -> int:
        return len(self.special)

    @property
    def n_patches(self) -> int:
        return self.rows * self.columns

    @property
    def n_positions(self) -> int:
        return self.n_special + self.n_patches

    def of(self, layer: int) -> PatchGrid:
        """The grid ``layer``'s attention runs over: its own (``layers``) or this one."""
        return self.layers[layer] if self.layers else self

    def labels(self) -> list[str]:
        """Every position's label: the special tokens', then ``patch r{row}c{column}`` row by row (on this grid)."""
        return [*self.special, *(f"patch r{r}c{c}" for r in range(self.rows) for c in range(self.columns))]

    def position(self, row: int, column: int) -> int:
        """The position of the patch at ``(row, column)``."""
        return self.n_special + row * self.columns + column

    def coordinates(self) -> Tensor:
        """``(n_patches, 2)`` float64: each patch's (row, column) times ``stride`` (in first-stage patches), in
        position order."""
        rows = torch.arange(self.rows, dtype=torch.float64).repeat_interleave(self.columns) * self.stride[0]
        columns = torch.arange(self.columns, dtype=torch.float64).repeat(self.rows) * self.stride[1]
        return torch.stack([rows, columns], dim=1)

    def distances(self) -> Tensor:
        """``(n_patches, n_patches)`` float64: the Euclidean distance between every two patches, in first-stage
        patches (in this grid's own patches but on a later stage of a windowed model)."""
        points = self.coordinates()
        return torch.cdist(points, points)

    def onto(self, pattern: Tensor, layer: int) -> Tensor:
        """A pattern of ``layer`` (over its own grid, ``of(layer)``) laid over this grid's positions: each patch's
        query row is its layer patch's row, and the weight on a layer patch is spread evenly over the patches of
        this grid it covers (so rows keep their sums). The identity where the layer runs over this grid.

        Args:
            pattern: ``(batch, head, query_pos, key_pos)`` over ``of(layer)``'s positions.
            layer: the layer it comes from.

        Returns:
            ``(batch, head, n_positions, n_positions)``.
        """
        own = self.of(layer)
        if own is self:
            return pattern
        down, across = own.stride[0] // self.stride[0], own.stride[1] // self.stride[1]
        rows = torch.arange(self.rows).repeat_interleave(self.columns) // down
        columns = torch.arange(self.columns).repeat(self.rows) // across
        parent = torch.cat([torch.arange(self.n_special), own.n_special + rows * own.columns + columns])
        parent = parent.to(pattern.device)
        share = torch.bincount(parent, minlength=own.n_positions).to(pattern.dtype)[parent]  # patches each one covers
        return pattern[:, :, parent][..., parent] / share

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.rows, "columns": self.columns, "special": list(self.special),
                               "patch_size": list(self.patch_size)}
        if self.stride != (1, 1):
            out["stride"] = list(self.stride)
        if self.windows is not None:
            out["window"] = {"side": self.windows.side, "shift": self.windows.shift}
        if self.layers:
            out["layers"] = [grid.to_dict() for grid in self.layers]
            out["distance_unit"] = "first-stage patches (a later stage's patch spans stride of them)"
        return out


def windowed_grid(model: nn.Module, windows: Sequence[Windows]) -> PatchGrid:
    """The patch grid of a windowed model (Swin) from its sites' windows (``headlab.models.windows``): the first
    layer's grid, with every layer's own in ``layers`` (no special token: every position is a patch).

    A later stage's stride is the first stage's grid over its own (rounded up, stage to stage, as patch merging
    pads an odd grid), and its patches that many first-stage patches.

    Args:
        model: the model itself (its ``config.patch_size``).
        windows: every site's windows, in layer order.

    Raises:
        ValueError: no ``config.patch_size``.
    """
    patch = _patch_size(model)
    first = windows[0]
    layers, stride, previous = [], (1, 1), (first.rows, first.columns)
    for each in windows:
        size = (each.rows, each.columns)
        stride = (stride[0] * -(-previous[0] // size[0]), stride[1] * -(-previous[1] // size[1]))
        previous = size
        layers.append(PatchGrid(rows=each.rows, columns=each.columns, special=(), stride=stride, windows=each,
                                patch_size=(patch[0] * stride[0], patch[1] * stride[1])))
    return PatchGrid(rows=first.rows, columns=first.columns, special=(), patch_size=patch, layers=tuple(layers))


def _patch_size(model: nn.Module) -> tuple[int, int]:
    """``config.patch_size`` as ``(height, width)``.

    Raises:
        ValueError: the config has none (or not one or two positive ints).
    """
    size = getattr(getattr(model, "config", None), "patch_size", None)
    patch = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, (list, tuple)) else None
    if patch is None or len(patch) != 2 or not all(isinstance(p, int) and p > 0 for p in patch):
        raise ValueError(f"{type(model).__name__} takes pixel_values, but its config has no patch_size (got "
                         f"{size!r}): cannot tell its patch grid")
    return patch[0], patch[1]


def patch_grid(model: nn.Module, *, height: int, width: int, positions: int) -> PatchGrid:
    """The patch grid of ``model`` on an input of ``height × width`` pixels that runs ``positions`` positions.

    Everything is read from the config and the sizes: the grid is the input over ``config.patch_size``; the
    leading special tokens are the positions beyond the patches. The first is ``[CLS]``; the last
    ``config.num_register_tokens`` are registers (``reg 0``, …); one more in between is a distillation token
    (``[DIST]``, DeiT), several are ``[SPECIAL 0]``, ….

    Args:
        model: the model itself (its ``config``).
        height, width: the pixel values' size.
        positions: the positions its attention runs (a pattern's key axis, or ``positions_of``).

    Raises:
        ValueError: no ``config.patch_size``, or fewer positions than patches and registers (attention over
            windows of the grid, as Swin's, is not whole-image attention: ``grid_of`` reads it); the message gives
            the counts.
    """
    name, config = type(model).__name__, getattr(model, "config", None)
    patch = _patch_size(model)
    rows, columns = height // patch[0], width // patch[1]
    registers = getattr(config, "num_register_tokens", 0) or 0
    n_special = positions - rows * columns
    if n_special < 0 or (registers and n_special < registers + 1):
        raise ValueError(f"{name} runs attention over {positions} positions, but a {height}×{width} input makes "
                         f"{rows}×{columns} patches of {patch[0]}×{patch[1]} pixels (and {registers} registers): its "
                         "attention is not over the whole image (a windowed model's grids: grid_of)")
    others = n_special - 1 - registers if n_special else 0
    extra = ["[DIST]"] if others == 1 else [f"[SPECIAL {i}]" for i in range(others)]
    special = (["[CLS]"] if n_special else []) + extra + [f"reg {i}" for i in range(registers)]
    return PatchGrid(rows=rows, columns=columns, special=tuple(special), patch_size=(patch[0], patch[1]))


def grid_of(model: nn.Module, sites: Sequence[AttentionSite], pixels: Tensor) -> PatchGrid:
    """The patch grid of ``model`` on pixel values of ``pixels``' size, from one forward of the first image without
    gradients: a windowed model's (``windowed_grid``, each layer's windows read on the forward), else ``patch_grid``
    with the positions the forward ran.

    Args:
        model: the model itself.
        sites: its attention sites, in layer order.
        pixels: ``(batch, channels, height, width)`` on the model's device and dtype.

    Raises:
        ValueError: some layers windowed and others not; no ``config.patch_size``; a whole-image model whose
            positions do not fit its grid (``patch_grid``).
    """
    out: dict[str, Any] = {}

    def run() -> None:
        with torch.no_grad():
            out["output"] = model(**{PIXELS: pixels[:1]})

    windows = window_geometry(model, sites, run)
    found = [w for w in windows if w is not None]
    if found and len(found) < len(windows):
        plain = [site.layer for site, w in zip(sites, windows) if w is None]
        raise ValueError(f"{type(model).__name__}'s layers {plain} attend over the whole image and the others over "
                         "windows: headlab reads one or the other")
    if found:
        return windowed_grid(model, found)
    return patch_grid(model, height=pixels.shape[2], width=pixels.shape[3], positions=_positions(model, out["output"]))


def positions_of(model: nn.Module, pixels: Tensor) -> int:
    """The positions ``model`` runs on ``pixels`` (``(batch, channels, height, width)``): the length of its
    output's ``last_hidden_state``, from one forward of the first item without gradients.

    Raises:
        ValueError: the output has no ``last_hidden_state`` of shape ``(batch, positions, d_model)``.
    """
    with torch.no_grad():
        return _positions(model, model(**{PIXELS: pixels[:1]}))


def _positions(model: nn.Module, output: Any) -> int:
    """The length of ``output``'s ``last_hidden_state`` (``positions_of``)."""
    hidden = getattr(output, "last_hidden_state", None)
    if not isinstance(hidden, Tensor) or hidden.dim() != 3:
        raise ValueError(f"{type(model).__name__}'s output has no last_hidden_state (batch, positions, d_model): "
                         "cannot count its positions")
    return hidden.shape[1]
