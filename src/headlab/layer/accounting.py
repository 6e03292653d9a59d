"""Parameter and FLOP accounting of the attention layer, read off the built module.

``account(config)`` builds ``MultiHeadAttention(config)`` on the meta device (shapes, no
memory, no arithmetic), counts its parameters by ``numel`` and runs one forward pass through
torch's FLOP counter (``torch.utils.flop_counter.FlopCounterMode``): no variant states its own
counts, so the numbers are those of the layer a user gets. ``sweep`` accounts named presets
(``headlab.layer.presets``) over several numbers of heads, for ``headlab params`` and the report.

Sizes as in ``headlab.layer.config``; L = S = ``seq_len`` (self-attention, batch 1). FLOPs are
2 per multiply-add (the counter's convention for matrix products); the forward is split into
the stages it runs, each counted on its own:
    "q, k, v projections"   the projection's forward; an element-wise product with a weight
                            there (collaborative's per-head mixing q̃ ⊙ m_h) counts 1 per product
    "scores"                q kᵀ for every head
    "talking-heads mixing"  the two (n_heads × n_heads) mixings, when enabled
    "weighted sum"          pattern @ v
    "output projection"     the merge of the heads through W_O
Softmax, masking, the score scale, rotary positions and bias additions are element-wise and
not counted (they are O(n_heads · L · S) or O(L · d), small next to the matrix products).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from headlab.layer.config import AttentionConfig
from headlab.layer.functional import attend, attention_pattern, expand_kv
from headlab.layer.masks import AttentionMask
from headlab.layer.module import MultiHeadAttention
from headlab.layer.presets import PRESETS, check_presets
from headlab.layer.projections import PROJECTIONS

__all__ = ["Accounting", "SkippedPair", "Sweep", "SweepRow", "account", "count_parameters", "sweep"]


@dataclass(frozen=True)
class Accounting:
    """Parameters and forward FLOPs of one layer config.

    Attributes:
        config: the layer's config.
        seq_len: self-attention positions L (= S) the FLOPs are counted for, batch 1.
        parameters: module parameter name → numel, exactly the names of
            ``MultiHeadAttention(config).named_parameters()`` (``projection.*``, ``core.*``,
            ``extra_kv.*``).
        flops: stage → forward FLOPs (see the module docstring; softmax not counted).
        qk_rank_bound: the largest rank any head's W_QK can have.
        total_parameters: sum of ``parameters``.
        parameters_per_head: ``total_parameters / n_heads``.
        total_flops: sum of ``flops``.
    """

    config: AttentionConfig
    seq_len: int
    parameters: dict[str, int]
    flops: dict[str, int]
    qk_rank_bound: int
    total_parameters: int = field(init=False)
    parameters_per_head: float = field(init=False)
    total_flops: int = field(init=False)

    def __post_init__(self) -> None:
        # Derived once here so that a total can never disagree with its parts.
        object.__setattr__(self, "total_parameters", sum(self.parameters.values()))
        object.__setattr__(self, "parameters_per_head", self.total_parameters / self.config.n_heads)
        object.__setattr__(self, "total_flops", sum(self.flops.values()))

    def to_dict(self) -> dict[str, Any]:
        """Returns: the fields as a JSON-ready dict (the config resolved)."""
        out = asdict(self)
        out["config"] = self.config.to_dict()
        return out


def account(config: AttentionConfig, *, seq_len: int = 128) -> Accounting:
    """Count the parameters and forward FLOPs of ``MultiHeadAttention(config)``.

    Args:
        config: the layer's config.
        seq_len: self-attention positions L (= S) for the FLOPs, batch 1.

    Returns:
        An ``Accounting``. The layer is built on the meta device: nothing is allocated.

    Raises:
        TypeError: ``config`` is not an AttentionConfig.
        ValueError: ``seq_len`` is not a positive int, the projection variant cannot use the
            config's sizes, or they are too large for torch to describe even without memory.
    """
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be a positive int")
    layer = _meta_layer(config, seq_len=seq_len)
    try:
        flops = _forward_flops(layer, seq_len)
    except RuntimeError as exc:  # on the meta device only sizes can fail: more bytes than torch can address
        raise _too_large(config, exc, seq_len=seq_len) from exc
    parameters = {name: p.numel() for name, p in layer.named_parameters()}
    return Accounting(config=config, seq_len=seq_len, parameters=parameters, flops=flops,
                      qk_rank_bound=type(layer.projection).qk_rank_bound(config))


def count_parameters(config: AttentionConfig) -> int:
    """The parameters of ``MultiHeadAttention(config)``, as ``account(config).total_parameters`` counts them,
    without counting FLOPs (whose counter imports torch's compiler stack: seconds, for a command that
    only needs the count).

    Raises:
        TypeError: ``config`` is not an AttentionConfig.
        ValueError: the sizes are too large for torch to describe.
    """
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
    return sum(p.numel() for p in _meta_layer(config).parameters())


def _meta_layer(config: AttentionConfig, *, seq_len: int | None = None) -> MultiHeadAttention:
    """``MultiHeadAttention(config)`` on the meta device: sizes only, nothing allocated."""
    try:
        with torch.device("meta"):
            return MultiHeadAttention(config)
    except RuntimeError as exc:
        raise _too_large(config, exc, seq_len=seq_len) from exc


def _too_large(config: AttentionConfig, exc: RuntimeError, *, seq_len: int | None) -> ValueError:
    sizes = f"d_model={config.d_model}, n_heads={config.n_heads}, d_head={config.d_head}" + (
        "" if seq_len is None else f", seq_len={seq_len}")
    return ValueError(f"{sizes}: the layer's tensors are too large for torch to describe "
                      f"({' '.join(str(exc).split())})")


def _products(*args: Any, out_shape: Sequence[int], **kwargs: Any) -> int:
    """FLOPs of an element-wise product: one per output element."""
    n = 1
    for size in out_shape:
        n *= size
    return n


def _counted(fn: Callable[[], Any], *, products: bool = False) -> tuple[int, Any]:
    """``(forward FLOPs of fn(), its result)``; with ``products``, element-wise products count too."""
    mapping = {torch.ops.aten.mul: _products} if products else None
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        out = fn()
    return counter.get_total_flops(), out


def _forward_flops(layer: MultiHeadAttention, seq_len: int) -> dict[str, int]:
    """The forward's FLOPs by stage, counted on a meta layer, one stage at a time as ``forward`` runs them."""
    c, L = layer.config, seq_len
    query = torch.empty(1, L, c.d_model, device="meta")
    cross = (c.kdim, c.vdim) != (c.d_model, c.d_model)
    key = torch.empty(1, L, c.kdim, device="meta") if cross else query
    value = torch.empty(1, L, c.vdim, device="meta") if cross else query

    projections, (q, k, v) = _counted(lambda: layer.projection(query, key, value), products=True)
    if layer.extra_kv is not None:
        k, v = layer.extra_kv(k, v)
    # Every pattern is asked for, so the core takes its explicit path, whose matrix products the
    # counter sees one by one (the fused kernel's would be one opaque call). No mask: masking is
    # element-wise, and the extra positions are allowed anyway.
    mask = AttentionMask(bias=None, is_causal=False, dead=None)
    options: dict[str, Any] = dict(scale=c.softmax_scale, pattern_heads=list(range(c.n_heads)), kv_index=layer.kv_index)
    scores, _ = _counted(lambda: attention_pattern(q, expand_kv(k, c.n_heads, layer.kv_index), None, None,
                                                   scale=c.softmax_scale))
    plain, (z, _) = _counted(lambda: attend(q, k, v, mask, **options))
    flops = {"q, k, v projections": projections, "scores": scores}
    if c.talking_heads:
        core, (z, _) = _counted(lambda: layer.core(q, k, v, mask, **options))
        flops["talking-heads mixing"] = core - plain
    flops["weighted sum"] = plain - scores
    flops["output projection"], _ = _counted(lambda: layer.projection.merge(z))
    return flops


