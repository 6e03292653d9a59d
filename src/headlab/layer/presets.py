"""Named layer configurations ("presets"): the layouts behind three questions about heads: do heads
share Q/K/V weights (``shared``)? why does the parameter count not change with the number of heads
(``wide``)? why separate W_Q and W_K instead of one W_QK (``bilinear``)?

Each preset is a function ``(d_model, n_heads) -> AttentionConfig``; ``headlab params``, the
report's parameter section and the layer-variants experiment compare them. A single head is any
preset at n_heads = 1. A preset named after a projection variant is exactly
``AttentionConfig(d_model=d_model, n_heads=n_heads, projection=name)``: the layer a user gets by
naming that variant, with every default as the config resolves it.

    wide           the standard layer (nn.MultiheadAttention): d_head = d_model / n_heads
    narrow         head i projects only slice i (d_model / n_heads wide) of the input, with its own matrices
    shared         narrow with one projection shared by every head
    bilinear       one full d_model × kdim W_QK per head instead of W_Q W_Kᵀ; standard values and output
    collaborative  one shared W̃_Q and W̃_K of width D = d_head = d_model / n_heads and a mixing vector
                   per head (Cordonnier et al. 2020); set d_head in a config for another D
    grouped-query  wide with n_kv_heads = max(1, n_heads // GQA_GROUP_SIZE)
    multi-query    wide with n_kv_heads = 1
    talking-heads  wide with talking_heads=True (Shazeer et al. 2020)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from headlab.layer.config import AttentionConfig
from headlab.layer.projections import projection_for

__all__ = ["GQA_GROUP_SIZE", "PRESETS", "check_presets", "preset_config"]

GQA_GROUP_SIZE = 4  # query heads per key/value head in the "grouped-query" preset


def _variant(projection: str) -> Callable[[int, int], AttentionConfig]:
    def config(d_model: int, n_heads: int) -> AttentionConfig:
        return AttentionConfig(d_model=d_model, n_heads=n_heads, projection=projection)

    return config


PRESETS: dict[str, Callable[[int, int], AttentionConfig]] = {
    "wide": _variant("wide"),
    "narrow": _variant("narrow"),
    "shared": _variant("shared"),
    "bilinear": _variant("bilinear"),
    "collaborative": _variant("collaborative"),
    "grouped-query": lambda d_model, n_heads: AttentionConfig(
        d_model=d_model, n_heads=n_heads, n_kv_heads=max(1, n_heads // GQA_GROUP_SIZE)),
    "multi-query": lambda d_model, n_heads: AttentionConfig(d_model=d_model, n_heads=n_heads, n_kv_heads=1),
    "talking-heads": lambda d_model, n_heads: AttentionConfig(d_model=d_model, n_heads=n_heads, talking_heads=True),
}
"""Preset name → ``(d_model, n_heads) -> AttentionConfig`` (see the module docstring).

The config alone checks its fields; a preset's sizes that its projection variant cannot use
(``narrow`` and ``shared`` need n_heads to divide d_model) are refused by ``preset_config``,
and by the layer when it is built."""


def preset_config(name: str, *, d_model: int, n_heads: int) -> AttentionConfig:
    """The config of preset ``name`` at this width and number of heads, checked as the layer will be built.

    Raises:
        ValueError: ``name`` is not in ``PRESETS`` (the known names are listed), or the preset
            cannot be built at this d_model / n_heads (the message names all three).
    """
    check_presets([name])
    try:
        config = PRESETS[name](d_model, n_heads)
        projection_for(config)  # the projection variant's own check of the sizes
    except ValueError as exc:
        raise ValueError(f"variant {name!r} with d_model={d_model}, n_heads={n_heads}: {exc}") from exc
    return config


def check_presets(names: Sequence[str]) -> list[str]:
    """Preset names as a list, checked: at least one, each known, none twice.

    Raises:
        ValueError: naming the unknown or repeated names (and the known ones).
    """
    names = list(names)
    if not names:
        raise ValueError("variants is empty; give at least one variant")
    repeated = sorted({n for n in names if names.count(n) > 1}, key=str)
    if repeated:
        raise ValueError(f"variants lists {', '.join(map(str, repeated))} more than once")
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        plural = "s" if len(unknown) > 1 else ""
        raise ValueError(f"unknown variant{plural} {', '.join(map(repr, unknown))}; "
                         f"known variants: {', '.join(PRESETS)}")
    return names
