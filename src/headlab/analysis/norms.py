"""Value-weighted (norm-based) attention per head (Kobayashi et al. 2020, "Attention is not only a weight").

Axis legend:
    pattern    (batch, head, query_pos, key_pos)   α, one captured layer's selected heads
    v          (batch, head, key_pos, d_head_v)    the value each head reads (``CaptureBatch``)
    W_O        (n_heads, d_head_v, d_model)        each head's slice of the output projection
    norms      (batch, head, key_pos)              ‖f_h(x_j)‖ = ‖v_j W_O[h]‖
    rows       (batch, head, query_pos)            one number per attention row
    result     HeadTable                           a row per captured (layer, head)

``ValueReductions`` reads a stack of layers (``headlab.analysis.reductions.BatchReductions.stacks``): its
norms, rows and masses have a layer axis in front.

A head's output at query i is Σ_j α_ij f_h(x_j), with f_h(x_j) = v_j W_O[h] the value vector of token j
carried through the head's slice of the output projection. A large α_ij on a token whose f_h(x_j) is
short moves the output little. Kobayashi et al. read ‖α_ij f_h(x_j)‖ instead of α_ij; here each row of
those norms is renormalised to a distribution, α_ij ‖f_h(x_j)‖ / Σ_k α_ik ‖f_h(x_k)‖, so that the share
of *value-weighted* attention on a set of keys sits beside the share of raw attention on them.

``ValueWeighted`` accumulates, per head, both shares on the sink tokens — the first position ([CLS],
BOS, or whatever token comes first) and the other special tokens ([SEP], EOS) — and the mean norm
‖f_h(x_j)‖ of those keys and of the other keys, which says why the two shares differ. Gates set on a
site (``headlab.heads``) act on z, after the values: the norms are those of the unmodified model.

The norms are computed in float32 from a d_head_v-wide factor of each W_O (``ValueProjections``), and
with one product of the patterns they are shared by every accumulator built from the same W_O
(``ValueReductions``, kept on the batch with ``CaptureBatch.shared``): ``ValueWeighted`` and
``headlab.analysis.sinks.SinkShare`` read each batch's values once between them.

Its state is a ``headlab.analysis.per_head.HeadSums``: float64 sums and counts per head, merged by
adding, so two halves of a corpus merge into the whole.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from headlab.analysis.per_head import HeadSums
from headlab.analysis.reductions import StackReductions, reductions
from headlab.capture.batch import CaptureBatch, LayerCapture
from headlab.heads import HeadTable
from headlab.models import HeadedModel

__all__ = [
    "COLUMNS", "ValueProjections", "ValueReductions", "ValueWeighted", "compact_projections", "key_masks",
    "out_projections", "plot_value_weighted", "value_norms", "value_reductions", "value_weighted", "weighted_pattern",
]

# Columns of ValueWeighted.result(), after n_queries: mean over real queries of each row's share.
COLUMNS = {
    "raw_first": "α on the first position",
    "weighted_first": "value-weighted attention on the first position",
    "raw_special": "α on the other special tokens",
    "weighted_special": "value-weighted attention on the other special tokens",
    "raw_sink": "α on the first position and the special tokens",
    "weighted_sink": "value-weighted attention on the first position and the special tokens",
    "norm_first": "mean ‖f_h(x_j)‖ of the first position",
    "norm_special": "mean ‖f_h(x_j)‖ of the other special tokens",
    "norm_other": "mean ‖f_h(x_j)‖ of every other real token",
}


def out_projections(model: HeadedModel | nn.Module) -> dict[int, Tensor]:
    """``{layer: W_O (n_heads, d_head_v, d_model)}`` of every attention site, detached float64 copies on the CPU.

    Raises:
        ValueError: a site has no output projection taking the heads' z (``AttentionSite.W_O``).
    """
    from headlab.models import headed

    return {site.layer: site.W_O.detach().to(device="cpu", dtype=torch.float64).clone()
            for site in headed(model).sites}


def compact_projections(W_O: Mapping[int, Tensor]) -> dict[int, Tensor]:
    """A ``(n_heads, d_head_v, d_head_v)`` stand-in for each layer's W_O that gives every norm W_O gives.

    From the QR factorisation ``W_O[h]ᵀ = Q R`` (Q with orthonormal columns), ``W_O[h] = Rᵀ Qᵀ``, so
    ``‖v W_O[h]‖ = ‖v Rᵀ‖`` for every v and the Gram matrices agree (float64 rounding aside). The
    stand-in is d_model / d_head_v times smaller than W_O: what the Ray engine ships to its workers.
    A W_O no wider than its heads is returned as it is.
    """
    out = {}
    for layer, w in W_O.items():
        w = w.detach().to(device="cpu", dtype=torch.float64)
        out[int(layer)] = w if w.shape[-1] <= w.shape[-2] else torch.linalg.qr(w.mT, mode="r")[1].mT
    return out


class ValueProjections:
    """Each layer's W_O reduced to what the value norms read, and a fingerprint of it.

    ``factors[layer]`` is ``compact_projections(W_O)[layer]`` in float32: ``‖v F[h]‖ = ‖v W_O[h]‖`` for every
    v, d_head_v wide. ``key`` names the factors by content: the accumulators built from equal W_O ask a
    batch for its ``ValueReductions`` under the same key and share them.

    Args:
        W_O: ``{layer: (n_heads, d_head_v, d_model)}`` (``out_projections``, or its ``compact_projections``).

    Raises:
        ValueError: a W_O that is not 3-D.
    """

    def __init__(self, W_O: Mapping[int, Tensor]) -> None:
        for layer, w in W_O.items():
            if w.dim() != 3:
                raise ValueError(f"W_O of layer {layer} has shape {tuple(w.shape)}; "
                                 "expected (n_heads, d_head_v, d_model)")
        compact = compact_projections(W_O)
        digest = hashlib.blake2b(digest_size=16)
        for layer in sorted(compact):
            digest.update(f"{layer}:{tuple(compact[layer].shape)}".encode())
            digest.update(compact[layer].contiguous().numpy().tobytes())
        self.factors = {layer: f.float() for layer, f in compact.items()}
        self.key = ("value reductions", digest.hexdigest())
        # the factors of a stack of layers on a device, by (layers, heads, device)
        self._placed: dict[tuple[tuple[int, ...], tuple[int, ...], torch.device], Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the copies placed on a device."""
        return self.__dict__ | {"_placed": {}}

    @classmethod
    def of(cls, W_O: Mapping[int, Tensor] | ValueProjections) -> ValueProjections:
        """``W_O`` itself when it is already a ``ValueProjections``, else its ``ValueProjections``."""
        return W_O if isinstance(W_O, ValueProjections) else cls(W_O)

    def norms(self, taken: Sequence[LayerCapture], *, fix: str) -> Tensor:
        """``(layer, batch, head, key_pos)`` float32: ``‖f_h(x_j)‖`` of a stack of captured layers, the same heads
        in each (one product for the whole stack).

        Raises:
            ValueError: a layer was captured without v (the message ends with ``fix``), has no W_O here, or
                holds a head beyond it.
        """
        values: list[Tensor] = []
        for layer in taken:
            if layer.v is None:
                raise ValueError(f"layer {layer.layer} was captured without v; {fix}")
            if layer.layer not in self.factors:
                raise ValueError(f"layer {layer.layer} has no W_O here; expected one of the layers "
                                 f"{sorted(self.factors)}")
            values.append(layer.v)
        heads, device = tuple(taken[0].heads), values[0].device
        key = (tuple(layer.layer for layer in taken), heads, device)
        if key not in self._placed:  # once per stack, heads and device: not a copy to the GPU per batch
            index = torch.tensor(heads)
            parts = []
            for layer in taken:
                factor = self.factors[layer.layer]
                if int(index.max()) >= len(factor):
                    raise ValueError(f"layer {layer.layer}: head {int(index.max())} is beyond W_O's "
                                     f"{len(factor)} heads")
                parts.append(factor.index_select(0, index))
            self._placed[key] = torch.cat(parts).to(device)  # (layer · head, d_head_v, width)
        factors = self._placed[key]
        batch, n_heads, n_keys, d_head = values[0].shape
        dtype = torch.promote_types(torch.promote_types(values[0].dtype, factors.dtype), torch.float32)
        # every head's (batch · key_pos, d_head_v) values, heads of every layer in a row: one copy
        per_head = torch.stack([v.transpose(0, 1) for v in values]).to(dtype)  # (l, h, b, k, d)
        norms = _product_norms(per_head.view(len(taken) * n_heads, batch * n_keys, d_head), factors.to(dtype))
        return norms.view(len(taken), n_heads, batch, n_keys).transpose(1, 2)


