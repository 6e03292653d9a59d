"""Saving a model with its interventions and pruning, for ``headlab.load`` to read back.

The folder format is described in ``headlab.models.saved``: the transformers config and
tokenizer, ``model.safetensors`` with the model's own ``state_dict``, ``headlab.json`` with
each layer's surviving original heads and a readable list of the interventions, and
``headlab.safetensors`` with the interventions' tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from headlab.heads.interventions import summary
from headlab.models import HeadedModel, LayerSite, headed
from headlab.models.saved import FORMAT, INTERVENTIONS, RECORD, WEIGHTS, site_record, site_tensors


def save(model: HeadedModel | nn.Module, path: str | os.PathLike[str]) -> Path:
    """Write a transformers model (pruned, masked, scaled or ablated, or untouched) to a folder.

    Args:
        model: the ``HeadedModel`` of a transformers model (its tokenizer is saved too), or an
            attached transformers model.
        path: the folder; created if missing. Files of the same names are overwritten.

    Returns:
        The folder, which ``headlab.load(path)`` reads back to an identical model.

    Raises:
        ValueError: a model of headlab layers, whose interventions are in its own ``state_dict``.
    """
    from safetensors.torch import save_file, save_model

    loaded = headed(model)
    sites = loaded.sites
    if isinstance(sites[0], LayerSite):
        raise ValueError("headlab.heads.save writes a transformers checkpoint; a model of headlab layers keeps its "
                         "interventions in its own state_dict: torch.save(model.state_dict(), path)")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    model = loaded.model
    config: Any = model.config  # a transformers PretrainedConfig
    config.architectures = [type(model).__name__]  # as save_pretrained records it: load picks the class
    # Written as it is: save_pretrained's validation refuses output_attentions=True with any attention
    # implementation but eager, while headlab's honours it.
    config.to_json_file(directory / "config.json")
    if loaded.tokenizer is not None:
        loaded.tokenizer.save_pretrained(directory)
    save_model(model, str(directory / WEIGHTS))  # drops tied duplicates; load_model restores them
    tensors = site_tensors(sites)
    if tensors:
        save_file(tensors, str(directory / INTERVENTIONS))
    elif (directory / INTERVENTIONS).exists():
        (directory / INTERVENTIONS).unlink()
    record = {
        "format": FORMAT,
        "source": loaded.source,
        "architecture": type(model).__name__,
        "layers": [site_record(site) for site in sites],
        "interventions": summary(loaded),
    }
    (directory / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return directory
