"""The attention layer's configuration.

Notation for sizes used throughout ``headlab.layer``:
    d_model     width of the query input and of the output
    n_heads     number of query heads
    n_kv_heads  number of key/value heads (n_heads: standard; 1: multi-query; else grouped-query)
    d_head      query/key size of one head
    d_head_v    value size of one head
    kdim, vdim  widths of the key and value inputs (cross-attention; default d_model)

The config is pure data: it checks each field (type, range) and the relations between fields
that hold for every layer. It imports no projection: whether a projection variant can use the
sizes is that variant's own check, run when the layer is built
(``headlab.layer.projections.projection_for``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

# The default of a size that __post_init__ derives from the others: None to the constructor, then a number.
_DERIVED: Any = None


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """Everything that fixes the shape and behaviour of a ``MultiHeadAttention`` layer.

    Optional sizes left as ``None`` are resolved in ``__post_init__`` (``d_head`` to
    ``d_model // n_heads``, ``n_kv_heads`` to ``n_heads``, ...), so a built config always
    holds concrete numbers: the constructor takes ``None`` for them, the fields are typed as
    what they hold. Invalid values raise ``ValueError`` naming the field and value;
    a size the projection variant cannot use is refused when the layer is built.
    """

    d_model: int
    n_heads: int
    d_head: int = _DERIVED  # default d_model // n_heads; may be set independently
    n_kv_heads: int = _DERIVED  # default n_heads; must divide n_heads unless kv_head_of is given
    kv_head_of: tuple[int, ...] = _DERIVED  # key/value head each query head reads; default consecutive groups
    d_head_v: int = _DERIVED  # default d_head
    kdim: int = _DERIVED  # key input width, default d_model (as in nn.MultiheadAttention)
    vdim: int = _DERIVED  # value input width, default d_model
    projection: str = "wide"  # a name in headlab.layer.projections.PROJECTIONS (checked when the layer is built)
    bias: bool = True  # biases on the query/key/value and output projections
    dropout: float = 0.0  # dropout on attention weights, in training mode only
    causal: bool = False  # default for forward(is_causal=None)
    talking_heads: bool = False  # learned mixing across heads around the softmax (Shazeer et al. 2020)
    rotary: bool = False  # rotary position embedding on queries and keys (Su et al. 2021)
    rotary_dim: int = _DERIVED  # leading dims of each head that rotate; default d_head
    rotary_base: float = 10000.0  # rotary frequency base (theta)
    scale: float | None = None  # score scale; default 1 / sqrt(d_head)
    add_bias_kv: bool = False  # a learned key/value position after the keys (nn.MultiheadAttention's add_bias_kv)
    add_zero_attn: bool = False  # an all-zero key/value position after those (nn.MultiheadAttention's add_zero_attn)

    if TYPE_CHECKING:  # the constructor as the dataclass makes it, with None for the derived sizes
        def __init__(self, *, d_model: int, n_heads: int, d_head: int | None = None, n_kv_heads: int | None = None,
                     kv_head_of: tuple[int, ...] | None = None, d_head_v: int | None = None, kdim: int | None = None,
                     vdim: int | None = None, projection: str = "wide", bias: bool = True, dropout: float = 0.0,
                     causal: bool = False, talking_heads: bool = False, rotary: bool = False,
                     rotary_dim: int | None = None, rotary_base: float = 10000.0, scale: float | None = None,
                     add_bias_kv: bool = False, add_zero_attn: bool = False) -> None: ...

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads"):
            _check_positive_int(name, getattr(self, name))
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"n_heads={self.n_heads} does not divide d_model={self.d_model}; "
                    "set d_head explicitly or choose n_heads dividing d_model"
                )
            self._set("d_head", self.d_model // self.n_heads)
        self._set("n_kv_heads", self.n_heads if self.n_kv_heads is None else self.n_kv_heads)
        self._set("d_head_v", self.d_head if self.d_head_v is None else self.d_head_v)
        self._set("kdim", self.d_model if self.kdim is None else self.kdim)
        self._set("vdim", self.d_model if self.vdim is None else self.vdim)
        self._set("rotary_dim", self.d_head if self.rotary_dim is None else self.rotary_dim)
        for name in ("d_head", "n_kv_heads", "d_head_v", "kdim", "vdim", "rotary_dim"):
            _check_positive_int(name, getattr(self, name))
        self._resolve_kv_head_of()
        if not isinstance(self.projection, str) or not self.projection:
            raise ValueError(f"projection={self.projection!r} must be the name of a projection variant")
        for name in ("bias", "causal", "talking_heads", "rotary", "add_bias_kv", "add_zero_attn"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        if isinstance(self.dropout, bool) or not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ValueError(f"dropout={self.dropout!r} must be a number in [0, 1)")
        if self.rotary:
            if self.rotary_dim > self.d_head or self.rotary_dim % 2:
                raise ValueError(
                    f"rotary_dim={self.rotary_dim} must be even and at most d_head={self.d_head}"
                )
            if isinstance(self.rotary_base, bool) or not (
                isinstance(self.rotary_base, (int, float)) and 1.0 < self.rotary_base < math.inf
            ):
                raise ValueError(f"rotary_base={self.rotary_base!r} must be a finite number > 1")
        if self.scale is not None and (
            isinstance(self.scale, bool)
            or not isinstance(self.scale, (int, float))
            or not (math.isfinite(self.scale) and self.scale > 0)
        ):
            raise ValueError(f"scale={self.scale!r} must be a finite number > 0 or None")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # frozen: resolve defaults once, here

    def _resolve_kv_head_of(self) -> None:
        if self.kv_head_of is None:
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
            group = self.n_heads // self.n_kv_heads
            self._set("kv_head_of", tuple(h // group for h in range(self.n_heads)))
            return
        try:
            mapping = tuple(self.kv_head_of)
        except TypeError:
            mapping = None
        if (
            mapping is None
            or len(mapping) != self.n_heads
            or any(isinstance(j, bool) or not isinstance(j, int) or not 0 <= j < self.n_kv_heads for j in mapping)
            or set(mapping) != set(range(self.n_kv_heads))
        ):
            raise ValueError(
                f"kv_head_of={self.kv_head_of!r} must give, for each of the n_heads={self.n_heads} query heads, "
                f"a key/value head in [0, {self.n_kv_heads}), using every key/value head"
            )
        self._set("kv_head_of", mapping)

    @property
    def uniform_groups(self) -> bool:
        """Query heads read key/value heads in equal consecutive groups (the layout kernels expand for free)."""
        group = self.n_heads // self.n_kv_heads
        return self.kv_head_of == tuple(h // group for h in range(self.n_heads))

    @property
    def softmax_scale(self) -> float:
        """The factor multiplying q·k: ``scale`` if set, else 1 / sqrt(d_head)."""
        return self.scale if self.scale is not None else self.d_head**-0.5

    def to_dict(self) -> dict[str, Any]:
        """The resolved fields as a JSON-ready dict."""
        return asdict(self)


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int")
