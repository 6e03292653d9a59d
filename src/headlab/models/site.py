"""``AttentionSite``: one attention module of a transformers model, as headlab sees it.

``headlab.models.attach`` finds the model's attention modules by running it once and gives
each an ``AttentionSite`` (the attribute ``headlab_site``, a plain object: it is not in the
model's ``state_dict``). headlab's attention function reads the site on every call: its
``Tap`` says which heads' patterns, z and results to hand out, and its gates act on z before
the model's output projection; its windows (``headlab.heads.windowed``) restrict which keys
some heads see.

Axis legend:
    z        (batch, head, query_pos, d_head_v)   a head's weighted sum of values
    result   (batch, head, query_pos, d_model)    a head's contribution through the output projection
    W_Q      (n_heads, d_model, d_head)     W_K (n_kv_heads, d_model, d_head)
    W_V      (n_kv_heads, d_model, d_head_v) W_O (n_heads, d_head_v, d_model)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from headlab.layer import FactoredMatrix
from headlab.layer.functional import head_results
from headlab.layer.gates import INPUTS, Replacement, apply_gates, check_affine, check_gate, gate_input
from headlab.layer.masks import sink_window_blocked
from headlab.layer.taps import SITE_ATTRIBUTE, Tap

# On an attention module of a pruned model loading (headlab.models.loading), not attached yet: its heads as saved,
# ``(head_ids, kv_head_of)``, read by the probe's forward (a per-head bias of every original head, uneven key/value
# groups) and by attach, then held by the site.
SAVED_HEADS_ATTRIBUTE = "_headlab_saved_heads"

if TYPE_CHECKING:
    from headlab.models.layout import Layout

@dataclass(frozen=True)
class HeadWindow:
    """Query heads that see only the first ``sinks`` keys and a window of ``window`` keys around them
    (``headlab.layer.masks.sink_window_blocked``): streaming heads, simulated exactly.

    Attributes:
        heads: the query heads, sorted, unique.
        window: ``>= 1``: the recent keys kept (causal), or the largest distance kept (bidirectional).
        sinks: ``>= 0``: the first keys every query keeps.
    """

    heads: tuple[int, ...]
    window: int
    sinks: int


@dataclass(frozen=True)
class OutProjection:
    """The model's output projection of a site: the Linear (or GPT-2 Conv1D) that takes the heads' z.

    Attributes:
        module: the projection module.
        name: its dotted name in the model.
        transposed: True for a Conv1D, whose weight is ``(in_features, out_features)``.
    """

    module: nn.Module
    name: str
    transposed: bool

    @property
    def weight(self) -> Tensor:
        """``(d_model, n_heads · d_head_v)`` in Linear layout (a view for a Conv1D)."""
        weight = cast(Tensor, self.module.weight)  # a Linear's or a Conv1D's
        return weight.t() if self.transposed else weight


class AttentionSite:
    """One attention module of an attached model: its heads, gates, tap and projections.

    Args:
        module: the model's attention module (what it passes to the attention function).
        name: its dotted name in the model.
        layer: its index among the model's attention modules, in the order they run.
        n_heads, n_kv_heads, d_head, d_head_v: its geometry, read off its first call.
        causal: whether a query sees later keys (False) or not (True), read off its first call.
        out_proj: its output projection, or None when none takes the heads' z directly.
        cross: whether its keys and values come from another sequence than its queries (an encoder-decoder's
            cross-attention: patterns are target × source positions), read off its first call.
    """

    def __init__(self, module: nn.Module, *, name: str, layer: int, n_heads: int, n_kv_heads: int, d_head: int,
                 d_head_v: int, causal: bool, out_proj: OutProjection | None, cross: bool = False) -> None:
        self.module, self.name, self.layer = module, name, layer
        self.n_heads, self.n_kv_heads, self.d_head, self.d_head_v = n_heads, n_kv_heads, d_head, d_head_v
        self.causal, self.cross = causal, cross
        # Its place among the model's stacks (``name_stacks``): "" in a model of one stack; "encoder", "decoder",
        # "vision", "text" … in a model of several; and its block there (the index among the stack's sites of its kind).
        self.stack, self.block = "", layer
        self.out_proj = out_proj
        self.kv_head_of = tuple(h // (n_heads // n_kv_heads) for h in range(n_heads))
        self.head_ids: list[int] = list(range(n_heads))  # original index of each head (pruning removes some)
        self.layout: Layout | None = None  # the q/k/v projections, when their layout is recognised
        self.layout_problem: str | None = None  # why not, otherwise
        # The gates of headlab.layer.gates, None where unused. Persistent interventions
        # (headlab.heads): z_h ← scale[h]·z_h + shift[h].
        self._scale: Tensor | None = None
        self._shift: Tensor | None = None
        # Per call: a gate (n_heads,) or (batch, n_heads), differentiable (importance, Michel et al.
        # 2019); values replacing some heads' z (activation patching); an additive zero whose
        # gradient is ∂/∂z (attribution patching, Kramár et al. 2024).
        self.head_mask: Tensor | None = None
        self.replacement: Replacement | None = None
        self.delta: Tensor | None = None
        # Per call, on the heads' inputs q, k, v ({"q": ..., "k": ...}; k and v by key/value head):
        # replacements (path patching) and additive zeros whose gradients are ∂/∂q, ∂/∂k, ∂/∂v
        # (edge attribution; headlab.circuits).
        self.input_replacements: dict[str, Replacement] = {}
        self.input_deltas: dict[str, Tensor] = {}
        # Per call: heads whose pattern is restricted to sink and recent keys (a head in several
        # windows keeps the keys all of them keep).
        self.windows: tuple[HeadWindow, ...] = ()
        self.tap: Tap | None = None

    def __repr__(self) -> str:
        kv = f", n_kv_heads={self.n_kv_heads}" if self.n_kv_heads != self.n_heads else ""
        cross = ", cross=True" if self.cross else ""
        address = f", address={self.address!r}" if self.stack else ""
        return (f"AttentionSite(layer={self.layer}{address}, name={self.name!r}, n_heads={self.n_heads}{kv}, "
                f"d_head={self.d_head}, causal={self.causal}{cross})")

    @property
    def kind(self) -> str:
        """"cross" (keys and values from another sequence) or "self"."""
        return "cross" if self.cross else "self"

    @property
    def address(self) -> str:
        """Its name by stack and kind, TransformerLens' where it has one: ``"blocks.3.attn"`` in a model of one stack,
        ``"encoder.blocks.3.attn"``, ``"decoder.blocks.2.cross_attn"``, ``"vision.blocks.0.attn"`` in one of several."""
        prefix = f"{self.stack}." if self.stack else ""
        return f"{prefix}blocks.{self.block}.{'cross_attn' if self.cross else 'attn'}"

    @property
    def kv_head_of(self) -> tuple[int, ...]:
        """The key/value head each query head reads."""
        return self._kv_head_of

    @kv_head_of.setter
    def kv_head_of(self, value: tuple[int, ...]) -> None:
        n_heads, n_kv_heads = len(value), len(set(value))
        self._kv_head_of = tuple(value)
        # Read on every attention call, so worked out once here.
        self._uniform = n_heads % n_kv_heads == 0 and self._kv_head_of == tuple(
            h // (n_heads // n_kv_heads) for h in range(n_heads))

    @property
    def scale(self) -> Tensor | None:
        """``(n_heads,)``: the persistent per-head factor on z, or None (1)."""
        return self._scale

    @scale.setter
    def scale(self, value: Tensor | None) -> None:
        self._scale = value

    @property
    def shift(self) -> Tensor | None:
        """``(n_heads, d_head_v)``: the persistent per-head addition to z, or None (0)."""
        return self._shift

    @shift.setter
    def shift(self, value: Tensor | None) -> None:
        self._shift = value

    @property
    def uniform_groups(self) -> bool:
        """Whether query heads share key/value heads in equal consecutive groups (the model's own layout)."""
        return self._uniform

    @property
    def idle(self) -> bool:
        """Nothing to take, gate or regroup: the fused kernel serves the call as it is."""
        return (self.tap is None and self._scale is None and self._shift is None and self.head_mask is None
                and self.replacement is None and self.delta is None and not self.windows and self.uniform_groups
                and not self.input_replacements and not self.input_deltas)

    def gate_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v after the site's per-call input replacements and deltas (``headlab.layer.gates.gate_input``).

        Args:
            query: ``(batch, n_heads, query_pos, d_head)``; key, value ``(batch, n_kv_heads, key_pos, d)``.

        Returns:
            The three, each the given tensor itself where nothing is set on it.
        """
        if not self.input_replacements and not self.input_deltas:
            return query, key, value
        gated = [gate_input(x, replacement=self.input_replacements.get(role), delta=self.input_deltas.get(role),
                            what=role) for role, x in zip(INPUTS, (query, key, value))]
        return gated[0], gated[1], gated[2]

    def kv_index(self, device: torch.device) -> Tensor:
        """``(n_heads,)``: the key/value head of each query head."""
        return torch.tensor(self.kv_head_of, device=device)

    def window_blocked(self, q_len: int, k_len: int, *, offset: int, device: torch.device) -> Tensor | None:
        """Which keys the windowed heads (``headlab.heads.windowed``) drop.

        Args:
            q_len, k_len: the call's query and key positions.
            offset: the key position of query 0 (``k_len − q_len`` when queries are the last keys).
            device: where to build it.

        Returns:
            ``(n_heads, query_pos, key_pos)`` bool, True where a key is dropped; None without windows.
        """
        if not self.windows:
            return None
        blocked = torch.zeros(self.n_heads, q_len, k_len, dtype=torch.bool, device=device)
        for w in self.windows:
            blocked[list(w.heads)] |= sink_window_blocked(q_len, k_len, window=w.window, sinks=w.sinks,
                                                          causal=self.causal, offset=offset, device=device)
        return blocked

    def window_mask(self, mask: Tensor | None, query: Tensor, key: Tensor, *, end_aligned: bool) -> Tensor:
        """The call's additive mask with the windowed heads' dropped keys added: one mask per head.

        Args:
            mask: the additive mask the model's eager path adds (``interface.eager_mask``),
                ``(batch | 1, 1 | n_heads, query_pos, key_pos)``, or None.
            query: ``(batch, n_heads, query_pos, d_head)``; key ``(batch, n_kv_heads, key_pos, d_head)``.
            end_aligned: queries are the last keys (a model's mask was passed: no cache, or a
                dynamic one); False puts query 0 at key 0, as SDPA's ``is_causal`` does.

        Returns:
            ``(batch | 1, n_heads, query_pos, key_pos)`` in query's dtype: the dtype's most negative
            number where a key is dropped (never -inf: a padding row stays finite).
        """
        q_len, k_len = query.shape[2], key.shape[2]
        blocked = self.window_blocked(q_len, k_len, offset=k_len - q_len if end_aligned else 0, device=query.device)
        base = torch.zeros((), dtype=query.dtype, device=query.device) if mask is None else mask
        return base if blocked is None else torch.where(blocked[None], torch.finfo(query.dtype).min, base)

    def gate(self, z: Tensor) -> Tensor:
        """z ``(batch, n_heads, query_pos, d_head_v)`` after every gate set on the site (``headlab.layer.gates``)."""
        gate = None if self.head_mask is None else check_gate(self.head_mask, batch=z.shape[0], n_heads=self.n_heads)
        return apply_gates(z, scale=self._scale, shift=self._shift, gate=gate, replacement=self.replacement,
                           delta=self.delta)

    def set_affine(self, scale: Tensor | None, shift: Tensor | None) -> None:
        """Set the persistent interventions: z_h ← scale[h]·z_h + shift[h]; the identity (or None) unsets them.

        Raises:
            ValueError: a tensor has the wrong shape.
            TypeError: a tensor is not floating point.
        """
        try:
            check_affine(scale, shift, n_heads=self.n_heads, d_head_v=self.d_head_v)
        except ValueError as err:
            raise ValueError(f"layer {self.layer}: {err}") from None
        self._keep_affine(scale, shift)

    def _keep_affine(self, scale: Tensor | None, shift: Tensor | None) -> None:
        """Hold a checked affine: on the site (a layer of headlab's own holds it in its buffers instead)."""
        # An untouched site runs the fused kernel: identity parts are left unset.
        self._scale = None if scale is None or bool((scale == 1).all()) else scale.detach().clone()
        self._shift = None if shift is None or not bool(shift.any()) else shift.detach().clone()

    @property
    def W_O(self) -> Tensor:
        """``(n_heads, d_head_v, d_model)``: each head's slice of the output projection (a view).

        Raises:
            ValueError: no output projection takes the heads' z directly.
        """
        if self.out_proj is None:
            raise ValueError(
                f"layer {self.layer} ({self.name}): no Linear takes the heads' z directly after attention, so heads' "
                "results (their contributions through the output projection) are not defined here"
            )
        weight = self.out_proj.weight  # (d_model, n_heads · d_head_v)
        return weight.view(weight.shape[0], self.n_heads, self.d_head_v).permute(1, 2, 0)

    @property
    def W_Q(self) -> Tensor:
        """``(n_heads, d_model, d_head)``: each query head's rows of the query projection (a copy).

        The projection itself: the model's scaling, positions (rotary) and query norms come after it.

        Raises:
            ValueError: the q/k/v layout is not recognised.
        """
        return self._weights("q")

    @property
    def W_K(self) -> Tensor:
        """``(n_kv_heads, d_model, d_head)``; query head h reads key head ``kv_head_of[h]``."""
        return self._weights("k")

    @property
    def W_V(self) -> Tensor:
        """``(n_kv_heads, d_model, d_head_v)``; query head h reads value head ``kv_head_of[h]``."""
        return self._weights("v")

    @property
    def QK(self) -> FactoredMatrix:
        """Each query head's bilinear form W_Q W_Kᵀ, factored: ``(n_heads, d_model, d_model)``, rank ≤ d_head.

        Scores are ``x_q W_QK x_kᵀ`` (times the scaling) before biases, positions and norms.
        """
        W_K = self.W_K.index_select(0, self.kv_index(self.W_O.device))
        return FactoredMatrix(self.W_Q, W_K.transpose(1, 2))

    @property
    def OV(self) -> FactoredMatrix:
        """Each query head's value-output circuit W_V W_O, factored: ``(n_heads, d_model, d_model)``."""
        W_V = self.W_V.index_select(0, self.kv_index(self.W_O.device))
        return FactoredMatrix(W_V, self.W_O)

    def _weights(self, role: str) -> Tensor:
        if self.layout is None:
            raise ValueError(f"layer {self.layer} ({self.name}): per-head weights need the q/k/v layout, which was not "
                             f"recognised ({self.layout_problem})")
        return self.layout.weights(role)[0]

    def result(self, z: Tensor, heads: Sequence[int]) -> Tensor:
        """Each of ``heads``' contribution to the output projection's output (its bias in none).

        Args:
            z: ``(batch, n_heads, query_pos, d_head_v)``, after the gates.
            heads: query heads.

        Returns:
            ``(batch, len(heads), query_pos, d_model)``.
        """
        return head_results(z, self.W_O, heads)


class SharedSites:
    """The sites of one attention module that runs several times per forward, with the same weights (ALBERT's
    one attention module in every layer): one site per call, each its own layer.

    The attention function takes them in the order of the calls (``next``); the model's forward starts
    each forward at the first (``restart``, a forward pre-hook that ``attach`` sets). The count is kept
    per thread, as every call's state is.

    Args:
        sites: the sites, in the order of the module's calls.
    """

    def __init__(self, sites: Sequence[AttentionSite]) -> None:
        self.sites = tuple(sites)
        self._calls = threading.local()

    def __repr__(self) -> str:
        return f"SharedSites(layers={[site.layer for site in self.sites]})"

    def next(self) -> AttentionSite:
        """The site of this call of the module (after the last, the first again)."""
        count = getattr(self._calls, "count", 0)
        self._calls.count = count + 1
        return self.sites[count % len(self.sites)]

    def restart(self) -> None:
        """The next call is the first of a forward."""
        self._calls.count = 0


def sites_of(model: nn.Module) -> list[AttentionSite]:
    """The sites attached to ``model``'s modules (a shared module's every one), in layer order."""
    found: list[AttentionSite] = []
    for module in model.modules():
        attached = module.__dict__.get(SITE_ATTRIBUTE)
        if isinstance(attached, SharedSites):
            found.extend(attached.sites)
        elif isinstance(attached, AttentionSite):
            found.append(attached)
    return sorted(found, key=lambda site: site.layer)


def is_attached(site: AttentionSite) -> bool:
    """Whether ``site`` is still the one (or one of those) its module holds."""
    attached = site.module.__dict__.get(SITE_ATTRIBUTE)
    return attached is site or (isinstance(attached, SharedSites) and site in attached.sites)


_TOWER_SUFFIXES = ("_model", "_tower")  # "vision_model" → "vision", "audio_tower" → "audio"
_STACK_ALIASES = {"language": "text"}  # "language_model" (Gemma 3, LLaVA) is CLIP's "text_model"


def name_stacks(sites: Sequence[AttentionSite]) -> None:
    """Set each site's ``stack`` and ``block`` from the module names (see ``AttentionSite.address``).

    The stack is the first part of a site's module name after what every site's name begins with
    ("model.encoder.layers.0.self_attn" and "model.decoder.layers.0.self_attn": "encoder", "decoder";
    "text_model.…" or "language_model.…" and "vision_model.…": "text", "vision"), unless that part is a
    layer number (a model of one stack: ""). The block is the site's index among its stack's sites of its
    kind, in call order.

    Args:
        sites: every site of a model, in layer order.
    """
    parts = [site.name.split(".") for site in sites]
    shared = 0
    while all(len(p) > shared for p in parts) and len({p[shared] for p in parts}) == 1:
        shared += 1
    stacks = ["" if len(p) == shared or p[shared].isdigit() else p[shared] for p in parts]
    if len(set(stacks)) == 1 or "" in stacks:  # one stack, or parts that do not name stacks
        stacks = [""] * len(sites)
    counts: dict[tuple[str, bool], int] = {}
    for site, stack in zip(sites, stacks):
        for suffix in _TOWER_SUFFIXES:
            if stack.endswith(suffix) and len(stack) > len(suffix):
                stack = stack[: -len(suffix)]
        site.stack = _STACK_ALIASES.get(stack, stack)
        site.block = counts.get((stack, site.cross), 0)
        counts[(stack, site.cross)] = site.block + 1