def value_norms(v: Tensor, W_O: Tensor) -> Tensor:
    """``‖v_j W_O[h]‖``, in the wider of v's and W_O's dtypes (at least float32).

    Args:
        v: ``(batch, head, key_pos, d_head_v)``.
        W_O: ``(head, d_head_v, width)``, the same heads in the same order: W_O itself or its
            ``compact_projections`` (the same norms, d_head_v wide).

    Returns:
        ``(batch, head, key_pos)``.
    """
    dtype = torch.promote_types(torch.promote_types(v.dtype, W_O.dtype), torch.float32)
    batch, heads, n_keys, d_head = v.shape
    per_head = v.to(dtype).transpose(0, 1).reshape(heads, batch * n_keys, d_head)
    return _product_norms(per_head, W_O.to(device=v.device, dtype=dtype)).view(heads, batch, n_keys).transpose(0, 1)


def _product_norms(per_head: Tensor, W_O: Tensor) -> Tensor:
    """``(head, row)``: ``‖x W_O[h]‖`` of each head's rows ``per_head`` ``(head, row, d_head_v)``, W_O ``(head,
    d_head_v, width)`` in the same dtype: one (row × d_head_v) product per head (a broadcast matmul would run a
    small one per item and head)."""
    return torch.linalg.vector_norm(torch.bmm(per_head, W_O), dim=-1)