# --- sweeps of presets over numbers of heads ----------------------------------------------------

@dataclass(frozen=True)
class SweepRow:
    """One (preset, n_heads) pair's accounting."""

    variant: str
    accounting: Accounting

    @property
    def qk_dim(self) -> int:
        """Width of each head's queries and keys in the scores (d_head; kdim for bilinear)."""
        return PROJECTIONS[self.accounting.config.projection].qk_dim(self.accounting.config)

    def to_dict(self) -> dict[str, Any]:
        """Returns: the row of ``headlab params --json`` (see docs/params.md)."""
        a, c = self.accounting, self.accounting.config
        return {
            "variant": self.variant, "n_heads": c.n_heads, "n_kv_heads": c.n_kv_heads, "d_head": c.d_head,
            "d_head_v": c.d_head_v, "qk_dim": self.qk_dim, "parameters": dict(a.parameters),
            "total_parameters": a.total_parameters, "parameters_per_head": a.parameters_per_head,
            "flops": dict(a.flops), "total_flops": a.total_flops, "qk_rank_bound": a.qk_rank_bound,
        }


@dataclass(frozen=True)
class SkippedPair:
    """A (preset, n_heads) pair the preset cannot build, and why."""

    variant: str
    n_heads: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """Returns: the fields as a JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class Sweep:
    """Accountings of several presets over several numbers of heads, at one d_model and seq_len.

    Attributes:
        rows: one per buildable pair, preset-major, heads ascending within a preset.
        skipped: the pairs a preset could not build, with the reason; never dropped silently.
    """

    d_model: int
    seq_len: int
    rows: list[SweepRow]
    skipped: list[SkippedPair]

    def by_variant(self) -> dict[str, list[Accounting]]:
        """Returns: preset → its accountings, heads ascending (presets with no row left out)."""
        out: dict[str, list[Accounting]] = {}
        for row in self.rows:
            out.setdefault(row.variant, []).append(row.accounting)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Returns: the document ``headlab params --json`` prints, without its explanations (docs/params.md)."""
        return {
            "d_model": self.d_model, "seq_len": self.seq_len,
            "rows": [r.to_dict() for r in self.rows], "skipped": [s.to_dict() for s in self.skipped],
        }


