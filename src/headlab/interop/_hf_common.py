"""What the Hugging Face family adapters share: finding and replacing modules, copying
weights, and the cache and mask checks around ``SwappedAttention.attend``.

Axis legend: hidden states ``(batch, pos, d_model)``; Hugging Face 4-D masks
``(batch, 1, query_pos, key_pos)``; Linear weights ``(out_features, in_features)``.

A Hugging Face Linear that has no bias becomes a zero slice of the headlab layer's bias
(headlab's ``bias`` is all or nothing); export checks that slice is still zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headlab.interop.hf_attention import SwappedAttention
from headlab.layer import AttentionConfig, MultiHeadAttention

# Attention implementations whose masks are plain 4-D tensors (flash and flex pass other things).
MASK_IMPLEMENTATIONS = ("eager", "sdpa")


@dataclass(frozen=True)
class HFWeights:
    """One attention module's projections in Linear layout (``(out_features, in_features)``).

    A bias left None is absent in the Hugging Face module.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    o: Tensor
    q_bias: Tensor | None = None
    k_bias: Tensor | None = None
    v_bias: Tensor | None = None
    o_bias: Tensor | None = None

    @classmethod
    def from_linears(cls, q: nn.Linear, k: nn.Linear, v: nn.Linear, o: nn.Linear) -> HFWeights:
        """The (detached, not copied) weights and biases of four Linear projections."""
        def bias(linear: nn.Linear) -> Tensor | None:
            return None if linear.bias is None else linear.bias.detach()

        return cls(q=q.weight.detach(), k=k.weight.detach(), v=v.weight.detach(), o=o.weight.detach(),
                   q_bias=bias(q), k_bias=bias(k), v_bias=bias(v), o_bias=bias(o))

    @property
    def absent_biases(self) -> tuple[str, ...]:
        """Names ("q", "k", "v", "o") of the projections without a bias."""
        return tuple(name for name in "qkvo" if getattr(self, f"{name}_bias") is None)


def build_layer(config: AttentionConfig, weights: HFWeights, *, training: bool) -> MultiHeadAttention:
    """A headlab layer holding ``weights`` exactly, on their device and dtype.

    Absent biases become zeros when ``config.bias`` is True.
    """
    device, dtype = weights.q.device, weights.q.dtype
    with torch.device(device):
        layer = MultiHeadAttention(config)
    layer = layer.to(dtype=dtype)
    projection = layer.projection
    state = {
        "in_proj_weight": torch.cat((weights.q, weights.k, weights.v)),
        "out_proj.weight": weights.o,
    }
    if config.bias:
        def bias(b: Tensor | None, w: Tensor) -> Tensor:
            return torch.zeros(w.shape[0], device=device, dtype=dtype) if b is None else b

        state["in_proj_bias"] = torch.cat(
            (bias(weights.q_bias, weights.q), bias(weights.k_bias, weights.k), bias(weights.v_bias, weights.v))
        )
        state["out_proj.bias"] = bias(weights.o_bias, weights.o)
    projection.load_state_dict(state)  # strict: the layout is the wide projection's
    return layer.train(training)


def layer_weights(layer: MultiHeadAttention, *, absent_biases: Sequence[str] = (), where: str) -> HFWeights:
    """The layer's projections in Linear layout (copies), biases named in ``absent_biases`` left None.

    Raises:
        ValueError: a bias the Hugging Face module cannot hold is not zero.
    """
    projection = layer.projection
    def flat(bias: Tensor | None) -> Tensor | None:
        return None if bias is None else bias.reshape(-1)

    parts = {
        "q": (projection.q_weight, flat(layer.b_Q)),
        "k": (projection.k_weight, flat(layer.b_K)),
        "v": (projection.v_weight, flat(layer.b_V)),
        "o": (projection.out_proj.weight, layer.b_O),
    }
    out: dict[str, Tensor | None] = {}
    for name, (weight, bias) in parts.items():
        out[name] = weight.detach().clone()
        if name in absent_biases:
            if bias is not None and bool(bias.detach().ne(0).any()):
                raise ValueError(
                    f"{where}: the Hugging Face module has no {name} bias, but the headlab layer's {name} bias "
                    f"is not zero (max |b| = {float(bias.detach().abs().max()):.3g}); it cannot be exported"
                )
            out[f"{name}_bias"] = None
        else:
            out[f"{name}_bias"] = None if bias is None else bias.detach().clone()
    return HFWeights(**out)