def weighted_pattern(pattern: Tensor, norms: Tensor) -> Tensor:
    """Value-weighted attention, each row renormalised: ``α_ij n_j / Σ_k α_ik n_k`` (0 where the row's total is 0).

    Args:
        pattern: ``(batch, head, query_pos, key_pos)``.
        norms: ``(batch, head, key_pos)``.

    Returns:
        ``(batch, head, query_pos, key_pos)`` in the norms' dtype.
    """
    weighted = pattern.to(norms.dtype) * norms[:, :, None, :]
    total = weighted.sum(-1, keepdim=True)
    return torch.where(total > 0, weighted / total.clamp_min(torch.finfo(norms.dtype).tiny), 0.0)


def key_masks(batch: CaptureBatch) -> tuple[Tensor, Tensor, Tensor]:
    """``(first, special, other)``, each ``(batch, pos)`` bool: the first real position, the other real
    special tokens, and every other real token."""
    real = batch.attention_mask.bool()
    first = torch.zeros_like(real)
    first[:, 0] = real[:, 0]
    special = batch.special_tokens_mask.bool() & real & ~first
    return first, special, real & ~first & ~special


def value_reductions(batch: CaptureBatch, projections: ValueProjections) -> ValueReductions:
    """The batch's ``ValueReductions`` for these projections, made by the first accumulator that asks."""
    return batch.shared(projections.key, lambda b: ValueReductions(b, projections))


