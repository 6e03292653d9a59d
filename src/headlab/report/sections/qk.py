"""Why separate W_Q and W_K instead of one W_QK, measured in the report's model (the default MiniLM is pretrained;
any checkpoint given is read the same way, random ones included): each head's W_QK = W_Q W_Kᵀ is a d_model × d_model
matrix of rank at most d_head, kept as its two factors.

For every head of the report's model the section reads the factored W_QK (``layer.QK``), its
rank and singular values (from the factors, never forming the matrix), checks one head against
the SVD of the materialised matrix, and counts what a full bilinear form per head would cost
against the factored pair. In a grouped-query model a key head serves a group of query heads, so
a query head's share of the key factor is the key head's parameters over the group's size.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from headlab.report.html import Html, escape, table
from headlab.report.section import ReportContext, Section

if TYPE_CHECKING:
    from torch import nn

    from headlab.models import HeadedModel

__all__ = ["ENERGY", "PLOT_NAME", "SECTION", "QKSpectra", "measure", "plot_spectra", "render_qk"]

ENERGY = 0.9  # share of ‖W_QK‖²_F that the "effective rank" keeps
PLOT_NAME = "assets/qk-spectra.svg"


@dataclass(frozen=True)
class QKSpectra:
    """Singular values of every head's W_QK.

    Attributes:
        d_model: rows and columns of each W_QK.
        d_head: the factors' inner width (the rank bound) of each layer.
        n_kv_heads: key heads of each layer (the number of query heads for standard attention; fewer
            with grouped-query attention, each key head shared by ``n_heads / n_kv_heads`` query heads).
        singular: per layer, ``(n_heads, d_head)`` singular values, largest first.
        ranks: per layer, ``(n_heads,)`` numerical ranks.
        dense_check: singular values of L0 H0's materialised W_QK, all d_model of them.
    """

    d_model: int
    d_head: list[int]
    n_kv_heads: list[int]
    singular: list[np.ndarray]
    ranks: list[np.ndarray]
    dense_check: np.ndarray

    def factored_cost(self, layer: int = 0) -> float:
        """Parameters of one query head's W_QK factors in ``layer``: its own d_model × d_head query
        factor and its share of the key factor, whose d_model × d_head parameters the key head's
        group of query heads shares."""
        n_heads = len(self.ranks[layer])
        per_factor = self.d_model * self.d_head[layer]
        return per_factor + per_factor * self.n_kv_heads[layer] / n_heads

    def effective_ranks(self, energy: float = ENERGY) -> list[np.ndarray]:
        """Per layer, ``(n_heads,)``: singular values needed to keep ``energy`` of ‖W_QK‖²_F."""
        out = []
        for s in self.singular:
            share = np.cumsum(s**2, axis=1) / np.sum(s**2, axis=1, keepdims=True)
            out.append((share < energy).sum(axis=1) + 1)
        return out


def measure(model: HeadedModel | nn.Module) -> QKSpectra:
    """Read every head's factored W_QK from a loaded model.

    Args:
        model: a ``HeadedModel`` (or an attached model).

    Returns:
        The spectra.
    """
    import torch

    from headlab.models import headed

    with torch.no_grad():
        sites = headed(model).sites
        qks = [site.QK for site in sites]
        dense = torch.linalg.svdvals(qks[0][0].AB.double()).numpy()
        return QKSpectra(d_model=int(qks[0].shape[-2]), d_head=[qk.inner_dim for qk in qks],
                         n_kv_heads=[site.n_kv_heads for site in sites], singular=[qk.S.double().numpy() for qk in qks],
                         ranks=[np.asarray(qk.rank) for qk in qks], dense_check=dense)


def plot_spectra(spectra: QKSpectra) -> bytes:
    """Each head's singular values over its largest, one line per head coloured by layer, as SVG bytes."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cmap = matplotlib.colormaps["viridis"]
    n = len(spectra.singular)
    for i, s in enumerate(spectra.singular):
        for j, row in enumerate(s):
            ax.plot(np.arange(1, len(row) + 1), row / row[0], color=cmap(i / max(n - 1, 1)), alpha=0.45, linewidth=0.9,
                    label=f"layer {i}" if j == 0 else None)
    dense = spectra.dense_check / spectra.dense_check[0]
    floor = max(float(dense[dense > 0].min()) / 5, 1e-30)
    ax.plot(np.arange(1, len(dense) + 1), np.maximum(dense, floor), color="black", linewidth=1.2, linestyle=":",
            label="L0 H0: every singular value of the formed matrix")
    ax.axvline(spectra.d_head[0], color="grey", linewidth=0.8)
    ax.annotate(f"d_head = {spectra.d_head[0]}", (spectra.d_head[0], 1e-2), xytext=(6, 0), textcoords="offset points",
                fontsize="small", color="grey")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(floor, 2)
    ax.set_xlabel("singular value index")
    ax.set_ylabel("σ_i / σ_1")
    ax.set_title(f"Singular values of each head's W_QK ({spectra.d_model} × {spectra.d_model})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize="x-small", ncols=2, loc="lower left")
    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "headlab"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def render_qk(spectra: QKSpectra, *, name: str, plot_href: str | None = None) -> Html:
    """The section's fragment: the rank bound, the cost of a full W_QK, effective ranks per layer.

    Args:
        spectra: what ``measure`` read.
        name: the model's short name.
        plot_href: link target of the spectra plot, if one was written.
    """
    d, d_head = spectra.d_model, spectra.d_head[0]
    n_heads = sum(len(r) for r in spectra.ranks)
    all_ranks = np.concatenate(spectra.ranks)
    at_bound = int(sum((r == b).sum() for r, b in zip(spectra.ranks, spectra.d_head)))
    effective = spectra.effective_ranks()
    flat_effective = np.concatenate(effective)
    tail = spectra.dense_check[d_head:]
    factored = spectra.factored_cost(0)
    text = (f"In {name} every head's W_QK is a {d} × {d} matrix, but it is the product of a {d} × {d_head} "
            f"query factor and a {d_head} × {d} key factor, so its rank is at most d_head = {d_head}. "
            f"{_reach(at_bound, n_heads, all_ranks)} Formed in full, the matrix of L0 H0 has {d} singular values; "
            f"beyond the first {d_head} the largest is {tail.max() / spectra.dense_check[0]:.1e} of the first — float "
            f"rounding, not structure. Kept as two factors a head's W_QK costs {_cost(spectra, factored)}; as one "
            f"full bilinear form per head it would cost {d * d:,}, {d * d / factored:.1f}× as many, for scores of "
            f"rank up to {d} instead of {d_head}. Within the bound the spectrum decays: keeping {ENERGY:.0%} of "
            f"‖W_QK‖² takes {int(np.median(flat_effective))} singular values for the median head "
            f"(from {int(flat_effective.min())} to {int(flat_effective.max())}).")
    rows = [[f"{i}", len(r), f"{int(r.min())}–{int(r.max())}" if r.min() != r.max() else str(int(r.min())),
             spectra.d_head[i], float(np.median(e)), float(np.median(s[:, 0]))]
            for i, (r, e, s) in enumerate(zip(spectra.ranks, effective, spectra.singular))]
    parts = [f"<p>{escape(text)}</p>"]
    if plot_href is not None:
        parts.append(f'<p><img src="{escape(plot_href)}" alt="singular values of every head\'s W_QK, normalised by '
                     f'the largest, on log axes; they stop at d_head" style="max-width:100%"></p>')
    parts.append(table(["layer", "heads", "rank", "d_head", f"median rank for {ENERGY:.0%} of ‖W_QK‖²",
                        "median σ₁"], [[r[0], r[1], r[2], r[3], f"{r[4]:.0f}", f"{r[5]:.2f}"] for r in rows],
                       numeric_cols=(1, 2, 3, 4, 5)))
    return Html("".join(parts))


def _cost(spectra: QKSpectra, factored: float) -> str:
    """Layer 0's per-head price of the factors in words, the key factor's sharing spelled out."""
    own = spectra.d_model * spectra.d_head[0]
    group = len(spectra.ranks[0]) // spectra.n_kv_heads[0]
    if group == 1:
        return f"{factored:,.0f} parameters"
    return (f"{factored:,.0f} parameters: its own {own:,}-parameter query factor and a 1/{group} share of the "
            f"{own:,}-parameter key factor that its key head serves to {group} query heads (grouped-query "
            f"attention, {spectra.n_kv_heads[0]} key heads for {len(spectra.ranks[0])} query heads)")


def _reach(at_bound: int, n_heads: int, ranks: np.ndarray) -> str:
    if at_bound == n_heads:
        return f"All {n_heads} heads reach that bound."
    return f"{at_bound} of the {n_heads} heads reach that bound (ranks {int(ranks.min())} to {int(ranks.max())})."


def render(ctx: ReportContext) -> str:
    from headlab.report.provenance import model_name

    loaded = ctx.load_model()
    spectra = measure(loaded)
    href = ctx.write_file(PLOT_NAME, plot_spectra(spectra))
    return render_qk(spectra, name=model_name(loaded.source), plot_href=href)


SECTION = Section(id="qk", title="W_QK in the report's model: a rank-d_head matrix kept as two factors", render=render)
