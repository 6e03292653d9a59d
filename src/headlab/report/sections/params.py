"""Parameters and FLOPs by variant and number of heads, answering three questions from the counts:
do heads share Q/K/V weights? why does the parameter count not change with the number of heads?
why separate W_Q and W_K instead of one W_QK?

The counts come from :func:`headlab.layer.accounting.sweep`. This module is the one home of
the prose about them: :func:`explain` turns a preset's rows into one sentence on why its count
moves with the number of heads, and both this section and ``headlab params --explain`` show
those sentences. Every number in a sentence is read from the rows; the standard layer's count
is checked against ``torch.nn.MultiheadAttention`` built at the same sizes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from headlab.report.html import Html, code, escape, link, table
from headlab.report.section import ReportContext, Section

if TYPE_CHECKING:
    from headlab.layer.accounting import Accounting, Sweep

__all__ = ["D_MODEL", "HEADS", "SEQ_LEN", "JSON_NAME", "PLOT_NAME", "SECTION", "explain", "explain_sweep",
           "make_params_section", "params_document", "plot_parameters", "render_params"]

D_MODEL = 512
HEADS = (1, 2, 4, 8, 16)
SEQ_LEN = 128
JSON_NAME = "params.json"
PLOT_NAME = "assets/params.svg"

TorchCountFn = Callable[[int, int], int]


def _n(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


# --- one sentence per preset, from the numbers (shown here and by `headlab params --explain`) ----

def explain(name: str, rows: Sequence[Accounting]) -> str:
    """One sentence on how preset ``name``'s parameter count moves with n_heads, and why.

    Every number in the sentence is read from ``rows``; the trend (constant, growing,
    shrinking, shrinking then level) is computed, not assumed.

    Args:
        name: a preset in ``headlab.layer.presets.PRESETS``.
        rows: accountings of ``preset_config(name, d_model=d, n_heads=h)`` for one d and one
            or more h.

    Raises:
        ValueError: unknown preset, no rows, or a row whose config is not the preset's.
    """
    from headlab.layer.presets import check_presets, preset_config

    check_presets([name])
    if not rows:
        raise ValueError(f"explain({name!r}) needs at least one row")
    rows = sorted(rows, key=lambda a: a.config.n_heads)
    for a in rows:
        expected = preset_config(name, d_model=rows[0].config.d_model, n_heads=a.config.n_heads)
        if a.config != expected:
            raise ValueError(
                f"explain({name!r}) needs rows of the {name!r} preset at one d_model; "
                f"got {a.config} (expected {expected})"
            )
    return f"Parameters {_trend(rows)}: {_REASONS[name](rows)}."


def explain_sweep(result: Sweep) -> dict[str, str]:
    """Returns: preset → ``explain(preset, its rows)``, for every preset of ``result`` with rows."""
    return {name: explain(name, rows) for name, rows in result.by_variant().items()}


def params_document(result: Sweep) -> dict[str, Any]:
    """The JSON document of ``headlab params --json --explain`` and of the report's params.json (docs/params.md)."""
    return result.to_dict() | {"explanations": explain_sweep(result)}


def _span(values: Sequence[float]) -> str:
    """``"512"`` when all equal, else ``"512 to 32"`` (first to last)."""
    return _n(values[0]) if len(set(values)) == 1 else f"{_n(values[0])} to {_n(values[-1])}"


def _heads(h: int) -> str:
    return f"{h} head" if h == 1 else f"{h} heads"


def _trend(rows: Sequence[Accounting]) -> str:
    t = [a.total_parameters for a in rows]
    h = [a.config.n_heads for a in rows]
    if len(t) == 1:
        return f"are {_n(t[0])} at {_heads(h[0])}"
    if len(set(t)) == 1:
        return f"stay at {_n(t[0])} for {h[0]}–{_heads(h[-1])}"
    steps = [b - a for a, b in pairwise(t)]
    if all(s >= 0 for s in steps) or all(s <= 0 for s in steps):
        verb = "grow" if t[-1] > t[0] else "fall"
        level = next(i for i in range(len(t)) if len(set(t[i:])) == 1)  # where the tail goes flat
        if 0 < level < len(t) - 1:
            return (f"{verb} from {_n(t[0])} at {_heads(h[0])} to {_n(t[level])} at {_heads(h[level])}, "
                    f"then stay there up to {_heads(h[-1])}")
        return f"{verb} from {_n(t[0])} at {_heads(h[0])} to {_n(t[-1])} at {_heads(h[-1])}"
    lo, hi = t.index(min(t)), t.index(max(t))
    return f"range from {_n(t[lo])} at {_heads(h[lo])} to {_n(t[hi])} at {_heads(h[hi])}, not monotonically"