def sweep(
    *, d_model: int, n_heads: Sequence[int], variants: Sequence[str] | None = None, seq_len: int = 128
) -> Sweep:
    """Account every preset in ``variants`` at every number of heads in ``n_heads``.

    Args:
        d_model: model width.
        n_heads: numbers of heads, positive ints without repeats (sorted ascending in the result).
        variants: preset names (default: all of ``PRESETS``, in its order).
        seq_len: self-attention positions for the FLOPs.

    Returns:
        A ``Sweep``; pairs a preset cannot build land in ``skipped`` with the reason.

    Raises:
        ValueError: an unknown or repeated preset (``check_presets``), a repeated number of
            heads or one that is not a positive int, no heads, or a bad seq_len.
    """
    names = list(PRESETS) if variants is None else check_presets(variants)
    heads = _check_heads(n_heads)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be a positive int")
    rows, skipped = [], []
    for name in names:
        for h in sorted(heads):
            try:
                rows.append(SweepRow(name, account(PRESETS[name](d_model, h), seq_len=seq_len)))
            except ValueError as exc:  # the config's own check, or the variant's when the layer is built
                skipped.append(SkippedPair(name, h, str(exc)))
    return Sweep(d_model=d_model, seq_len=seq_len, rows=rows, skipped=skipped)


def _check_heads(n_heads: Sequence[int]) -> list[int]:
    """The numbers of heads of a sweep, checked.

    Raises:
        ValueError: none, one that is not a positive int, or one given twice (the values named).
    """
    heads = list(n_heads)
    if not heads:
        raise ValueError("n_heads is empty; give at least one number of heads")
    for h in heads:
        if isinstance(h, bool) or not isinstance(h, int) or h < 1:
            raise ValueError(f"n_heads has {h!r}; numbers of heads must be positive ints")
    repeated = sorted({h for h in heads if heads.count(h) > 1})
    if repeated:
        raise ValueError(f"n_heads lists {', '.join(map(str, repeated))} more than once")
    return heads
