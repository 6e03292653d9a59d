"""Reading a model saved with its headlab layers (``headlab.heads.save``): pruned, masked, scaled.

Such a folder holds the Hugging Face ``config.json`` of the original architecture, the
tokenizer, ``model.safetensors`` with the swapped model's own state (headlab layers, their
intervention buffers), and ``headlab.json``:

    {"format": "headlab-model/1",
     "layers": [{"index": 0, "head_ids": [0, 2, 3], "attention": {AttentionConfig fields}}, ...],
     "interventions": [{"layer", "head", "kind", "scale", "shifted"}, ...],   # for people
     "source": "<what was loaded originally>"}

Loading rebuilds the architecture from the config, swaps its attention, gives each layer the
saved shape (pruned layers are smaller) and loads every tensor strictly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from headlab.layer import AttentionConfig, MultiHeadAttention

FORMAT = "headlab-model/1"
RECORD = "headlab.json"
WEIGHTS = "model.safetensors"


def read_record(directory: Path) -> dict[str, Any]:
    """The parsed ``headlab.json`` of ``directory``.

    Raises:
        ValueError: it is not valid JSON or not of this format.
    """
    path = directory / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable headlab record ({err})") from err
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("layers"), list):
        raise ValueError(f"{path}: expected a JSON object with format {FORMAT!r} and a 'layers' list")
    return record


def reseat(modules: list[Any], record: dict[str, Any], state_keys: set[str], prefix_of: dict[int, str]) -> None:
    """Give each swapped module the layer shape and intervention buffers the record and weights describe.

    Args:
        modules: the model's swapped attention modules, in layer order.
        record: the parsed ``headlab.json``.
        state_keys: the names of the saved tensors.
        prefix_of: module index → its name in the model's state_dict (with a trailing dot).

    Raises:
        ValueError: the record names a layer the model lacks, or a layer config is invalid.
    """
    for entry in record["layers"]:
        index = entry.get("index")
        if not isinstance(index, int) or not 0 <= index < len(modules):
            raise ValueError(f"{RECORD}: layer index {index!r} does not exist (the model has {len(modules)})")
        module = modules[index]
        weight = module.attn.projection.out_proj.weight
        layer = MultiHeadAttention(AttentionConfig(**entry["attention"])).to(device=weight.device, dtype=weight.dtype)
        prefix = prefix_of[index] + "attn."
        c = layer.config
        if prefix + "head_scale" in state_keys or prefix + "head_shift" in state_keys:
            layer.set_head_affine(
                torch.ones(c.n_heads) if prefix + "head_scale" in state_keys else None,
                torch.zeros(c.n_heads, c.d_head_v) if prefix + "head_shift" in state_keys else None,
            )
        module.attn = layer.train(module.attn.training)
        module.head_ids = list(entry.get("head_ids", range(c.n_heads)))