class ValueReductions:
    """What the value-reading accumulators (``ValueWeighted``, ``SinkShare``) take from one batch, per stack of
    layers (``headlab.analysis.reductions.BatchReductions.stacks``) computed once on first access: the value
    norms, and each row's masses on the first and special tokens, raw and weighted, with its weighted total
    (the one read of the patterns).

    Attributes:
        real: ``(batch, query_pos)`` bool, True at real query tokens.
        key_real: ``(batch, key_pos)`` bool, True at real keys: of ``batch.keys`` in a view of cross-attention
            layers (``CaptureBatch.views``), else ``real``.
        first, special, other: ``key_masks`` of the keys' side.
    """

    def __init__(self, batch: CaptureBatch, projections: ValueProjections) -> None:
        self.batch, self.projections = batch, projections
        keys = batch if batch.keys is None else batch.keys
        self.real = batch.attention_mask.bool()
        self.key_real = self.real if batch.keys is None else keys.attention_mask.bool()
        self.first, self.special, self.other = key_masks(keys)
        self._norms: dict[tuple[int, ...], Tensor] = {}

    def norms(self, rows: StackReductions, *, fix: str) -> Tensor:
        """``(layer, batch, head, key_pos)``: ``‖f_h(x_j)‖`` at real keys, 0 at padding
        (``ValueProjections.norms``)."""
        if rows.layers not in self._norms:
            taken = [self.batch.layers[layer] for layer in rows.layers]
            # as the stack reads its patterns: one product for the stack where they were copied into one tensor (a
            # GPU), else layer by layer (a CPU: there a layer's products stay in cache, the stack's would not)
            norms = torch.cat([self.projections.norms(taken[part], fix=fix) for part in rows.slices])
            self._norms[rows.layers] = norms.masked_fill(~self.key_real[:, None, :], 0.0)
        return self._norms[rows.layers]

    def total(self, rows: StackReductions, *, fix: str) -> Tensor:
        """``(layer, batch, head, query_pos)`` float64: each row's weighted total ``Σ_j α_ij n_j`` (``masses``'
        last column)."""
        return self.masses(rows, fix=fix)[..., 4]

    def masses(self, rows: StackReductions, *, fix: str) -> Tensor:
        """``(layer, batch, head, query_pos, 5)`` float64: each row's mass ``Σ_j α_ij c_j`` on the columns c = first,
        special, n·first, n·special, n (n the value norms): raw and weighted shares and the weighted total, in one
        read of the patterns (``StackReductions.masses_on``)."""
        return rows.masses_on(self.projections.key, lambda stack: self.columns(stack, fix=fix)).double()

    def columns(self, rows: StackReductions, *, fix: str) -> Tensor:
        """``(layer, batch, head, key_pos, 5)``: the key columns of ``masses``, in the patterns' dtype."""
        norms = self.norms(rows, fix=fix).to(rows.dtype)  # (l, b, h, k), 0 at padding
        first, special = (mask.to(rows.dtype)[:, None, :].expand_as(norms) for mask in (self.first, self.special))
        return torch.stack([first, special, first * norms, special * norms, norms], -1)

    def announce(self, *, fix: str) -> None:
        """Announce ``masses``' columns to the batch's reductions (``BatchReductions.announce``)."""
        reductions(self.batch).announce(self.projections.key, lambda stack: self.columns(stack, fix=fix))


