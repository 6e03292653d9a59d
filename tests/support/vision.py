"""Tiny random vision transformers saved as checkpoint folders beside a tiny image processor, and images drawn with
PIL: what the image tests of the library, the commands and the browser share.

- ``save_vision(folder, kind)``: a ViT, DeiT or DINOv2 (with two registers) of 2 layers × 4 heads on 16 × 16 inputs
  in 4 × 4 patches (a 4 × 4 grid), saved with a ``ViTImageProcessor`` resizing to 16 × 16; weights far larger than
  transformers' init, so that patterns are far from uniform.
- ``write_images(folder)``: a few small RGB PNGs of different sizes and content (seeded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

SIZE = 16  # the processor's output side, in pixels
PATCH = 4  # the patch side: a 4 × 4 grid
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=SIZE,
             patch_size=PATCH, initializer_range=0.2)
KINDS: dict[str, tuple[str, str, dict[str, Any]]] = {  # kind: (config class, model class, config beyond SMALL)
    "vit": ("ViTConfig", "ViTModel", {}),
    "deit": ("DeiTConfig", "DeiTModel", {}),
    "dinov2": ("Dinov2WithRegistersConfig", "Dinov2WithRegistersModel", dict(num_register_tokens=2)),
}
SPECIAL = {"vit": ["[CLS]"], "deit": ["[CLS]", "[DIST]"], "dinov2": ["[CLS]", "reg 0", "reg 1"]}  # their labels


def save_vision(folder: Path, kind: str = "vit", *, processor: bool = True) -> Path:
    """Save a tiny random ``kind`` model (``KINDS``) into ``folder``, with its image processor unless not
    ``processor``; returns the folder."""
    import torch
    import transformers

    config_class, model_class, extra = KINDS[kind]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**SMALL | extra))
    model.save_pretrained(folder)
    if processor:
        transformers.ViTImageProcessor(size={"height": SIZE, "width": SIZE}).save_pretrained(folder)
    return folder


def write_images(folder: Path, n: int = 3) -> list[Path]:
    """Write ``n`` small RGB PNGs (``image0.png``, …; 20 × 24, 32 × 32, … pixels, seeded noise over a gradient)
    into ``folder`` (made if missing); returns their paths in name order."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        height, width = 20 + 12 * i, 24 + 8 * i
        ramp = np.linspace(0, 255, width)[None, :, None] * np.ones((height, 1, 3))
        pixels = np.clip(ramp * 0.6 + rng.uniform(0, 100, (height, width, 3)), 0, 255).astype(np.uint8)
        paths.append(folder / f"image{i}.png")
        Image.fromarray(pixels, mode="RGB").save(paths[-1])
    return paths
