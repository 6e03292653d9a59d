"""A model saved by ``headlab.heads.save``: an ordinary transformers checkpoint plus a record.

Such a folder holds the transformers ``config.json`` of the original architecture, the
tokenizer, ``model.safetensors`` with the model's own ``state_dict`` (pruned projections are
smaller), ``headlab.json`` and, when heads carry interventions, ``headlab.safetensors``:

    headlab.json
        {"format": "headlab-model/3", "source": "<what was loaded originally>",
         "architecture": "<model class>",
         "layers": [{"layer": 0, "name": "<module>", "head_ids": [0, 2, 3], "kv_head_of": [0, 1, 1],
                     "counts": {"num_heads": 3, ...}}, ...],
         "interventions": [{"layer", "head", "kind", "scale", "shifted"}, ...]}   # for people
    headlab.safetensors
        layers.{layer}.scale (n_heads,)   layers.{layer}.shift (n_heads, d_head_v)

A model that was neither pruned nor intervened on loads with plain transformers too; a pruned
one needs ``headlab.load``, which builds the architecture with its parameters on the meta device
(no weights allocated or initialised), gives each parameter the shape the weights file holds and
each attention module its recorded counts, assigns every tensor strictly, attaches (the probe runs
on the loaded weights), and sets the recorded heads and interventions back.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headlab.models.pruning import COUNTED, OWN_CONFIG
from headlab.models.site import AttentionSite

FORMAT = "headlab-model/3"
RECORD = "headlab.json"
WEIGHTS = "model.safetensors"
INTERVENTIONS = "headlab.safetensors"


def read_record(directory: Path) -> dict[str, Any]:
    """The parsed ``headlab.json`` of ``directory``.

    Raises:
        ValueError: it is not valid JSON or not of this format.
    """
    path = directory / RECORD
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable headlab record ({err})") from err
    if not isinstance(record, dict) or record.get("format") != FORMAT or not isinstance(record.get("layers"), list):
        found = record.get("format") if isinstance(record, dict) else None
        raise ValueError(f"{path}: expected a JSON object with format {FORMAT!r} and a 'layers' list (found format "
                         f"{found!r}; a folder saved by an older headlab must be saved again)")
    return record


def site_record(site: AttentionSite) -> dict[str, Any]:
    """One layer's entry of ``headlab.json``: its module, its heads and what its module's forward reads of their
    count (``module_counts``), so that a pruned model is rebuilt without running the unpruned one."""
    return {"layer": site.layer, "name": site.name, "head_ids": list(site.head_ids),
            "kv_head_of": list(site.kv_head_of), "counts": module_counts(site.module)}


def module_counts(module: nn.Module) -> dict[str, Any]:
    """The head counts and widths an attention module's forward reads (``headlab.models.pruning.COUNTED``: those it
    has, as ints), and its own config's head counts where pruning gave it one (``"config"``)."""
    counts: dict[str, Any] = {name: value for name in COUNTED
                              if isinstance(value := getattr(module, name, None), int)}
    config = getattr(module, "config", None)
    if config is not None and getattr(module, OWN_CONFIG, False):
        counts["config"] = {name: getattr(config, name) for name in ("num_attention_heads", "num_key_value_heads")
                            if isinstance(getattr(config, name, None), int)}
    return counts


def restore_counts(model: nn.Module, record: dict[str, Any]) -> None:
    """Set each recorded module's counts (``module_counts``) on ``model`` (built from the config: unpruned counts).

    Raises:
        ValueError: the record names a module the model does not have.
    """
    for entry in record["layers"]:
        name, counts = entry.get("name") if isinstance(entry, dict) else None, entry.get("counts", {})
        try:
            module = model.get_submodule(name) if isinstance(name, str) else None
        except AttributeError:
            module = None
        if module is None or not isinstance(counts, dict):
            raise ValueError(f"{RECORD}: layer {entry.get('layer')!r} names module {name!r} with counts {counts!r}: "
                             "expected a module of the model and its counts (a dict)")
        for attribute, value in counts.items():
            if attribute != "config":
                setattr(module, attribute, value)
        if "config" in counts:
            own = copy.copy(module.config)
            for attribute, value in counts["config"].items():
                setattr(own, attribute, value)
            module.config = own
            setattr(module, OWN_CONFIG, True)


def site_tensors(sites: list[AttentionSite]) -> dict[str, torch.Tensor]:
    """The interventions of every site, keyed as in ``headlab.safetensors``."""
    tensors = {}
    for site in sites:
        for name in ("scale", "shift"):
            value = getattr(site, name)
            if value is not None:
                tensors[f"layers.{site.layer}.{name}"] = value.detach().cpu().contiguous()
    return tensors


def restore_sites(directory: Path, sites: list[AttentionSite], record: dict[str, Any]) -> None:
    """Give the sites of the rebuilt (pruned) model the original ids of their heads, as recorded.

    Raises:
        ValueError: the record names a layer the model lacks, or head ids that are not one distinct id ≥ 0 per head
            of the layer.
    """
    for entry in record["layers"]:
        layer = entry.get("layer") if isinstance(entry, dict) else None
        if not isinstance(layer, int) or not 0 <= layer < len(sites):
            raise ValueError(f"{directory / RECORD}: layer {layer!r} does not exist (the model has {len(sites)})")
        kept, n_heads = entry.get("head_ids"), sites[layer].n_heads
        if not isinstance(kept, list) or len(kept) != n_heads or len(set(kept)) != len(kept) \
                or not all(isinstance(h, int) and h >= 0 for h in kept):
            raise ValueError(f"{directory / RECORD}: layer {layer} head_ids {kept!r} are not heads of its {n_heads} "
                             "(one distinct id ≥ 0 per head)")
        sites[layer].head_ids = list(kept)


def load_interventions(directory: Path, sites: list[AttentionSite]) -> None:
    """Set the saved interventions (if any) on the sites.

    Raises:
        ValueError: the file is unreadable or names a layer or shape the model lacks.
    """
    path = directory / INTERVENTIONS
    if not path.exists():
        return
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(path)
    except (OSError, SafetensorError) as err:
        raise ValueError(f"{path}: not readable ({type(err).__name__}: {err})") from err
    found: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if len(parts) != 3 or parts[0] != "layers" or not parts[1].isdigit() or parts[2] not in ("scale", "shift") \
                or not int(parts[1]) < len(sites):
            raise ValueError(f"{path}: unexpected tensor {key!r}; expected layers.<layer>.scale or .shift")
        found.setdefault(int(parts[1]), {})[parts[2]] = value
    for layer, values in found.items():
        try:
            sites[layer].set_affine(values.get("scale"), values.get("shift"))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{path}: {err}") from err