class ValueWeighted(HeadSums):
    """Raw vs value-weighted attention on the sink tokens, per head (``COLUMNS``); needs patterns and v.

    Args:
        W_O: ``{layer: (n_heads, d_head_v, d_model)}``, every layer that will be captured
            (``out_projections(model)``, or ``ValueWeighted.from_model``), or their ``ValueProjections``.

    Raises:
        ValueError: a W_O that is not 3-D.
    """

    FIX = "capture with take=('pattern', 'v')"
    READS_ROW_BLOCKS = True  # row reductions only: masses on key columns (announced in prepare)

    def __init__(self, W_O: Mapping[int, Tensor] | ValueProjections) -> None:
        super().__init__()
        self.projections = ValueProjections.of(W_O)

    @classmethod
    def from_model(cls, model: HeadedModel | nn.Module) -> ValueWeighted:
        """An accumulator for every layer of ``model`` (a ``HeadedModel`` or an attached model)."""
        return cls(out_projections(model))

    def prepare(self, batch: CaptureBatch) -> None:
        """Before any consumer's update: announce the key columns ``update`` reads the masses on."""
        for view in batch.views():
            value_reductions(view, self.projections).announce(fix=self.FIX)

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch (its layers must carry pattern and v), view by view (``CaptureBatch.views``): each layer's
        queries and keys on their own sides."""
        for view in batch.views():
            self._update(view)

    def _update(self, batch: CaptureBatch) -> None:
        shared = value_reductions(batch, self.projections)
        real = shared.real[:, None, :, None]  # (batch, 1, query, 1)
        keys = torch.stack([shared.first, shared.special, shared.other], -1).double()  # (batch, key, 3)
        n_keys = keys.sum((0, 1))  # (3,): first, special, other
        n_queries = shared.real.sum().double()
        for rows in reductions(batch).stacks:
            masses = shared.masses(rows, fix=self.FIX)  # (l, b, h, q, 5)
            total = masses[..., 4:]
            defined = real & (total > 0)  # (layer, batch, head, query, 1)
            weighted = masses[..., 2:4] / total.clamp_min(torch.finfo(torch.float64).tiny)
            raw = torch.where(real, masses[..., :2], 0.0).sum((1, 3))  # (layer, head, 2): first, special
            shares = torch.where(defined, weighted, 0.0).sum((1, 3))
            norms = torch.einsum("lbhk,bkc->lhc", shared.norms(rows, fix=self.FIX).double(), keys)  # (layer, head, 3)
            n_weighted = defined.double().sum((1, 3, 4))  # (layer, head)
            n_heads = len(rows.heads)
            counts = {"queries": n_queries.expand(n_heads),
                      **{f"keys_{name}": n_keys[k].expand(n_heads)
                         for k, name in enumerate(("first", "special", "other"))}}
            for i, layer in enumerate(rows.layers):
                sums = {"raw_first": raw[i, :, 0], "raw_special": raw[i, :, 1], "weighted_first": shares[i, :, 0],
                        "weighted_special": shares[i, :, 1], "norm_first": norms[i, :, 0],
                        "norm_special": norms[i, :, 1], "norm_other": norms[i, :, 2]}
                self._add(layer, rows.heads, sums, counts | {"weighted": n_weighted[i]})

    def result(self) -> HeadTable:
        """A row per captured head: ``n_queries`` then ``COLUMNS`` (float64; NaN where a count stayed 0).

        Raises:
            ValueError: nothing was accumulated.
        """
        order = self._order()
        columns: dict[str, list[float]] = {name: [] for name in ("n_queries", *COLUMNS)}
        means = {}
        for layer in self.heads:
            means[layer] = {
                "n_queries": self.counts[layer]["queries"],
                "raw_first": self._mean(layer, "raw_first", "queries"),
                "raw_special": self._mean(layer, "raw_special", "queries"),
                "weighted_first": self._mean(layer, "weighted_first", "weighted"),
                "weighted_special": self._mean(layer, "weighted_special", "weighted"),
                **{f"norm_{k}": self._mean(layer, f"norm_{k}", f"keys_{k}") for k in ("first", "special", "other")},
            }
            means[layer]["raw_sink"] = means[layer]["raw_first"] + means[layer]["raw_special"]
            means[layer]["weighted_sink"] = means[layer]["weighted_first"] + means[layer]["weighted_special"]
        for layer, _, i in order:
            for name in columns:
                columns[name].append(float(means[layer][name][i]))
        return HeadTable([(layer, head) for layer, head, _ in order], columns)


def value_weighted(model: HeadedModel | nn.Module, corpus: Any = None, **capture_options: Any) -> HeadTable:
    """Run a capture with a ``ValueWeighted`` and return its result.

    Args:
        model: a ``HeadedModel``.
        corpus: as ``capture`` takes it; None for the bundled corpus.
        capture_options: passed to ``capture`` (heads, batch_tokens, progress, ...).
    """
    from headlab.capture import capture

    accumulator = ValueWeighted.from_model(model)
    capture(model, corpus=corpus, take=("pattern", "v"), consumers=[accumulator], **capture_options)
    return accumulator.result()


def plot_value_weighted(table: HeadTable, path: str | os.PathLike[str]) -> None:
    """Each head's raw share on the sink tokens against its value-weighted share (``ValueWeighted.result``),
    coloured by layer, with the diagonal where the two agree, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = [layer for layer, _ in table.heads]
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    ax.plot([0, 1], [0, 1], color="grey", linewidth=0.8, linestyle=":")
    points = ax.scatter(table["raw_sink"], table["weighted_sink"], c=layers, cmap="viridis", s=22, alpha=0.85)
    fig.colorbar(points, ax=ax, label="layer", fraction=0.046)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("raw attention on the first position and special tokens")
    ax.set_ylabel("value-weighted attention on them")
    ax.set_title("Each head: attention weight vs ‖α f(x)‖ on the sink tokens", fontsize="medium")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
