"""Image inputs of a model that takes pixels (``main_input_name == "pixel_values"``: ViT, DeiT, DINOv2, BEiT,
CLIP's and SigLIP's vision towers): images turned into pixel values by the model's own image processor, the
picture the model sees, and the labels of its positions.

Notation: pixel values are ``(batch, channels, height, width)``. A vision transformer's positions are its
leading special tokens (``[CLS]``, DeiT's distillation token ``[DIST]``, DINOv2's registers ``reg 0``,
``reg 1``, …), then the patches row by row: ``patch r3c7`` is row 3, column 7 of the patch grid (from 0).
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

    Attributes:
        rows, columns: the patch grid (the input's height and width over the patch size).
        special: the labels of the leading special tokens, in order (``("[CLS]",)``, ``("[CLS]", "reg 0")``).
        patch_size: the patch's ``(height, width)`` in pixels.
    """

    rows: int
    columns: int
    special: tuple[str, ...]
    patch_size: tuple[int, int]

    @property
    def n_special(self) -> int:
        return len(self.special)

    @property
    def n_patches(self) -> int:
        return self.rows * self.columns

    @property
    def n_positions(self) -> int:
        return self.n_special + self.n_patches

    def labels(self) -> list[str]:
        """Every position's label: the special tokens', then ``patch r{row}c{column}`` row by row."""
        return [*self.special, *(f"patch r{r}c{c}" for r in range(self.rows) for c in range(self.columns))]

    def position(self, row: int, column: int) -> int:
        """The position of the patch at ``(row, column)``."""
        return self.n_special + row * self.columns + column

    def coordinates(self) -> Tensor:
        """``(n_patches, 2)`` float64: each patch's (row, column), in position order."""
        rows = torch.arange(self.rows, dtype=torch.float64).repeat_interleave(self.columns)
        return torch.stack([rows, torch.arange(self.columns, dtype=torch.float64).repeat(self.rows)], dim=1)

    def distances(self) -> Tensor:
        """``(n_patches, n_patches)`` float64: the Euclidean distance between every two patches, in patches."""
        points = self.coordinates()
        return torch.cdist(points, points)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "columns": self.columns, "special": list(self.special),
                "patch_size": list(self.patch_size)}


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
            windows of the grid, as Swin's, is not whole-image attention); the message gives the counts.
    """
    name, config = type(model).__name__, getattr(model, "config", None)
    size = getattr(config, "patch_size", None)
    patch = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, (list, tuple)) else None
    if patch is None or len(patch) != 2 or not all(isinstance(p, int) and p > 0 for p in patch):
        raise ValueError(f"{name} takes pixel_values, but its config has no patch_size (got {size!r}): cannot tell "
                         "its patch grid")
    rows, columns = height // patch[0], width // patch[1]
    registers = getattr(config, "num_register_tokens", 0) or 0
    n_special = positions - rows * columns
    if n_special < 0 or (registers and n_special < registers + 1):
        raise ValueError(f"{name} runs attention over {positions} positions, but a {height}×{width} input makes "
                         f"{rows}×{columns} patches of {patch[0]}×{patch[1]} pixels (and {registers} registers): its "
                         "attention is not over the whole image (windows?); headlab reads whole-image attention")
    others = n_special - 1 - registers if n_special else 0
    extra = ["[DIST]"] if others == 1 else [f"[SPECIAL {i}]" for i in range(others)]
    special = (["[CLS]"] if n_special else []) + extra + [f"reg {i}" for i in range(registers)]
    return PatchGrid(rows=rows, columns=columns, special=tuple(special), patch_size=(patch[0], patch[1]))


def positions_of(model: nn.Module, pixels: Tensor) -> int:
    """The positions ``model`` runs on ``pixels`` (``(batch, channels, height, width)``): the length of its
    output's ``last_hidden_state``, from one forward of the first item without gradients.

    Raises:
        ValueError: the output has no ``last_hidden_state`` of shape ``(batch, positions, d_model)``.
    """
    with torch.no_grad():
        output = model(**{PIXELS: pixels[:1]})
    hidden = getattr(output, "last_hidden_state", None)
    if not isinstance(hidden, Tensor) or hidden.dim() != 3:
        raise ValueError(f"{type(model).__name__}'s output has no last_hidden_state (batch, positions, d_model): "
                         "cannot count its positions")
    return hidden.shape[1]
