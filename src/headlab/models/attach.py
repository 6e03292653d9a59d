"""Attach headlab's attention implementation to a transformers model, and find its attention sites.

``attach(model)`` selects the ``"headlab"`` implementation of transformers' ``AttentionInterface``
on a model in memory, runs it once on a few tokens, pixels or log-mel features
(``headlab.models.probe``) and gives each call of the attention function an ``AttentionSite``: its
layer (the order the calls ran in), head geometry, causality, output projection and q/k/v layout. Nothing else
of the model changes: its weights, modules and ``state_dict`` stay the transformers ones, and
its outputs equal the ``"sdpa"`` model's.

A model whose attention does not go through the interface (BLOOM's inline ALiBi, DeBERTa's
disentangled attention, ...) is refused with the reason, never run in another way.
"""

from __future__ import annotations

import warnings
from typing import Any, cast

from torch import nn

from headlab.layer.taps import SITE_ATTRIBUTE
from headlab.models.calls import AttentionCall
from headlab.models.handle import HANDLE_ATTRIBUTE, HeadedModel, headed, module_of
from headlab.models.interface import IMPLEMENTATION, register
from headlab.models.layout import find_layout
from headlab.models.native import is_native, native_sites
from headlab.models.probe import run_probe
from headlab.models.site import SAVED_HEADS_ATTRIBUTE, AttentionSite, OutProjection, SharedSites, name_stacks, sites_of

_PREVIOUS = "headlab_previous_attn_implementation"  # on an attached model: what to restore on detach
_RESTART = "headlab_restart_shared_sites"  # on a model with shared attention modules: its forward pre-hook's handle


def attach(model: HeadedModel | nn.Module, *, tokenizer: Any = None) -> HeadedModel:
    """Run ``model``'s attention through headlab, in place, and return its handle.

    A transformers model gets the ``"headlab"`` attention implementation and one site per module
    that calls it (found by one probe forward); a torch module built of headlab layers (a
    ``MultiHeadAttention``, the experiments' ``TinyTransformer``) gets one site per layer
    (``headlab.models.native``). A model already attached keeps its sites and its handle.

    Args:
        model: a transformers ``PreTrainedModel`` (any head: base, causal LM, ...), a torch module
            holding headlab layers, or a ``HeadedModel``.
        tokenizer: its tokenizer, processor or feature extractor, kept on the handle for text and audio
            inputs; None keeps the one the handle has (or none).

    Returns:
        The model's ``HeadedModel``; the model itself is ``handle.model``, changed in place.

    Raises:
        TypeError: neither a transformers model nor a module holding headlab layers.
        ValueError: an architecture headlab cannot serve exactly (cross-attention without an encoder,
            attention computed outside transformers' AttentionInterface, learned sink logits, inputs other
            than token ids, pixels and audio features); the message names the reason. The model is left as
            it was.
    """
    net = module_of(model)
    if isinstance(net, nn.Module) and is_native(net):
        if not sites_of(net):
            for site in native_sites(net):
                setattr(site.module, SITE_ATTRIBUTE, site)
    else:
        _attach_transformers(net)
    handle = model if isinstance(model, HeadedModel) else net.__dict__.get(HANDLE_ATTRIBUTE)
    if not isinstance(handle, HeadedModel) or handle.model is not net:
        handle = HeadedModel(net, tokenizer=tokenizer)
    else:  # the model's own handle, told of the sites it has now (new ones after a re-attach)
        handle._read_sites()
        handle.tokenizer = handle.tokenizer if tokenizer is None else tokenizer
    net.__dict__[HANDLE_ATTRIBUTE] = handle
    return handle


def _attach_transformers(net: Any) -> None:
    """Select headlab's attention implementation on a transformers model and give it sites (once)."""
    _check_model(net)
    register()
    if sites_of(net) and net.config._attn_implementation == IMPLEMENTATION:
        return
    previous = net.config._attn_implementation
    net.set_attn_implementation(IMPLEMENTATION)
    try:
        if net.config._attn_implementation != IMPLEMENTATION:
            raise ValueError(_outside(type(net).__name__, net.config.model_type,
                                      "transformers would not switch its attention implementation"))
        calls, _ = run_probe(net)
        sites = _build_sites(net, calls)
    except BaseException:
        net.set_attn_implementation(previous)
        raise
    _set_sites(net, sites)
    setattr(net, _PREVIOUS, previous)


def detach(model: HeadedModel | nn.Module) -> nn.Module:
    """Undo ``attach``: remove the sites and the handle, and restore the previous attention implementation.

    Interventions and taps go with the sites; pruned modules stay pruned. A headlab layer's own
    persistent affine (``MultiHeadAttention.set_head_affine``) stays: it is part of its ``state_dict``.

    Returns:
        The model itself.
    """
    net = module_of(model)
    for module in net.modules():
        module.__dict__.pop(SITE_ATTRIBUTE, None)
    net.__dict__.pop(HANDLE_ATTRIBUTE, None)
    restart = net.__dict__.pop(_RESTART, None)
    if restart is not None:
        restart.remove()
    previous = getattr(net, _PREVIOUS, None)
    if previous is not None:
        cast(Any, net).set_attn_implementation(previous)  # a transformers model: _PREVIOUS says so
        delattr(net, _PREVIOUS)
    return net


