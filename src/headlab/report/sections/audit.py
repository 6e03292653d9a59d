"""Do heads share their query, key and value weights? Answered by ``headlab audit``: a widely copied
tutorial layer and the standard layer, side by side.

The tutorial layer cuts the input into one slice per head and sends every slice through the same
small projections, which makes readers ask whether heads share their weights. This section audits
that layout (written for headlab in ``headlab.audit.examples.slice_shared``) and
``torch.nn.MultiheadAttention`` at the same d_model and number of heads, from the running modules
alone, and shows the evidence: the verdict lines, a side-by-side table of the measured fields,
per-head tables, and the heads' patterns on an input whose slices are all the same (identical for
the shared layer).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from headlab.report.html import Html, code, escape, link, table
from headlab.report.section import ReportContext, Section

if TYPE_CHECKING:
    from headlab.audit import AuditResult

__all__ = ["D_MODEL", "N_HEADS", "JSON_NAME", "PLOT_NAME", "SECTION", "audit_pair", "plot_same_slice",
           "render_audit"]

D_MODEL, N_HEADS = 64, 4
JSON_NAME = "audit.json"
PLOT_NAME = "assets/audit_same_slice.svg"


def audit_pair(*, d_model: int = D_MODEL, n_heads: int = N_HEADS, seed: int = 0) -> tuple[AuditResult, AuditResult]:
    """Audit the tutorial layer's layout and nn.MultiheadAttention, both built with torch seeded by ``seed``."""
    import torch

    from headlab.audit import audit
    from headlab.audit.examples import SliceSharedAttention

    torch.manual_seed(seed)
    tutorial = SliceSharedAttention(embed_size=d_model, heads=n_heads)
    standard = torch.nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    return audit(tutorial, seed=seed), audit(standard, seed=seed)


def _yes(value: bool | None) -> str:
    return "not seen" if value is None else ("yes" if value else "no")


def _side_by_side(results: tuple[AuditResult, AuditResult]) -> Html:
    def row(name: str, get: Callable[[AuditResult], str]) -> list[str]:
        return [name, *(get(r) for r in results)]

    rows = [
        row("calling convention", lambda r: r.call_signature),
        row("attention call", lambda r: r.attention_function),
        row("heads · key/value heads", lambda r: f"{r.n_heads} · {r.n_kv_heads}"),
        row("head size (from)", lambda r: f"{r.d_head} ({r.size_sources['d_head']})"),
        row("each head reads", lambda r: r.reads),
        row("heads share W_QK", lambda r: _yes(r.shared_qk)),
        row("heads share values", lambda r: _yes(r.shared_v)),
        row("same-slice pattern spread", lambda r: "n/a" if r.evidence.same_slice_spread is None
            else f"{r.evidence.same_slice_spread:.1e}"),
        row("rank of each W_QK", lambda r: ", ".join(map(str, r.qk_ranks))),
        row("causal", lambda r: _yes(r.causal)),
        row("parameters", lambda r: f"{r.parameters.module:,}"),
        row("standard layer's parameters", lambda r: f"{r.parameters.standard:,}"),
        row("layout · closest headlab variant", lambda r: f"{r.layout} · {r.variant}"),
        row("equivalent headlab layer, max |Δ|", lambda r: "none" if r.equivalent.max_abs_diff is None
            else f"{'verified' if r.equivalent.verified else 'differs'}, {r.equivalent.max_abs_diff:.1e}"),
    ]
    return table(["measured", *(r.module for r in results)], rows)


def render_audit(results: tuple[AuditResult, AuditResult], *, plot_href: str | None = None,
                 json_href: str | None = None) -> Html:
    """The section's fragment: the answer, verdicts, the side-by-side table, plot and per-head tables.

    Args:
        results: the audits of the tutorial layer's layout and of the standard layer, in that order.
        plot_href: link target of the same-slice patterns plot, if one was written.
        json_href: link target of both audits as JSON, if written.
    """
    from headlab.audit.tables import head_table

    tutorial, standard = results
    answer = (f"The tutorial layer's heads {'do' if tutorial.shared else 'do not'} share their projections "
              f"(each reads {'only its own slice' if tutorial.reads == 'narrow' else tutorial.reads + ' input'}); "
              f"the standard layer's heads {'do' if standard.shared else 'do not'}.")
    how = (" Both were audited by running them, with no source reading: the attention each computes was "
           "intercepted, each head's W_QK and W_OV recovered by probing with basis inputs, and a headlab layer "
           "rebuilt from them and checked against the module")
    parts = [f"<p><strong>Do these heads share weights?</strong> {escape(answer)}{escape(how)} "
             f"({code('headlab audit')}).</p>"]
    for result in results:
        parts.append(f"<p><strong>{escape(result.module)}</strong></p><ul>"
                     + "".join(f"<li>{escape(line)}</li>" for line in result.verdict) + "</ul>")
    parts.append(_side_by_side(results))
    if plot_href is not None:
        parts.append(f'<p><img src="{escape(plot_href)}" alt="each head\'s attention pattern on an input whose '
                     f'slices are all the same, one row per layer" style="max-width:100%"></p>')
    for result in results:
        headers, rows = head_table(result)
        parts.append(table(headers, rows, caption=f"{result.module}: per head (Δ relative to the largest entry)"))
    if json_href is not None:
        parts.append(f'<p class="note">Both audits as JSON: {link(json_href, json_href)} (the format of '
                     f"{code('headlab audit --json')}, docs/audit.md).</p>")
    return Html("".join(parts))


def plot_same_slice(results: tuple[AuditResult, AuditResult]) -> bytes:
    """Each head's pattern on the same-slice input: one row per audited layer, SVG bytes."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [(r, r.same_slice_patterns) for r in results if r.same_slice_patterns is not None]
    if not rows:
        raise ValueError("no audit has same-slice patterns (n_heads must be ≥ 2 and divide d_model)")
    n_cols = max(p.shape[0] for _, p in rows)
    top = max(float(p.max()) for _, p in rows)  # one colour scale for every panel
    fig = Figure(figsize=(2.0 * n_cols, 2.3 * len(rows)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(rows), n_cols, squeeze=False)
    for i, (result, same_slice) in enumerate(rows):
        patterns = same_slice.float()
        for h in range(n_cols):
            ax = axes[i][h]
            ax.set_xticks([])
            ax.set_yticks([])
            if h >= patterns.shape[0]:
                ax.set_axis_off()
                continue
            image = ax.imshow(patterns[h].numpy(), vmin=0.0, vmax=top, cmap="viridis")
            ax.set_title(f"head {h}", fontsize="small")
            if h == 0:
                ax.set_ylabel(f"{result.module}\nspread {result.evidence.same_slice_spread:.1e}", fontsize="small")
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.suptitle("Patterns when every slice of the input is the same (query rows, key columns)")
    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "headlab"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def _render(ctx: ReportContext) -> str:
    results = audit_pair(d_model=32 if ctx.quick else D_MODEL, n_heads=N_HEADS, seed=ctx.seed)
    json_href = ctx.write_file(JSON_NAME, json.dumps([r.to_dict() for r in results], indent=2) + "\n")
    plot_href = ctx.write_file(PLOT_NAME, plot_same_slice(results))
    return render_audit(results, plot_href=plot_href, json_href=json_href)


SECTION = Section(id="audit", render=_render,
                  title="Auditing a tutorial layer with shared per-slice projections against the standard layer")
