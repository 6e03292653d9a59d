"""Value-weighted (norm-based) attention per head (Kobayashi et al. 2020, "Attention is not only a weight").

Axis legend:
    pattern    (batch, head, query_pos, key_pos)   α, one captured layer's selected heads
    v          (batch, head, key_pos, d_head_v)    the value each head reads (``CaptureBatch``)
    W_O        (n_heads, d_head_v, d_model)        each head's slice of the output projection
    norms      (batch, head, key_pos)              ‖f_h(x_j)‖ = ‖v_j W_O[h]‖
    rows       (batch, head, query_pos)            one number per attention row
    result     HeadTable                           a row per captured (layer, head)

A head's output at query i is Σ_j α_ij f_h(x_j), with f_h(x_j) = v_j W_O[h] the value vector of token j
carried through the head's slice of the output projection. A large α_ij on a token whose f_h(x_j) is
short moves the output little. Kobayashi et al. read ‖α_ij f_h(x_j)‖ instead of α_ij; here each row of
those norms is renormalised to a distribution, α_ij ‖f_h(x_j)‖ / Σ_k α_ik ‖f_h(x_k)‖, so that the share
of *value-weighted* attention on a set of keys sits beside the share of raw attention on them.

``ValueWeighted`` accumulates, per head, both shares on the sink tokens — the first position ([CLS],
BOS, or whatever token comes first) and the other special tokens ([SEP], EOS) — and the mean norm
‖f_h(x_j)‖ of those keys and of the other keys, which says why the two shares differ. Gates set on a
site (``headlab.heads``) act on z, after the values: the norms are those of the unmodified model.

Its state is a ``headlab.analysis.per_head.HeadSums``: float64 sums and counts per head, merged by
adding, so two halves of a corpus merge into the whole.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from headlab.analysis.per_head import HeadSums
from headlab.capture.batch import CaptureBatch, LayerCapture
from headlab.heads import HeadTable

__all__ = [
    "COLUMNS", "ValueWeighted", "compact_projections", "gram_matrices", "key_masks", "layer_norms", "out_projections",
    "plot_value_weighted", "value_norms",
    "value_weighted", "weighted_pattern",
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


def out_projections(model: Any) -> dict[int, Tensor]:
    """``{layer: W_O (n_heads, d_head_v, d_model)}`` of every attention site, detached float64 copies on the CPU.

    Raises:
        ValueError: a site has no output projection taking the heads' z (``AttentionSite.W_O``).
    """
    from headlab.models import attention_sites

    return {site.layer: site.W_O.detach().to(device="cpu", dtype=torch.float64).clone()
            for site in attention_sites(model)}


def compact_projections(W_O: Mapping[int, Tensor]) -> dict[int, Tensor]:  # noqa: N803
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


def gram_matrices(W_O: Mapping[int, Tensor]) -> dict[int, Tensor]:  # noqa: N803
    """``{layer: W_O[h] W_O[h]ᵀ (n_heads, d_head_v, d_head_v)}`` in float64 on the CPU: what ``layer_norms`` reads.

    Raises:
        ValueError: a W_O that is not 3-D.
    """
    grams = {}
    for layer, w in W_O.items():
        if w.dim() != 3:
            raise ValueError(f"W_O of layer {layer} has shape {tuple(w.shape)}; expected (n_heads, d_head_v, d_model)")
        w = w.detach().double().cpu()
        grams[int(layer)] = w @ w.transpose(1, 2)
    return grams


def layer_norms(grams: Mapping[int, Tensor], layer: int, taken: LayerCapture, *,
                fix: str = "capture with what=('pattern', 'v')") -> Tensor:
    """``(batch, head, key_pos)`` float64: ``‖f_h(x_j)‖`` of one captured layer's heads (``gram_matrices``).

    Raises:
        ValueError: the layer was captured without v (the message ends with ``fix``), has no W_O
            here, or holds a head beyond it.
    """
    if taken.v is None:
        raise ValueError(f"layer {layer} was captured without v; {fix}")
    if layer not in grams:
        raise ValueError(f"layer {layer} has no W_O here; expected one of the layers {sorted(grams)}")
    gram = grams[layer]
    index = torch.tensor(taken.heads)
    if int(index.max()) >= len(gram):
        raise ValueError(f"layer {layer}: head {int(index.max())} is beyond W_O's {len(gram)} heads")
    return value_norms(taken.v, gram.index_select(0, index))


def value_norms(v: Tensor, gram: Tensor) -> Tensor:
    """``‖v_j W_O[h]‖`` from the Gram matrices ``W_O[h] W_O[h]ᵀ``, without forming ``v W_O``.

    Args:
        v: ``(batch, head, key_pos, d_head_v)``.
        gram: ``(head, d_head_v, d_head_v)``, the same heads in the same order.

    Returns:
        ``(batch, head, key_pos)`` float64.
    """
    v = v.double()
    squared = torch.einsum("bhkd,hde,bhke->bhk", v, gram.to(device=v.device, dtype=torch.float64), v)
    return squared.clamp_min(0.0).sqrt()


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


def _sink_columns(first: Tensor, special: Tensor, norms: Tensor, dtype: torch.dtype) -> Tensor:
    """``(batch, head, key_pos, 5)``: first, special, n·first, n·special, n — one matmul gives every share."""
    b, h = norms.shape[:2]
    masks = torch.stack([first, special], -1)[:, None].expand(b, h, -1, 2).to(norms.dtype)
    return torch.cat([masks, masks * norms[..., None], norms[..., None]], -1).to(dtype)


class ValueWeighted(HeadSums):
    """Raw vs value-weighted attention on the sink tokens, per head (``COLUMNS``); needs patterns and v.

    Args:
        W_O: ``{layer: (n_heads, d_head_v, d_model)}``, every layer that will be captured
            (``out_projections(model)``, or ``ValueWeighted.from_model``).

    Raises:
        ValueError: a W_O that is not 3-D.
    """

    def __init__(self, W_O: Mapping[int, Tensor]) -> None:  # noqa: N803
        super().__init__()
        self.grams = gram_matrices(W_O)

    @classmethod
    def from_model(cls, model: Any) -> ValueWeighted:
        """An accumulator for every layer of ``model`` (a ``LoadedModel`` or an attached model)."""
        return cls(out_projections(model))

    def update(self, batch: CaptureBatch) -> None:
        """Add one batch (its layers must carry pattern and v)."""
        first, special, other = key_masks(batch)
        real = batch.attention_mask.bool()
        for layer, taken in batch.layers.items():
            if taken.pattern is None:
                raise ValueError(f"layer {layer} was captured without patterns; capture with what=('pattern', 'v')")
            norms = torch.where(real[:, None, :], layer_norms(self.grams, layer, taken), 0.0)  # padding: 0
            p = taken.pattern
            # one matmul: each row's raw and weighted mass on first / special and its weighted total
            masses = torch.matmul(p, _sink_columns(first, special, norms, p.dtype)).double()  # (b, h, q, 5)
            total = masses[..., 4]
            defined = real[:, None, :] & (total > 0)  # (batch, head, query)
            weighted = masses[..., 2:4] / total.clamp_min(torch.finfo(torch.float64).tiny)[..., None]
            stats = {"raw_first": masses[..., 0], "raw_special": masses[..., 1],
                     "weighted_first": weighted[..., 0], "weighted_special": weighted[..., 1]}
            sums = {name: torch.where(defined if name.startswith("weighted") else real[:, None, :], s, 0.0).sum((0, 2))
                    for name, s in stats.items()}
            n_heads = len(taken.heads)
            counts = {"queries": real.sum().double().expand(n_heads), "weighted": defined.double().sum((0, 2))}
            for name, keys in (("first", first), ("special", special), ("other", other)):
                sums[f"norm_{name}"] = torch.where(keys[:, None, :], norms, 0.0).sum((0, 2))
                counts[f"keys_{name}"] = keys.sum().double().expand(n_heads)
            self._add(layer, taken.heads, sums, counts)

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


def value_weighted(model: Any, corpus: Any = None, **capture_options: Any) -> HeadTable:
    """Run a capture with a ``ValueWeighted`` and return its result.

    Args:
        model: a ``LoadedModel``.
        corpus: as ``capture`` takes it; None for the bundled corpus.
        capture_options: passed to ``capture`` (heads, batch_tokens, progress, ...).
    """
    from headlab.capture import capture

    accumulator = ValueWeighted.from_model(model)
    capture(model, corpus=corpus, what=("pattern", "v"), consumers=[accumulator], **capture_options)
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
