"""``MultiHeadAttention``: the layer, with heads as first-class objects.

Axis legend (TransformerLens names):
    activations   (batch, pos, d_model)
    pattern       (batch, head, query_pos, key_pos)
    z             (batch, head, query_pos, d_head_v)   a head's weighted sum of values
    result        (batch, head, query_pos, d_model)    a head's contribution to the output
    W_Q (n_heads, d_model, d_head)   W_K (n_kv_heads, kdim, d_head)
    W_V (n_kv_heads, vdim, d_head_v) W_O (n_heads, d_head_v, d_model)

The module only projects, positions, caches and merges; the math lives in
``headlab.layer.functional`` and the weights' layout in the projection variant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from headlab.layer.cache import KVCache
from headlab.layer.config import AttentionConfig
from headlab.layer.extra_kv import ExtraKeyValues
from headlab.layer.factored import FactoredMatrix
from headlab.layer.functional import attend, copy_heads
from headlab.layer.gates import apply_gates, check_affine, check_gate, identity_affine
from headlab.layer.masks import build_mask
from headlab.layer.pattern_rows import PatternRows
from headlab.layer.projections import projection_for
from headlab.layer.rotary import RotaryEmbedding
from headlab.layer.selection import indices
from headlab.layer.talking_heads import TalkingHeads
from headlab.layer.taps import SITE_ATTRIBUTE, HeadSite, Tap, TapOutput


@dataclass
class AttentionOutput:
    """What ``MultiHeadAttention.forward`` returns when a head's pattern, z or result is asked for.

    Attributes:
        output: ``(batch, query_pos, d_model)``.
        pattern: ``(batch, len(heads), query_pos, key_pos)`` for the heads asked for, in the
            order asked, or None. It is the attention distribution before dropout (rows sum to
            1, or 0 for a row that sees no key); in training torch's need_weights returns the
            weights after dropout instead (``headlab.interop.torch_mha``). With
            ``config.add_bias_kv`` / ``add_zero_attn`` key_pos ends with those positions.
        result: ``(batch, len(heads), query_pos, d_model)``: each asked head's
            contribution to the output; over all heads they sum, with ``b_O``, to ``output``.
        z: ``(batch, len(heads), query_pos, d_head_v)``: each asked head's weighted sum of
            values as the output projection receives it (after head_mask and interventions).
    """

    output: Tensor
    pattern: Tensor | None = None
    result: Tensor | None = None
    z: Tensor | None = None


class MultiHeadAttention(nn.Module):
    """Multi-head attention whose heads can be read, gated and inspected one by one.

    Args:
        config: the layer's sizes and options.

    Raises:
        TypeError: ``config`` is not an AttentionConfig.
        ValueError: its projection variant cannot use its sizes (the message names them).
    """

    # Buffers (registered in __init__): the key/value head of each query head where the groups are not
    # equal and consecutive, and the persistent per-head affine on z.
    kv_index: Tensor | None
    head_scale: Tensor
    head_shift: Tensor

    def __init__(self, config: AttentionConfig) -> None:
        super().__init__()
        if not isinstance(config, AttentionConfig):
            raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
        self.config = config
        variant = projection_for(config)  # the variant checks the sizes it needs
        self.projection = variant(config)
        self.rotary = RotaryEmbedding(config.rotary_dim, base=config.rotary_base) if config.rotary else None
        # The attention core: plain (fused kernel) attention, or heads that talk to each other.
        self.core = TalkingHeads(config) if config.talking_heads else attend
        # Key/value positions after every call's keys (nn.MultiheadAttention's add_bias_kv, add_zero_attn).
        self.extra_kv = ExtraKeyValues(
            kv_heads=variant.kv_heads(config), qk_dim=variant.qk_dim(config), d_head_v=config.d_head_v,
            learned=config.add_bias_kv, zero=config.add_zero_attn,
        ) if config.add_bias_kv or config.add_zero_attn else None
        # Key/value head of each query head, when the groups are not equal and consecutive.
        kv_index = None if config.uniform_groups else torch.tensor(config.kv_head_of)
        self.register_buffer("kv_index", kv_index, persistent=False)
        # Persistent interventions on heads (headlab.layer.gates): z_h ← head_scale[h]·z_h + head_shift[h].
        # Always in the state_dict (identity by default), so that any layer's state loads into a fresh one.
        self.register_buffer("head_scale", torch.ones(config.n_heads))
        self.register_buffer("head_shift", torch.zeros(config.n_heads, config.d_head_v))
        self._affine_set = False  # the affine is not the identity (worked out when it changes, not per call)
        self.register_load_state_dict_post_hook(lambda module, keys: module._note_affine())

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool | None = None,
        head_mask: Tensor | None = None,
        kv_cache: KVCache | None = None,
        rotary_cos_sin: tuple[Tensor, Tensor] | None = None,
        return_pattern: bool | Sequence[int] = False,
        return_result: bool | Sequence[int] = False,
        return_z: bool | Sequence[int] = False,
    ) -> Tensor | AttentionOutput:
        """Attend from ``query`` to ``key``/``value`` (both default to ``query``).

        Args:
            query: ``(batch, query_pos, d_model)``.
            key: ``(batch, key_pos, kdim)``; default ``query``.
            value: ``(batch, key_pos, vdim)``; default ``key``.
            key_padding_mask: ``(batch, key_pos)``, bool True = padding, or float additive.
                With a kv_cache, key_pos counts the cached positions too; it never counts
                the add_bias_kv / add_zero_attn positions, which are always allowed.
            attn_mask: ``(query_pos, key_pos)``, ``(batch·n_heads, query_pos, key_pos)`` or
                ``(batch | 1, n_heads | 1, query_pos, key_pos)``; bool True = not allowed, or
                float additive.
            is_causal: causal masking for this call; None uses ``config.causal``.
            head_mask: ``(n_heads,)`` or ``(batch, n_heads)`` gate multiplying each head's z
                before the output projection (0 removes a head; differentiable).
            kv_cache: cache for incremental self-attention decoding; updated in place. Anything
                with ``length`` and ``update(k, v) -> (keys, values)`` serves.
            rotary_cos_sin: precomputed rotary ``(cos, sin)``, each ``(batch | 1, query_pos,
                rotary_dim)`` in the half-split layout (Hugging Face's ``position_embeddings``),
                for the new positions; default: angles from the positions themselves.
            return_pattern: True for every head's pattern, or query-head indices.
            return_result: True for every head's contribution, or query-head indices.
            return_z: True for every head's z, or query-head indices.

        Returns:
            The output ``(batch, query_pos, d_model)``, or an ``AttentionOutput`` when patterns, z
            or head outputs are asked for.

        Raises:
            ValueError: an input, mask, head index or gate has the wrong shape or value.
            TypeError: an input or mask has the wrong type or dtype.
        """
        c = self.config
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value, kv_cache)
        pattern_heads = _heads_arg("return_pattern", return_pattern, c.n_heads)
        result_heads = _heads_arg("return_result", return_result, c.n_heads)
        z_heads = _heads_arg("return_z", return_z, c.n_heads)
        # headlab.attach's site (headlab.layer.taps): a tap, per-call gates and windowed heads. Read from
        # __dict__, as nn.Module's own attribute lookup costs more than the rest of a small call's Python.
        site: HeadSite | None = self.__dict__.get(SITE_ATTRIBUTE)
        if site is not None and site.idle:
            site = None
        tap = None if site is None else site.tap
        computed = pattern_heads  # the patterns to compute: those asked here, then those the tap takes
        if tap is not None and tap.pattern is not None:
            computed = list(dict.fromkeys([*(pattern_heads or []), *tap.pattern]))

        # Validate every argument before the cache is touched: a refused call changes nothing.
        offset = 0 if kv_cache is None else kv_cache.length
        batch, q_len, k_len = query.shape[0], query.shape[1], offset + key.shape[1]
        mask = build_mask(
            key_padding_mask=key_padding_mask, attn_mask=attn_mask,
            causal=c.causal if is_causal is None else _check_bool("is_causal", is_causal),
            batch=batch, n_heads=c.n_heads, q_len=q_len, k_len=k_len, dtype=query.dtype, device=query.device,
            extra_keys=0 if self.extra_kv is None else self.extra_kv.count,
            blocked=None if site is None else site.window_blocked(q_len, k_len, offset=k_len - q_len,
                                                                  device=query.device),
        )
        gate = None if head_mask is None else check_gate(head_mask, batch=batch, n_heads=c.n_heads)

        if rotary_cos_sin is not None and (self.rotary is None or key is not query):
            raise ValueError("rotary_cos_sin needs a rotary layer (config.rotary=True) in self-attention")

        q, k, v = self.projection(query, key, value)
        if self.rotary is not None:
            q = self.rotary(q, offset=offset, cos_sin=rotary_cos_sin)
            k = self.rotary(k, offset=offset, cos_sin=rotary_cos_sin)
        if site is not None:  # per-call replacements and deltas of some heads' inputs (headlab.circuits)
            q, k, v = site.gate_inputs(q, k, v)
        if kv_cache is not None:
            k, v = kv_cache.update(k, v)
        if self.extra_kv is not None:
            k, v = self.extra_kv(k, v)
        z, patterns = self.core(
            q, k, v, mask, scale=c.softmax_scale, dropout_p=c.dropout if self.training else 0.0,
            pattern_heads=computed, kv_index=self.kv_index,
        )  # z: (batch, n_heads, query_pos, d_head_v); patterns: (batch, len(computed), query_pos, key_pos)
        if self._affine_set or gate is not None:
            z = apply_gates(z, scale=self.head_scale if self._affine_set else None,
                            shift=self.head_shift if self._affine_set else None, gate=gate)
        if site is not None:
            z = site.gate(z)
            if tap is not None:
                self._tap(site, tap, q, k, v, z, patterns, computed)
                patterns = None if pattern_heads is None or patterns is None else patterns[:, : len(pattern_heads)]
        output = self.projection.merge(z)
        if pattern_heads is None and result_heads is None and z_heads is None:
            return output
        result = None
        if result_heads is not None:
            all_heads = result_heads == list(range(c.n_heads))
            result = self.projection.result(z, None if all_heads else result_heads)
        z_out = None if z_heads is None else copy_heads(z, z_heads)
        return AttentionOutput(output=output, pattern=patterns, result=result, z=z_out)

    def _tap(self, site: HeadSite, tap: Tap, q: Tensor, k: Tensor, v: Tensor, z: Tensor, patterns: Tensor | None,
             computed: list[int] | None) -> None:
        """Hand the tapped heads' tensors to the tap's sink (``headlab.layer.taps``): q after the rotary
        positions, k and v each query head reads (cached and extra positions included), z after the gates."""
        kv_of = self.config.kv_head_of
        out = TapOutput(
            z=None if tap.z is None else copy_heads(z, tap.z),
            result=None if tap.result is None else self.projection.result(z, tap.result),
            q=None if tap.q is None else copy_heads(q, tap.q),
            k=None if tap.k is None else copy_heads(k, [kv_of[h] for h in tap.k]),
            v=None if tap.v is None else copy_heads(v, [kv_of[h] for h in tap.v]),
        )
        if tap.pattern is not None:
            assert patterns is not None and computed is not None
            first = computed.index(tap.pattern[0])
            chosen = (patterns.narrow(1, first, len(tap.pattern))
                      if computed[first: first + len(tap.pattern)] == tap.pattern
                      else copy_heads(patterns, [computed.index(h) for h in tap.pattern]))
            if tap.blocks:  # this layer forms its patterns whole: the rows are sliced from them
                out.pattern_rows = PatternRows.of(chosen)
            else:
                out.pattern = chosen
        tap.sink(site.layer, out)

    def set_head_affine(self, scale: Tensor | None, shift: Tensor | None = None) -> None:
        """Persistently replace each head's z by ``scale[h]·z + shift[h]`` before the output projection.

        The values are buffers: they move with ``.to()`` and are saved in the state_dict (the
        identity when unset, so that a layer's state always loads into a fresh layer).

        Args:
            scale: ``(n_heads,)``, or None for 1.
            shift: ``(n_heads, d_head_v)``, or None for 0.

        Raises:
            ValueError: a tensor has the wrong shape.
            TypeError: a tensor is not floating point.
        """
        c = self.config
        check_affine(scale, shift, n_heads=c.n_heads, d_head_v=c.d_head_v)
        with torch.no_grad():
            if scale is None:
                self.head_scale.fill_(1.0)
            else:
                self.head_scale.copy_(scale.detach())
            if shift is None:
                self.head_shift.fill_(0.0)
            else:
                self.head_shift.copy_(shift.detach())
        self._note_affine()

    def _note_affine(self) -> None:
        self._affine_set = not identity_affine(self.head_scale, self.head_shift)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        """Load the per-head affine by what it means: an identity affine of another head count (a layer of 1 head
        saved, one of 8 loading: the same weights, torch's ``nn.MultiheadAttention`` loads across head counts too)
        loads as this layer's identity; a set one of another head count is refused (it names heads this layer has
        not). Everything else loads as torch loads it."""
        scale, shift = state_dict.get(prefix + "head_scale"), state_dict.get(prefix + "head_shift")
        if isinstance(scale, Tensor) and isinstance(shift, Tensor) and (
                scale.shape != self.head_scale.shape or shift.shape != self.head_shift.shape):
            if not identity_affine(scale, shift):
                raise ValueError(f"the state's head affine is set on {scale.shape[0]} heads of {shift.shape[-1]} "
                                 f"value features, and this layer has {self.config.n_heads} heads of "
                                 f"{self.config.d_head_v}: a gate names heads, so it loads only into a layer of the "
                                 "same heads (clear it first: set_head_affine(None))")
            state_dict[prefix + "head_scale"] = torch.ones_like(self.head_scale)
            state_dict[prefix + "head_shift"] = torch.zeros_like(self.head_shift)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def new_kv_cache(self, batch_size: int, max_len: int) -> KVCache:
        """An empty cache for decoding up to ``max_len`` positions, on the layer's device and dtype."""
        c, projection = self.config, type(self.projection)
        return KVCache(
            batch_size=batch_size, max_len=max_len, n_kv_heads=projection.kv_heads(c),
            d_head=projection.qk_dim(c), d_head_v=c.d_head_v, dtype=self.projection.dtype,
            device=self.projection.W_O.device,
        )

    # --- per-head views (zero-copy over the projection's parameters) ---
    @property
    def W_Q(self) -> Tensor:
        """``(n_heads, d_model, d_head)``."""
        return self.projection.W_Q

    @property
    def W_K(self) -> Tensor:
        """``(n_kv_heads, kdim, d_head)``; query head h uses key head ``config.kv_head_of[h]``."""
        return self.projection.W_K

    @property
    def W_V(self) -> Tensor:
        """``(n_kv_heads, vdim, d_head_v)``; query head h uses value head ``config.kv_head_of[h]``."""
        return self.projection.W_V

    @property
    def W_O(self) -> Tensor:
        """``(n_heads, d_head_v, d_model)``."""
        return self.projection.W_O

    @property
    def b_Q(self) -> Tensor | None:
        """``(n_heads, d_head)`` or None."""
        return self.projection.b_Q

    @property
    def b_K(self) -> Tensor | None:
        """``(n_kv_heads, d_head)`` or None."""
        return self.projection.b_K

    @property
    def b_V(self) -> Tensor | None:
        """``(n_kv_heads, d_head_v)`` or None."""
        return self.projection.b_V

    @property
    def b_O(self) -> Tensor | None:
        """``(d_model,)`` or None."""
        return self.projection.b_O

    @property
    def QK(self) -> FactoredMatrix:
        """Each query head's bilinear form W_Q W_Kᵀ, factored: ``(n_heads, d_model, kdim)``, rank ≤ d_head.

        Scores are ``x_q W_QK x_kᵀ`` (times the scale), before biases and rotary positions.
        """
        W_K = self.W_K.index_select(0, self._kv_of_heads())  # (n_heads, kdim, d_head)
        return FactoredMatrix(self.W_Q, W_K.transpose(1, 2))

    @property
    def OV(self) -> FactoredMatrix:
        """Each query head's value-output circuit W_V W_O, factored: ``(n_heads, vdim, d_model)``, rank ≤ d_head_v."""
        W_V = self.W_V.index_select(0, self._kv_of_heads())  # (n_heads, vdim, d_head_v)
        return FactoredMatrix(W_V, self.W_O)

    def _kv_of_heads(self) -> Tensor:
        return torch.tensor(self.config.kv_head_of, device=self.projection.out_proj.weight.device)

    def extra_repr(self) -> str:
        c = self.config
        parts = [f"d_model={c.d_model}", f"n_heads={c.n_heads}", f"d_head={c.d_head}"]
        if c.n_kv_heads != c.n_heads:
            parts.append(f"n_kv_heads={c.n_kv_heads}")
        parts += [f"projection={c.projection!r}", f"causal={c.causal}"]
        return ", ".join(parts)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, kv_cache: KVCache | None) -> None:
        c = self.config
        dtype = self.projection.dtype
        for name, x, width in (("query", query, c.d_model), ("key", key, c.kdim), ("value", value, c.vdim)):
            if not isinstance(x, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
            if x.dim() != 3 or x.shape[-1] != width:
                raise ValueError(f"{name} has shape {tuple(x.shape)}; expected (batch, pos, {width})")
            if x.dtype != dtype:
                raise TypeError(f"{name} has dtype {x.dtype}; the layer's weights are {dtype}")
        if key.shape[0] != query.shape[0] or value.shape[0] != query.shape[0]:
            raise ValueError(
                f"batch sizes differ: query {query.shape[0]}, key {key.shape[0]}, value {value.shape[0]}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key has {key.shape[1]} positions but value has {value.shape[1]}")
        if kv_cache is not None and not (key is query and value is query):
            raise ValueError("kv_cache is for self-attention decoding: pass key=None and value=None")


def _heads_arg(name: str, arg: bool | Sequence[int], n_heads: int) -> list[int] | None:
    """Normalise a return_pattern / return_result / return_z argument to head indices (in the order asked) or None."""
    if arg is True:
        return list(range(n_heads))
    if arg is False or arg is None:
        return None
    return indices(name, arg, n_heads)


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be a bool or None")
    return value
