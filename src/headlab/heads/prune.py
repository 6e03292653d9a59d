"""Physical pruning: remove heads' weights from a model.

On a transformers model with headlab's attention attached, the model's own projection weights
are sliced (``headlab.models.pruning``): the kept query heads, their output-projection
columns, and only the key/value heads some kept query head still reads (a key/value head goes
only when all its query heads go). Each pruning is checked to give the outputs of the same
model with those heads masked.
"""

from __future__ import annotations

from torch import nn

from headlab.heads.selection import HeadSelection
from headlab.models import HeadedModel, LayerSite, headed
from headlab.models.pruning import prune_model


def prune(model: HeadedModel | nn.Module, heads: HeadSelection) -> dict[int, list[int]]:
    """Remove heads from an attached model, in place.

    Args:
        model: a ``HeadedModel`` of a transformers model, or an attached transformers model.
        heads: a head selection (``headlab.heads.selection``), in each layer's current numbering.

    Returns:
        ``{layer: original indices of the heads that remain}`` for the layers pruned.

    Raises:
        ValueError: a layer would lose every head (mask them instead), its projections are
            not in a layout headlab can slice, or the pruned model would not equal the masked
            one; nothing is changed then.
    """
    handle = headed(model)
    sites = handle.sites
    selection = handle.heads(heads)
    if isinstance(sites[0], LayerSite):
        raise ValueError("headlab.heads.prune slices a transformers model's projections; a headlab layer's heads are "
                         "removed by building the layer with fewer heads (headlab.layer.convert), or masked "
                         "exactly with headlab.heads.mask")
    prune_model(handle.model, sites, selection)
    return {layer: list(sites[layer].head_ids) for layer in selection}
