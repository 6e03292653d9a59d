"""Sites of headlab's own layers: a ``MultiHeadAttention``, or any torch module built of them (the
experiments' ``TinyTransformer``, a user's stack), seen through the same ``AttentionSite`` as a
transformers model's attention modules.

The layer itself reads its site on every forward (``headlab.layer.taps``): it computes what the
site's tap takes for the tapped heads only, applies the site's per-call gates after its own, and
drops the windowed heads' keys. Its persistent per-head affine is the layer's own
(``MultiHeadAttention.set_head_affine``, buffers in its ``state_dict``): the site reads and writes
it there, so ``headlab.heads.mask`` and a saved ``state_dict`` agree.

Layers are the ``MultiHeadAttention`` modules in the order ``named_modules`` lists them (the order
they are registered; a ``TinyTransformer`` runs them in that order).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from headlab.layer import MultiHeadAttention
from headlab.models.site import AttentionSite


class LayerSite(AttentionSite):
    """The site of one headlab ``MultiHeadAttention``.

    Args:
        module: the layer.
        name: its dotted name in the model ("" for the layer itself).
        layer: its index among the model's layers.
    """

    def __init__(self, module: MultiHeadAttention, *, name: str, layer: int) -> None:
        c = module.config
        super().__init__(module, name=name, layer=layer, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads,
                         d_head=c.d_head, d_head_v=c.d_head_v, causal=c.causal, out_proj=None)
        self.kv_head_of = tuple(c.kv_head_of)
        self.layer_module = module

    @property
    def scale(self) -> Tensor | None:
        """``(n_heads,)``: the layer's persistent factor on each head's z (a copy), or None (1)."""
        scale = self.layer_module.head_scale
        return None if bool((scale == 1).all()) else scale.detach().clone()

    @scale.setter
    def scale(self, value: Tensor | None) -> None:
        self.set_affine(value, self.shift)

    @property
    def shift(self) -> Tensor | None:
        """``(n_heads, d_head_v)``: the layer's persistent addition to each head's z (a copy), or None (0)."""
        shift = self.layer_module.head_shift
        return None if not bool(shift.any()) else shift.detach().clone()

    @shift.setter
    def shift(self, value: Tensor | None) -> None:
        self.set_affine(self.scale, value)

    def _keep_affine(self, scale: Tensor | None, shift: Tensor | None) -> None:
        """Hold a checked affine in the layer's buffers (``MultiHeadAttention.set_head_affine``)."""
        self.layer_module.set_head_affine(scale, shift)

    @property
    def W_Q(self) -> Tensor:
        """``(n_heads, d_model, d_head)``: a view over the layer's weights."""
        return self.layer_module.W_Q

    @property
    def W_K(self) -> Tensor:
        """``(n_kv_heads, kdim, d_head)``."""
        return self.layer_module.W_K

    @property
    def W_V(self) -> Tensor:
        """``(n_kv_heads, vdim, d_head_v)``."""
        return self.layer_module.W_V

    @property
    def W_O(self) -> Tensor:
        """``(n_heads, d_head_v, d_model)``."""
        return self.layer_module.W_O

    def result(self, z: Tensor, heads: Sequence[int]) -> Tensor:
        """Each of ``heads``' contribution to the layer's output (its output bias in none).

        Returns:
            ``(batch, len(heads), query_pos, d_model)``.
        """
        return self.layer_module.projection.result(z, list(heads))


def native_layers(model: nn.Module) -> list[tuple[str, MultiHeadAttention]]:
    """``(name, layer)`` of every headlab ``MultiHeadAttention`` in ``model`` (itself included), in
    ``named_modules`` order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, MultiHeadAttention)]


def native_sites(model: nn.Module) -> list[LayerSite]:
    """A ``LayerSite`` for each of ``model``'s headlab layers (``native_layers``).

    Raises:
        ValueError: ``model`` holds no headlab layer, or one layer twice (shared weights).
    """
    layers = native_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} holds no headlab MultiHeadAttention; expected a transformers "
                         "model or a torch module built of headlab layers")
    return [LayerSite(module, name=name, layer=i) for i, (name, module) in enumerate(layers)]


def is_native(model: nn.Module) -> bool:
    """Whether ``model`` is headlab's own: not a transformers model, and holding a headlab layer."""
    if any(isinstance(m, MultiHeadAttention) for m in model.modules()):
        try:
            from transformers import PreTrainedModel
        except ImportError:  # without the models extra nothing is a transformers model
            return True
        return not isinstance(model, PreTrainedModel)
    return False
