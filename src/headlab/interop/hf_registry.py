"""The one registry of Hugging Face family adapters, keyed by config class.

An adapter is a module of ``headlab.interop`` with ``swap(model)``, ``export(model)`` and
``swapped(model)``. It is imported on first use, so that ``headlab.interop`` does not import
transformers. A model's config class is matched by name along its MRO, so a subclass of a
supported config finds its family's adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from types import ModuleType

from torch import nn

from headlab.interop.hf_attention import SwappedAttention
from headlab.layer import MultiHeadAttention


@dataclass(frozen=True)
class Family:
    """One supported architecture.

    Attributes:
        config_class: the transformers config class name, e.g. ``"BertConfig"``.
        model_type: its ``config.model_type``, e.g. ``"bert"``.
        adapter: the adapter module's import path.
    """

    config_class: str
    model_type: str
    adapter: str


FAMILIES: dict[str, Family] = {}


def register(config_class: str, model_type: str, adapter: str) -> None:
    """Register (or replace) the adapter of a transformers config class.

    Args:
        config_class: the config class name.
        model_type: its ``model_type`` (shown in error messages).
        adapter: import path of a module with ``swap``, ``export`` and ``swapped``.
    """
    FAMILIES[config_class] = Family(config_class, model_type, adapter)


for _config_class, _model_type, _adapter in (
    ("BertConfig", "bert", "headlab.interop.hf_bert"),
    ("RobertaConfig", "roberta", "headlab.interop.hf_bert"),
    ("XLMRobertaConfig", "xlm-roberta", "headlab.interop.hf_bert"),
    ("GPT2Config", "gpt2", "headlab.interop.hf_gpt2"),
    ("LlamaConfig", "llama", "headlab.interop.hf_llama"),
    ("MistralConfig", "mistral", "headlab.interop.hf_llama"),
    ("Qwen2Config", "qwen2", "headlab.interop.hf_llama"),
):
    register(_config_class, _model_type, _adapter)


def supported() -> str:
    """The supported config classes and model types, as one line for messages."""
    return ", ".join(f"{f.config_class} ({f.model_type})" for f in FAMILIES.values())


def family_of(config: object) -> Family:
    """The registered family of a transformers config (or of a model, through its ``.config``).

    Raises:
        ValueError: the config's class is not registered; the message lists the supported ones.
    """
    config = getattr(config, "config", config)
    for cls in type(config).__mro__:
        if cls.__name__ in FAMILIES:
            return FAMILIES[cls.__name__]
    raise ValueError(
        f"{type(config).__name__} (model_type={getattr(config, 'model_type', None)!r}) has no headlab adapter; "
        f"supported: {supported()}"
    )


def adapter_for(model_or_config: object) -> ModuleType:
    """The adapter module for a model or config (see ``family_of``)."""
    return import_module(family_of(model_or_config).adapter)


def swap(model: nn.Module) -> nn.Module:
    """Replace each attention module of a transformers model by a headlab layer, in place.

    Args:
        model: a model of a supported family (any head: base model, causal LM, ...).

    Returns:
        ``model``; its outputs equal the original's to float tolerance.

    Raises:
        ValueError: an unsupported architecture (the message lists the supported ones) or
            an unsupported feature of a supported one (named in the message).
    """
    return adapter_for(model).swap(model)


def export(model: nn.Module) -> nn.Module:
    """Restore the original transformers attention modules with the headlab layers' current weights.

    Returns:
        ``model``, in place; swap then export gives back the original state_dict exactly.

    Raises:
        ValueError: unsupported architecture, or a layer the original module cannot hold.
    """
    return adapter_for(model).export(model)


def swapped_modules(model: nn.Module) -> list[SwappedAttention]:
    """Every ``SwappedAttention`` in ``model``, in layer order (empty if none)."""
    found = [m for m in model.modules() if isinstance(m, SwappedAttention)]
    return sorted(found, key=lambda m: m.layer_index)


def swapped_layers(model: nn.Module) -> list[MultiHeadAttention]:
    """The headlab layers inside ``swapped_modules(model)``, in layer order."""
    return [m.attn for m in swapped_modules(model)]