def _p(a: Accounting, name: str) -> int:
    return a.parameters.get(f"projection.{name}", 0)


def _biases(a: Accounting) -> int:
    return sum(n for name, n in a.parameters.items() if name.endswith("bias"))


def _out(a: Accounting) -> int:
    return _p(a, "out_proj.weight") + _p(a, "out_proj.bias")


def _col(rows: Sequence[Accounting], f: Callable[[Accounting], float]) -> list[float]:
    return [f(a) for a in rows]


def _wide_reason(rows: Sequence[Accounting]) -> str:
    weights = _col(rows, lambda a: a.total_parameters - _biases(a))
    per_head = _col(rows, lambda a: (a.total_parameters - _biases(a)) / a.config.n_heads)
    d_head = _col(rows, lambda a: a.config.d_head)
    verb = "split one budget" if len(set(weights)) == 1 else "add up to"
    return (f"each head's W_Q, W_K, W_V and W_O hold 4·d_model·d_head = {_span(per_head)} weights with "
            f"d_head = d_model/h = {_span(d_head)}, so the heads {verb} of 4·d_model² = {_span(weights)} "
            f"weights (plus {_span(_col(rows, _biases))} biases) instead of each adding its own")


def _sliced_reason(rows: Sequence[Accounting], *, shared: bool) -> str:
    q = _col(rows, lambda a: _p(a, "q_weight"))
    d_slice = _col(rows, lambda a: a.config.d_model // a.config.n_heads)
    who = ("one (d_model/h × d_model/h) matrix serves every head, so each of W_Q, W_K, W_V holds "
           "(d_model/h)² = d_model²/h²" if shared else
           "each head projects only its own d_model/h-wide slice with its own matrices, so each of "
           "W_Q, W_K, W_V holds h·(d_model/h)² = d_model²/h")
    return (f"{who} = {_span(q)} weights (slices {_span(d_slice)} wide), while the output projection "
            f"keeps its {_span(_col(rows, _out))}")


def _bilinear_reason(rows: Sequence[Accounting]) -> str:
    qk = _col(rows, lambda a: _p(a, "qk_weight"))
    per_head = _col(rows, lambda a: _p(a, "qk_weight") / a.config.n_heads)
    factored = _col(rows, lambda a: (a.config.d_model + a.config.kdim) * a.config.d_model // a.config.n_heads)
    return (f"each head's W_QK is a full d_model × d_model form of {_span(per_head)} weights and rank up to "
            f"{_span(_col(rows, lambda a: a.qk_rank_bound))}, so the query-key forms take h·d_model² = "
            f"{_span(qk)}, against 2·d_model·d_head = {_span(factored)} per head (rank ≤ d_head = "
            f"{_span(_col(rows, lambda a: a.config.d_model // a.config.n_heads))}) "
            "for a wide head's separate W_Q and W_K")


def _collaborative_reason(rows: Sequence[Accounting]) -> str:
    shared = _col(rows, lambda a: _p(a, "q_weight") + _p(a, "k_weight"))
    width = _col(rows, lambda a: a.config.d_head)
    wide = _col(rows, lambda a: 2 * a.config.d_model * a.config.d_model)
    return (f"all heads share one W̃_Q and one W̃_K of width D = d_head = d_model/h = {_span(width)}, so they hold "
            f"2·d_model·D = {_span(shared)} weights (a wide layer's W_Q and W_K: 2·d_model² = {_span(wide)}) and each "
            f"head adds only a mixing vector of D weights ({_span(_col(rows, lambda a: _p(a, 'mixing')))} in all), "
            "while values and W_O are the wide layer's; D is the config's d_head, set it for a wider shared space")


def _kv_reason(rows: Sequence[Accounting], *, grouped: bool) -> str:
    from headlab.layer.presets import GQA_GROUP_SIZE

    kv = _col(rows, lambda a: 2 * a.config.n_kv_heads * a.config.d_head * a.config.d_model)
    qo = _col(rows, lambda a: 2 * a.config.n_heads * a.config.d_head * a.config.d_model)
    n_kv = ", ".join(str(a.config.n_kv_heads) for a in rows)
    who = (f"groups of {GQA_GROUP_SIZE} query heads share a key/value head (n_kv_heads = {n_kv} for "
           f"{', '.join(str(a.config.n_heads) for a in rows)} heads)" if grouped else
           "every query head reads the one key/value head, of width d_head = d_model/h")
    return (f"{who}, so W_K and W_V hold 2·n_kv_heads·d_head·d_model = {_span(kv)} weights "
            f"while W_Q and W_O keep 2·d_model² = {_span(qo)}")


def _talking_reason(rows: Sequence[Accounting]) -> str:
    core = _col(rows, lambda a: sum(n for name, n in a.parameters.items() if name.startswith("core.")))
    wide = [a.total_parameters - mixing for a, mixing in zip(rows, core)]
    return (f"the wide layer's {_span(wide)} plus two h × h mixings of the heads' logits and weights, "
            f"2·h² = {_span(core)}")


_REASONS: dict[str, Callable[[Sequence[Accounting]], str]] = {
    "wide": _wide_reason,
    "narrow": lambda rows: _sliced_reason(rows, shared=False),
    "shared": lambda rows: _sliced_reason(rows, shared=True),
    "bilinear": _bilinear_reason,
    "collaborative": _collaborative_reason,
    "grouped-query": lambda rows: _kv_reason(rows, grouped=True),
    "multi-query": lambda rows: _kv_reason(rows, grouped=False),
    "talking-heads": _talking_reason,
}


def _torch_mha_count(d_model: int, n_heads: int) -> int:
    import torch  # heavy; only when the section renders

    return sum(p.numel() for p in torch.nn.MultiheadAttention(d_model, n_heads).parameters())


def _more_heads(result: Sweep, explanations: dict[str, str], torch_count: TorchCountFn | None) -> str:
    wide = result.by_variant().get("wide")
    if not wide:
        return ""
    text = (f"<p><strong>Do more heads mean more parameters?</strong> Not in the standard layer. "
            f"{code('wide')}: {escape(explanations['wide'])}")
    if torch_count is not None:
        counts = [torch_count(result.d_model, a.config.n_heads) for a in wide]
        same = counts == [a.total_parameters for a in wide]
        text += escape(
            f" torch.nn.MultiheadAttention({result.d_model}, h) has {', '.join(_n(c) for c in counts)} parameters "
            f"for h = {', '.join(str(a.config.n_heads) for a in wide)}: "
            + ("the same as the wide rows, since it is this layer." if same
               else "these differ from the wide rows.")
        )
    return text + "</p>"


def _shared_weights(result: Sweep, explanations: dict[str, str]) -> str:
    if "shared" not in explanations:
        return ""
    return (f"<p><strong>Do heads share weights?</strong> In the standard layer no: each head has its own slice "
            f"of W_Q, W_K, W_V and W_O. In the layout of the widely copied tutorial layer, which applies one "
            f"projection to every head's slice of the input, they do. {code('shared')}: "
            f"{escape(explanations['shared'])}</p>")


def _separate_qk(result: Sweep, explanations: dict[str, str]) -> str:
    if "bilinear" not in explanations:
        return ""
    rows = result.by_variant()["bilinear"]
    # Per head: a full W_QK (d_model·kdim) against the factored pair (d_model + kdim)·d_model/h.
    cheaper = [a.config.n_heads for a in rows
               if (a.config.d_model + a.config.kdim) * a.config.d_model // a.config.n_heads
               < a.config.d_model * a.config.kdim]
    verdict = (f"The separate factors are the cheaper of the two at {', '.join(map(str, cheaper))} heads"
               if cheaper else "At these numbers of heads the separate factors are never the cheaper")
    return (f"<p><strong>Why separate W_Q and W_K instead of one W_QK?</strong> {code('bilinear')}: "
            f"{escape(explanations['bilinear'])} {escape(verdict)}, at the price of a rank bounded by d_head: "
            f"what scores a head can express is capped by its width.</p>")


def render_params(
    result: Sweep,
    *,
    torch_count: TorchCountFn | None = None,
    plot_href: str | None = None,
    json_href: str | None = None,
) -> Html:
    """The section's fragment: the answers to "do more heads mean more parameters?", "do heads share
    weights?" and "why separate W_Q and W_K?", one sentence per other variant, the table.

    Args:
        result: the sweep to show.
        torch_count: ``(d_model, n_heads) -> parameters of torch.nn.MultiheadAttention``, to check
            the wide rows against; None leaves the check out.
        plot_href: link target of the parameters-vs-heads plot, if one was written.
        json_href: link target of the sweep as JSON, if one was written.

    Raises:
        ValueError: the sweep has no rows.
    """
    if not result.rows:
        raise ValueError("the parameter sweep has no rows")
    explanations = explain_sweep(result)
    in_answers = {"wide", "shared", "bilinear"}  # their sentences are part of the answers above the list
    parts = [
        f"<p>Layers of width d_model = {escape(result.d_model)}; FLOPs of one forward pass over "
        f"{escape(result.seq_len)} positions of self-attention, batch 1, 2 per multiply-add (softmax and other "
        "element-wise work not counted).</p>",
        _more_heads(result, explanations, torch_count),
        _shared_weights(result, explanations),
        _separate_qk(result, explanations),
        "".join(f"<li>{code(name)}: {escape(sentence)}</li>" for name, sentence in explanations.items()
                if name not in in_answers),
    ]
    if parts[-1]:
        parts[-1] = f"<ul>{parts[-1]}</ul>"
    if result.skipped:
        parts.append("<p class=\"note\">Skipped: " + escape("; ".join(
            f"{s.variant} at n_heads={s.n_heads} ({s.reason})" for s in result.skipped)) + ".</p>")
    if plot_href is not None:
        parts.append(f'<p><img src="{escape(plot_href)}" alt="total parameters against number of heads, '
                     f'one line per variant, log scale" style="max-width:100%"></p>')
    rows = []
    for row in result.rows:
        a, c = row.accounting, row.accounting.config
        rows.append([code(row.variant), str(c.n_heads), str(c.n_kv_heads), str(row.qk_dim), f"{a.total_parameters:,}",
                     _n(a.parameters_per_head), f"{a.total_flops:,}", str(a.qk_rank_bound)])
    headers = ["variant", "heads", "kv heads", "q·k width", "parameters", "per head", "FLOPs", "rank W_QK ≤"]
    parts.append(table(headers, rows, numeric_cols=range(1, 8)))
    if json_href is not None:
        parts.append(f'<p class="note">Every row, parameters and FLOPs by stage, as JSON: '
                     f"{link(json_href, json_href)} (the format of {code('headlab params --json')}).</p>")
    return Html("".join(parts))


def plot_parameters(result: Sweep) -> bytes:
    """Total parameters against number of heads, one line per variant, log-scale y, as SVG bytes."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    markers = "os^vD<>px*"
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)  # the Agg canvas, without switching pyplot's global backend
    ax = fig.add_subplot()
    for i, (name, rows) in enumerate(result.by_variant().items()):
        ax.plot([a.config.n_heads for a in rows], [a.total_parameters for a in rows],
                marker=markers[i % len(markers)], markersize=max(3.0, 9.0 - 0.8 * i),  # overlapping lines stay visible
                linestyle="-" if i < 5 else "--", label=name)
    heads = sorted({row.accounting.config.n_heads for row in result.rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(heads, [str(h) for h in heads])
    ax.set_yscale("log")
    ax.set_xlabel("number of heads")
    ax.set_ylabel("parameters")
    ax.set_title(f"Parameters of one attention layer, d_model = {result.d_model}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small", ncols=2)
    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.hashsalt": "headlab"}):  # stable ids: the same numbers give the same file
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()


def make_params_section(
    *, d_model: int = D_MODEL, heads: Sequence[int] = HEADS, seq_len: int = SEQ_LEN,
    torch_count: TorchCountFn | None = _torch_mha_count,
) -> Section:
    """Build the section around one sweep (the same in quick mode: it is cheap).

    Args:
        d_model, heads, seq_len: the sweep's sizes, over every preset variant.
        torch_count: see :func:`render_params`; default builds torch.nn.MultiheadAttention.

    Returns:
        A :class:`Section` that writes ``params.json`` and ``assets/params.svg`` and renders the fragment.
    """

    def render(ctx: ReportContext) -> str:
        from headlab.layer.accounting import sweep

        result = sweep(d_model=d_model, n_heads=heads, seq_len=seq_len)
        json_href = ctx.write_file(JSON_NAME, json.dumps(params_document(result), indent=2) + "\n")
        plot_href = ctx.write_file(PLOT_NAME, plot_parameters(result))
        return render_params(result, torch_count=torch_count, plot_href=plot_href, json_href=json_href)

    return Section(id="params", title="Parameters and FLOPs by variant and number of heads", render=render)


SECTION = make_params_section()
