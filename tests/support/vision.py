"""Tiny random vision transformers saved as checkpoint folders beside a tiny image processor, and images drawn with
PIL: what the image tests of the library, the commands and the browser share.

- ``save_vision(folder, kind)``: a ViT, DeiT or DINOv2 (with two registers) of 2 layers × 4 heads on 16 × 16 inputs
  in 4 × 4 patches (a 4 × 4 grid), saved with a ``ViTImageProcessor`` resizing to 16 × 16; weights far larger than
  transformers' init, so that patterns are far from uniform. ``"swin"``: a Swin of two stages of two blocks (the
  second shifted), 2 then 4 heads, windows of 2 × 2 patches of 4 × 4 pixels, its relative position bias random; its
  processor resizes to ``size`` (16: grids of 4 × 4 then 2 × 2 patches; 20: 5 × 5 then 3 × 3, both padded).
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
    "swin": ("SwinConfig", "SwinModel", dict(embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=2)),
}
SWIN_DROPS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")  # Swin's are its own
SPECIAL = {"vit": ["[CLS]"], "deit": ["[CLS]", "[DIST]"], "dinov2": ["[CLS]", "reg 0", "reg 1"]}  # their labels


def vision_model(kind: str = "vit", *, size: int = SIZE) -> Any:
    """A tiny random ``kind`` model (``KINDS``) for ``size`` × ``size`` inputs, seeded, in eval mode."""
    import torch
    import transformers

    config_class, model_class, extra = KINDS[kind]
    settings = {k: v for k, v in SMALL.items() if kind != "swin" or k not in SWIN_DROPS} | {"image_size": size}
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**settings | extra))
    for name, parameter in model.named_parameters():
        if name.endswith("relative_position_bias_table"):  # zeros at init: make the position bias tell heads apart
            parameter.data.normal_(0.0, 1.0)
    return model.eval()


def save_vision(folder: Path, kind: str = "vit", *, processor: bool = True, size: int = SIZE) -> Path:
    """Save a tiny random ``kind`` model (``vision_model``) for ``size`` × ``size`` inputs into ``folder``, with its
    image processor resizing to that unless not ``processor``; returns the folder."""
    import transformers

    vision_model(kind, size=size).save_pretrained(folder)
    if processor:
        transformers.ViTImageProcessor(size={"height": size, "width": size}).save_pretrained(folder)
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
