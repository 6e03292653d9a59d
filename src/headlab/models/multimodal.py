"""Models of several towers: a vision tower beside the text, which meets it only at the output (CLIP's text and
vision towers, each taking its own input), or inside it (Gemma 3, LLaVA: the image's features take the places of
image tokens in the text).

Every tower runs only on its own input, so the probe of ``attach`` feeds them all: token ids, with the image
tokens where the text has them, and pixels of the vision tower's size.

Notation: pixels are ``(batch, channels, height, width)``; token ids ``(batch, pos)``.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def vision_config(model: nn.Module | Any) -> Any | None:
    """The config of ``model``'s vision tower (``config.vision_config`` beside a ``text_config``), or None for a
    model of one tower. ``model`` may be the config itself (a checkpoint's, before it is loaded)."""
    config = getattr(model, "config", model)
    if getattr(config, "text_config", None) is None:
        return None
    return getattr(config, "vision_config", None)


def image_token(model: nn.Module | Any) -> int | None:
    """The id of the token whose places an image's features take in the text (``config.image_token_id``; LLaVA's
    ``image_token_index``), or None: a model without one, or whose images never enter the text (CLIP)."""
    config = getattr(model, "config", model)
    found = getattr(config, "image_token_id", None)  # LlavaConfig maps it to image_token_index
    return found if vision_config(model) is not None and isinstance(found, int) else None


def needs_pixels(model: nn.Module | Any) -> bool:
    """Whether every forward of ``model`` (or of a checkpoint's config) needs pixel values with its text: a vision
    tower whose image has no place in the text (CLIP's towers meet only at the output), so each tower takes its
    own input."""
    return vision_config(model) is not None and image_token(model) is None


def image_shape(model: nn.Module) -> tuple[int, int, int]:
    """The ``(channels, height, width)`` of the pixels ``model``'s vision tower takes (its config's
    ``num_channels`` — 3 when unset — and ``image_size``).

    Raises:
        ValueError: the vision config sets no integer ``image_size`` (a tower of variable image sizes, which
            headlab cannot probe).
    """
    config = vision_config(model)
    size, channels = getattr(config, "image_size", None), getattr(config, "num_channels", 3)
    if not isinstance(size, int):
        raise ValueError(f"{type(model).__name__}: cannot tell the image size of its vision tower "
                         "(config.vision_config.image_size), which headlab needs to run it")
    return channels, size, size


def pixels_needed(model: nn.Module) -> str:
    """The one line that refuses text alone for a model that ``needs_pixels``."""
    channels, height, width = image_shape(model)
    return (f"{type(model).__name__} needs pixel_values with the text (its text and vision towers each take their "
            f"own input): pass a dict of input_ids, attention_mask and pixel_values (batch, {channels}, {height}, "
            f"{width})")