def check_exportable(layer: MultiHeadAttention, expected: AttentionConfig, *, where: str) -> None:
    """Raise ValueError unless the layer still has the shape and state the original module can hold."""
    if layer.config != expected:
        changed = {k: v for k, v in layer.config.to_dict().items() if expected.to_dict()[k] != v}
        raise ValueError(
            f"{where}: the headlab layer's config changed since the swap ({changed}); "
            "the Hugging Face module can only take the shape it was swapped from"
        )
    if layer.head_scale is not None or layer.head_shift is not None:
        raise ValueError(
            f"{where}: the layer carries per-head interventions (set_head_affine), which a Hugging Face "
            "module cannot hold; clear them with set_head_affine(None) before exporting"
        )


def find_modules(model: nn.Module, classes: Sequence[type]) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` for every submodule whose type is exactly one of ``classes``, in model order."""
    wanted = tuple(classes)
    return [(name, module) for name, module in model.named_modules() if type(module) in wanted]


def install(model: nn.Module, modules: Sequence[tuple[str, nn.Module]]) -> None:
    """Put each module at its dotted name (build them all first, so that a refusal changes nothing)."""
    for name, module in modules:
        model.set_submodule(name, module)


def swapped_of(model: nn.Module, kind: type[SwappedAttention]) -> list[tuple[str, SwappedAttention]]:
    """``(name, module)`` for the swapped modules of one family, in layer order."""
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, kind)]
    return sorted(found, key=lambda item: item[1].layer_index)


def check_attn_implementation(config: object) -> None:
    """Raise ValueError unless the model builds plain 4-D tensor masks (eager or sdpa)."""
    implementation = getattr(config, "_attn_implementation", None)
    if implementation is not None and implementation not in MASK_IMPLEMENTATIONS:
        raise ValueError(
            f"attn_implementation={implementation!r}: headlab layers take the 4-D masks that "
            f"{' and '.join(MASK_IMPLEMENTATIONS)} build; load the model with attn_implementation='sdpa' "
            "(or call model.set_attn_implementation('sdpa')) before swapping"
        )


def swap_modules(
    model: nn.Module,
    classes: Sequence[type[nn.Module]],
    seat: type[SwappedAttention],
    *,
    attention_config: Callable[[nn.Module], AttentionConfig],
    hf_weights: Callable[[nn.Module], HFWeights],
    layer_idx: Callable[[nn.Module], int | None],
) -> nn.Module:
    """Replace every module of ``classes`` in ``model`` by a ``seat`` around a headlab layer, in place.

    What the family adapters share: the attention-implementation check, refusing cross-attention
    blocks, the layer index (the module's own, else its position), exact weights, and the
    train/eval mode. A model already swapped is returned as it is.

    Args:
        model: a transformers model.
        classes: the family's attention module classes.
        seat: the family's ``SwappedAttention`` subclass, built as ``seat(layer, index, original=module)``.
        attention_config, hf_weights: the family's readers of one module's config and weights.
        layer_idx: the module's own layer index, or None.

    Returns:
        ``model``.

    Raises:
        ValueError: another attention implementation, a cross-attention block, or nothing to swap.
    """
    check_attn_implementation(getattr(model, "config", None))
    found = find_modules(model, classes)
    if not found:
        if swapped_of(model, seat):
            return model
        raise ValueError(f"no {', '.join(c.__name__ for c in classes)} module in {type(model).__name__}")
    for name, module in found:
        if getattr(module, "is_cross_attention", False):
            raise ValueError(
                f"{name} is a cross-attention block (config.add_cross_attention=True); headlab swaps "
                "self-attention only, so models with cross-attention are not supported"
            )
    built = []
    for position, (name, module) in enumerate(found):
        index = layer_idx(module)
        layer = build_layer(attention_config(module), hf_weights(module), training=module.training)
        built.append((name, seat(layer, position if index is None else int(index), original=module)
                      .train(module.training)))
    install(model, built)
    return model


def default_scale(scale: float, d_head: int) -> float | None:
    """None when ``scale`` is the default 1/sqrt(d_head) (keeps the config plain), else ``scale``."""
    return None if scale == d_head**-0.5 else float(scale)