def attention_sites(model: HeadedModel | nn.Module) -> list[AttentionSite]:
    """Deprecated: ``headed(model).sites`` (a ``HeadedModel``'s ``sites``)."""
    warnings.warn("headlab.models.attention_sites(model) is deprecated: use the handle's sites "
                  "(headlab.load(...).sites, headlab.attach(model).sites)", DeprecationWarning, stacklevel=2)
    return headed(model).sites


def check_architecture(model_class: type, config: Any) -> None:
    """Refuse, before any weight is loaded, an architecture headlab cannot serve exactly.

    Args:
        model_class: the concrete model class, or a transformers ``AutoModel…`` class.
        config: its config.

    Raises:
        ValueError: cross-attention blocks in a decoder without an encoder, or
            attention computed outside the AttentionInterface; the message names the reason.
    """
    mapping = getattr(model_class, "_model_mapping", None)
    if mapping is not None:  # an Auto class: the class it would build
        try:
            model_class = mapping[type(config)]
        except KeyError:
            return  # transformers itself will say the config is unknown
    name, model_type = model_class.__name__, getattr(config, "model_type", None)
    if getattr(config, "add_cross_attention", False) and not getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{name} has cross-attention blocks (config.add_cross_attention=True); headlab serves "
                         "self-attention only")
    can_set = getattr(model_class, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        raise ValueError(_outside(name, model_type, "its modeling code has attention modules that never call "
                                                    "ALL_ATTENTION_FUNCTIONS (e.g. inline ALiBi or disentangled "
                                                    "attention)"))


def _check_model(net: Any) -> None:
    try:
        from transformers import PreTrainedModel
    except ImportError as err:  # pragma: no cover - the models extra is missing
        raise ImportError("headlab.attach needs transformers: pip install 'headlab[models]'") from err
    if not isinstance(net, PreTrainedModel):
        raise TypeError(f"expected a transformers PreTrainedModel, a torch module built of headlab layers or a "
                        f"HeadedModel, got {type(net).__name__}")
    check_architecture(type(net), net.config)


def _set_sites(net: nn.Module, sites: list[AttentionSite]) -> None:
    """Give each module its site; a module of several sites their ``SharedSites``, taken in turn from the start
    of every forward of ``net``."""
    by_module: dict[int, list[AttentionSite]] = {}
    for site in sites:
        by_module.setdefault(id(site.module), []).append(site)
    shared = []
    for group in by_module.values():
        attached = group[0] if len(group) == 1 else SharedSites(group)
        setattr(group[0].module, SITE_ATTRIBUTE, attached)
        if isinstance(attached, SharedSites):
            shared.append(attached)
    previous = net.__dict__.pop(_RESTART, None)
    if previous is not None:
        previous.remove()
    if shared:
        def restart(module: nn.Module, args: Any) -> None:
            for each in shared:
                each.restart()

        net.__dict__[_RESTART] = net.register_forward_pre_hook(restart)


def _outside(name: str, model_type: Any, why: str) -> str:
    return (f"{name} (model_type {model_type!r}) computes attention outside transformers' AttentionInterface: "
            f"{why}; headlab cannot see its heads exactly, and docs/models.md lists the architectures it serves")


def _build_sites(net: nn.Module, calls: list[AttentionCall]) -> list[AttentionSite]:
    """One site per call of the attention function, checked and in call order (a module that runs several times
    per forward, ALBERT's, gets one per call)."""
    from transformers.pytorch_utils import Conv1D

    if not calls:
        raise ValueError(_outside(type(net).__name__, cast(Any, net).config.model_type,
                                  "a forward of it never called the registered function"))
    names = {id(m): name for name, m in net.named_modules()}
    sites = []
    for layer, call in enumerate(calls):
        module = call.module
        if isinstance(getattr(module, "sinks", None), nn.Parameter):
            raise ValueError(f"{type(module).__name__} adds learned per-head sink logits to the softmax "
                             "(gpt-oss style), which headlab's attention does not compute")
        batch, n_heads, length, d_head = call.query.shape
        n_kv_heads, d_head_v = call.key.shape[1], call.value.shape[-1]
        saved = module.__dict__.pop(SAVED_HEADS_ATTRIBUTE, None)  # a pruned model's heads as saved
        if n_heads % n_kv_heads and saved is None:
            raise ValueError(f"{names[id(module)]}: {n_heads} query heads and {n_kv_heads} key/value heads do not "
                             "form equal groups")
        flat = call.output.reshape(batch, length, n_heads * d_head_v)
        out = next((p.module for p in call.after if p.input.shape == flat.shape and p.input.equal(flat)), None)
        out_proj = None if out is None else OutProjection(out, names[id(out)], isinstance(out, Conv1D))
        site = AttentionSite(module, name=names[id(module)], layer=layer, n_heads=n_heads, n_kv_heads=n_kv_heads,
                             d_head=d_head, d_head_v=d_head_v, causal=call.causal, out_proj=out_proj,
                             cross=call.cross)
        if saved is not None:
            site.head_ids, site.kv_head_of = list(saved[0]), tuple(saved[1])
        layout = find_layout(call, n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head, d_head_v=d_head_v,
                             out_proj=out)
        if isinstance(layout, str):
            site.layout_problem = layout
        else:
            site.layout = layout
        sites.append(site)
    name_stacks(sites)
    return sites
