"""Physical pruning of an attached model's heads: its own projection weights, sliced.

A pruned attention module keeps the rows of its q/k/v projections that belong to the kept
query heads and to the key/value heads some kept query head still reads (grouped-query
attention: a key/value head goes only when all its query heads go), and the matching input
columns of its output projection, and the kept heads' entries of any table the module keeps per
head on its last axis (Swin's relative position bias: ``_per_head_tables``). The module's head
counts and widths that its forward reads are updated; uneven groups left behind are served by
headlab's attention through the site's ``kv_head_of``. Every pruning is checked on the probe
input: the pruned model's output must equal the same model with those heads masked, or the
model is restored and the call refused.

Axis legend: Linear weights ``(out_features, in_features)``; Conv1D weights ``(in_features,
out_features)``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn

from headlab.models.layout import Layout, Segment
from headlab.models.site import AttentionSite

# Attributes an attention module's forward may read, by what they count. Only those whose value
# is the count before pruning are updated.
_QUERY_HEADS = ("num_heads", "num_attention_heads", "n_head", "n_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "kv_heads")
_QUERY_WIDTHS = ("all_head_size", "split_size", "embed_dim", "inner_dim")
_KV_WIDTHS = ("kv_dim",)
# Every count above, and transformers' key/value repeat (set below): what a pruned model is saved with.
COUNTED = (*_QUERY_HEADS, *_KV_HEADS, *_QUERY_WIDTHS, *_KV_WIDTHS, "num_key_value_groups")
OWN_CONFIG = "_headlab_own_config"  # on a module given a config of its own by pruning


def check_prunable(site: AttentionSite, removed: Sequence[int]) -> list[str]:
    """Raise ValueError unless ``removed`` heads can be cut out of ``site``'s module.

    A parameter of the module outside the projections that is as wide as every head's q, k or v together
    (a norm over all heads' queries) stops pruning, unless it is as wide as the model too (ALBERT's
    LayerNorm after the output projection): which of the two it is, the check of ``prune_model`` tells.

    Returns:
        Those parameters as wide as both, ``"name (shape)"``, for that check's message.

    Raises:
        ValueError: every head would go, the q/k/v layout is not recognised, there is no
            output projection, or a parameter spans all heads (e.g. a norm over every head's query).
    """
    where = f"layer {site.layer} ({site.name})"
    if len(set(removed)) >= site.n_heads:
        raise ValueError(f"pruning every head of {where} would leave no attention; mask them instead")
    if site.layout is None:
        raise ValueError(f"{where}: its q/k/v projections are not in a layout headlab can slice "
                         f"({site.layout_problem})")
    if site.out_proj is None:
        raise ValueError(f"{where}: no output projection takes the heads' z directly, so heads cannot be cut out")
    sliced = {id(t) for m in [p.module for p in site.layout.projections] + [site.out_proj.module]
              for t in (m.weight, getattr(m, "bias", None)) if t is not None}
    n, g = site.n_heads, site.n_kv_heads
    widths = {n * site.d_head, n * site.d_head_v} | ({g * site.d_head, g * site.d_head_v} if g > 1 else set())
    d_model = site.out_proj.weight.shape[0]
    ambiguous = []
    for name, parameter in site.module.named_parameters():
        if id(parameter) in sliced or not any(size in widths for size in parameter.shape):
            continue
        if d_model in parameter.shape:
            ambiguous.append(f"{name!r} {tuple(parameter.shape)}")
            continue
        raise ValueError(
            f"{where}: the parameter {name!r} {tuple(parameter.shape)} spans every head's dimensions (e.g. a norm "
            "over all heads' queries), so removing a head would change the others; mask heads instead")
    return ambiguous


def _per_head_tables(site: AttentionSite) -> list[tuple[nn.Module, str]]:
    """The tables ``site``'s module keeps per head, as ``(owner module, attribute)``: its parameters outside the
    projections whose last axis has one entry per head and that are not a layer's ``weight`` or ``bias`` (a table
    its own code indexes: Swin's ``relative_position_bias_table``, (relative positions, head)). A layer's weight
    of that width (T5's bias embedding, read whole by the stack) is left to ``prune_model``'s check."""
    found = []
    for name, parameter in site.module.named_parameters():
        owner, _, attribute = name.rpartition(".")
        if attribute not in ("weight", "bias") and parameter.dim() >= 1 and parameter.shape[-1] == site.n_heads:
            found.append((site.module.get_submodule(owner) if owner else site.module, attribute))
    return found


def prune_site(site: AttentionSite, keep: Sequence[int], *, sharing: Sequence[AttentionSite] = ()) -> None:
    """Cut every query head of ``site`` not in ``keep`` out of its module, in place.

    Args:
        site: an attached site whose layout is known (see ``check_prunable``).
        keep: the query heads to keep, in the site's current numbering.
        sharing: the other sites of the same module (ALBERT's layers), told of the same cut.
    """
    keep = sorted(set(keep))
    kv_keep = sorted({site.kv_head_of[h] for h in keep})
    new_q = {h: i for i, h in enumerate(keep)}
    new_kv = {h: i for i, h in enumerate(kv_keep)}
    assert site.layout is not None and site.out_proj is not None
    projections = []
    for p in site.layout.projections:
        segments: list[Segment] = []
        rows: list[int] = []
        start = 0
        for s in p.segments:
            renumber = new_q if s.role == "q" else new_kv
            if s.head in renumber:
                rows.extend(range(s.start, s.stop))
                segments.append(Segment(s.role, renumber[s.head], start, start + s.stop - s.start))
                start += s.stop - s.start
        _slice_outputs(p.module, rows, transposed=p.transposed)
        projections.append(replace(p, segments=tuple(segments)))
    columns = [c for h in keep for c in range(h * site.d_head_v, (h + 1) * site.d_head_v)]
    _slice_inputs(site.out_proj.module, columns, transposed=site.out_proj.transposed)
    for owner, attribute in _per_head_tables(site):
        table = getattr(owner, attribute)
        kept = table.detach().index_select(-1, torch.tensor(keep, device=table.device)).clone()
        setattr(owner, attribute, nn.Parameter(kept, requires_grad=table.requires_grad))

    before = (site.n_heads, site.n_kv_heads, site.n_heads * site.d_head, site.n_kv_heads * site.d_head)
    after = (len(keep), len(kv_keep), len(keep) * site.d_head, len(kv_keep) * site.d_head)
    _update_counts(site.module, before, after)
    layout, kv_head_of = Layout(tuple(projections)), tuple(new_kv[site.kv_head_of[h]] for h in keep)
    index = torch.tensor(keep)
    for each in (site, *sharing):
        each.layout, each.kv_head_of = layout, kv_head_of
        each.n_heads, each.n_kv_heads = len(keep), len(kv_keep)
        each.head_ids = [each.head_ids[h] for h in keep]
        each.scale = None if each.scale is None else each.scale.index_select(0, index.to(each.scale.device))
        each.shift = None if each.shift is None else each.shift.index_select(0, index.to(each.shift.device))
    if hasattr(site.module, "num_key_value_groups"):
        # transformers' SDPA repeats key/value heads num_key_value_groups times; uneven groups are
        # expanded by headlab's attention before it, so the module must not repeat them again.
        module: Any = site.module  # a transformers attention module
        module.num_key_value_groups = site.n_heads // site.n_kv_heads if site.uniform_groups else 1


def prune_model(model: nn.Module, sites: Sequence[AttentionSite], selection: Mapping[int, Sequence[int]], *,
                verify: bool = True) -> None:
    """Remove ``selection`` ``{layer: heads}`` from an attached model, all or nothing.

    Args:
        model: the attached transformers model.
        sites: its sites, in layer order.
        selection: heads to remove per layer, in each layer's current numbering.
        verify: check on the probe input that the pruned model equals the masked one (restoring
            the model and raising otherwise). Off only where the weights are about to be
            replaced (loading a saved pruned model).

    Raises:
        ValueError: a layer cannot be pruned (see ``check_prunable``), or the check failed.
    """
    from headlab.models.probe import first_output, probe_inputs

    ambiguous = sorted({name for layer, removed in selection.items() for name in check_prunable(sites[layer], removed)})
    spans = f"; {', '.join(ambiguous)} may span every head's dimensions" if ambiguous else ""
    sharing = _sharing(sites, selection)
    saved = [_snapshot(sites[layer]) for layer in selection]
    reference = None
    if verify:
        inputs = probe_inputs(model)
        affine = {layer: (sites[layer].scale, sites[layer].shift) for layer in selection}
        for layer, removed in selection.items():
            site = sites[layer]
            scale = torch.ones(site.n_heads) if site.scale is None else site.scale.clone()
            scale[list(removed)] = 0.0
            shift = None if site.shift is None else site.shift.clone().index_fill_(
                0, torch.tensor(list(removed), device=site.shift.device), 0.0)
            site.set_affine(scale, shift)
        try:
            with torch.no_grad():
                reference = first_output(model(**inputs))
        finally:
            for layer, (kept_scale, kept_shift) in affine.items():
                sites[layer].scale, sites[layer].shift = kept_scale, kept_shift
    try:
        for layer, removed in selection.items():
            site = sites[layer]
            if layer in sharing:
                prune_site(site, [h for h in range(site.n_heads) if h not in set(removed)], sharing=sharing[layer])
        if reference is not None:
            try:
                with torch.no_grad():
                    got = first_output(model(**inputs))
            except RuntimeError as err:  # a per-head tensor neither the projections nor a table hold
                raise ValueError(
                    f"pruning layers {sorted(selection)} of {type(model).__name__} breaks its forward ({err}): a "
                    f"per-head tensor outside the q/k/v and output projections keeps every head{spans}; the model "
                    "is unchanged, mask the heads instead") from None
            tolerance = 1e-4 if got.dtype in (torch.float32, torch.float64) else 3e-2
            error = float((got - reference).abs().max() / reference.abs().max().clamp_min(1e-12))
            if not error <= tolerance:
                raise ValueError(
                    f"pruning layers {sorted(selection)} of {type(model).__name__} does not reproduce the masked model "
                    f"(relative difference {error:.2g} > {tolerance:g}): its projection layout is not what headlab "
                    f"reads it as{spans}; the model is unchanged, mask the heads instead")
    except BaseException:
        for restore in saved:
            restore()
        raise


def _slice_outputs(module: Any, rows: list[int], *, transposed: bool) -> None:
    """Keep the output features ``rows`` of a Linear or Conv1D (weight and bias)."""
    index = torch.tensor(rows, device=module.weight.device)
    weight = module.weight.detach().index_select(1 if transposed else 0, index)
    module.weight = nn.Parameter(weight.clone(), requires_grad=module.weight.requires_grad)
    if getattr(module, "bias", None) is not None:
        module.bias = nn.Parameter(module.bias.detach().index_select(0, index).clone(),
                                   requires_grad=module.bias.requires_grad)
    _set_width(module, "nf" if transposed else "out_features", len(rows))


def _slice_inputs(module: Any, columns: list[int], *, transposed: bool) -> None:
    """Keep the input features ``columns`` of a Linear or Conv1D (the bias stays)."""
    index = torch.tensor(columns, device=module.weight.device)
    weight = module.weight.detach().index_select(0 if transposed else 1, index)
    module.weight = nn.Parameter(weight.clone(), requires_grad=module.weight.requires_grad)
    if not transposed:
        _set_width(module, "in_features", len(columns))


def _set_width(module: nn.Module, name: str, value: int) -> None:
    if hasattr(module, name):
        setattr(module, name, value)


def _update_counts(module: nn.Module, before: tuple[int, ...], after: tuple[int, ...]) -> None:
    """Set the module's head counts and widths (and its config's, on a copy of its own) to ``after``."""
    for names, old, new in zip((_QUERY_HEADS, _KV_HEADS, _QUERY_WIDTHS, _KV_WIDTHS), before, after):
        for name in names:
            if name == "n_heads" and hasattr(module, "relative_attention_num_buckets"):
                continue  # T5's: the stack's position bias is made of it; the attention function takes the kept heads'

            if isinstance(getattr(module, name, None), int) and getattr(module, name) == old:
                setattr(module, name, new)
    config = getattr(module, "config", None)
    if config is not None and getattr(config, "num_attention_heads", None) == before[0]:
        # Some forwards read the head count from the shared config (Phi-3): give this module its own.
        config = copy.copy(config)
        config.num_attention_heads = after[0]
        if getattr(config, "num_key_value_heads", None) == before[1]:
            config.num_key_value_heads = after[1]
        module.config = config
        setattr(module, OWN_CONFIG, True)  # saved with the module's counts (headlab.models.saved.module_counts)


def _sharing(sites: Sequence[AttentionSite], selection: Mapping[int, Sequence[int]]) -> dict[int, list[AttentionSite]]:
    """``{layer: the other sites of its module}`` for the first selected layer of each module.

    Raises:
        ValueError: a module run in several layers (ALBERT's) is not pruned of the same heads in all of them:
            its weights serve every one.
    """
    first: dict[int, int] = {}
    out: dict[int, list[AttentionSite]] = {}
    for layer in sorted(selection):
        module = sites[layer].module
        if id(module) in first:
            continue
        first[id(module)] = layer
        others = [s for s in sites if s.module is module and s.layer != layer]
        uneven = [s.layer for s in others if sorted(set(selection.get(s.layer, ()))) != sorted(set(selection[layer]))]
        if uneven:
            layers = [layer] + [s.layer for s in others]
            raise ValueError(f"layers {layers} run one attention module ({sites[layer].name}: its weights serve every "
                             f"one), so a head is pruned from all of them or none; layer {layer} would lose heads "
                             f"{sorted(set(selection[layer]))} and layer {uneven[0]} "
                             f"{sorted(set(selection.get(uneven[0], ())))}: mask heads per layer instead")
        out[layer] = others
    return out


def _snapshot(site: AttentionSite) -> Any:
    """A function that puts ``site``, its module and its projections back as they are now."""
    modules = [p.module for p in site.layout.projections] if site.layout is not None else []
    if site.out_proj is not None:
        modules.append(site.out_proj.module)
    tensors = [(m, {name: getattr(m, name) for name in ("weight", "bias") if isinstance(getattr(m, name, None),
                                                                                          Tensor)}) for m in modules]
    tensors += [(owner, {attribute: getattr(owner, attribute)}) for owner, attribute in _per_head_tables(site)]
    attributes = [(m, dict(vars(m))) for m in modules]
    module_state = {k: v for k, v in vars(site.module).items() if not k.startswith("_")}
    site_state = dict(vars(site))

    def restore() -> None:
        for module, params in tensors:
            for name, value in params.items():
                setattr(module, name, value)
        for module, state in attributes:
            for key, value in state.items():
                if not key.startswith("_"):
                    module.__dict__[key] = value
        for key, value in module_state.items():
            setattr(site.module, key, value)
        vars(site).update(site_state)

    return restore
