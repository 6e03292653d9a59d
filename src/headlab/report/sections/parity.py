"""Parity of headlab's layer with ``torch.nn.MultiheadAttention`` and a float64 reference.

The cases come from :func:`headlab.interop.torch_mha.parity_suite`; this module only
summarises and tabulates them, so :func:`render_parity` can be fed any list of
case-like objects (tests pass fakes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Protocol

from headlab.report.html import Html, badge, code, escape, link, number, table
from headlab.report.section import ReportContext, Section

__all__ = ["ParityCaseLike", "render_parity", "make_parity_section", "SECTION", "JSON_NAME"]

JSON_NAME = "parity.json"


class ParityCaseLike(Protocol):
    """The fields of ``headlab.interop.torch_mha.ParityCase`` this section reads."""

    @property
    def name(self) -> str: ...
    @property
    def settings(self) -> dict[str, object]: ...
    @property
    def output_max_abs(self) -> float: ...
    @property
    def weights_max_abs(self) -> float: ...
    @property
    def reference_max_abs(self) -> float: ...
    @property
    def tolerance(self) -> float: ...
    @property
    def passed(self) -> bool: ...

    def to_dict(self) -> dict: ...


SuiteFn = Callable[..., Sequence[ParityCaseLike]]


def _settings_text(settings: dict[str, object]) -> str:
    return " · ".join(f"{k}={v}" for k, v in settings.items())


def _largest(cases: Sequence[ParityCaseLike], attr: str) -> ParityCaseLike:
    # NaN compares False with everything; rank it highest so a NaN is never hidden.
    def key(c: ParityCaseLike) -> float:
        v = float(getattr(c, attr))
        return float("inf") if v != v else v

    return max(cases, key=key)


def render_parity(cases: Sequence[ParityCaseLike], *, json_href: str | None = None) -> Html:
    """Summarise parity cases as a sentence and a table.

    Args:
        cases: results of the parity suite, in display order.
        json_href: link to the machine-readable copy of the cases, if one was written.

    Returns:
        The section's HTML fragment.

    Raises:
        ValueError: ``cases`` is empty (a parity check that checked nothing is a failure).
    """
    if not cases:
        raise ValueError("the parity suite returned no cases")
    n_pass = sum(bool(c.passed) for c in cases)
    failing = [c.name for c in cases if not c.passed]
    out_c = _largest(cases, "output_max_abs")
    pat_c = _largest(cases, "weights_max_abs")
    ref_c = _largest(cases, "reference_max_abs")

    verdict = badge(not failing, text=f"{n_pass} / {len(cases)} pass")
    summary = (
        f"<p>{verdict} {escape(n_pass)} of {escape(len(cases))} cases pass. "
        f"Largest output difference from <code>torch.nn.MultiheadAttention</code>: "
        f"{code(number(out_c.output_max_abs))} ({escape(out_c.name)}); "
        f"largest attention-pattern difference: {code(number(pat_c.weights_max_abs))} ({escape(pat_c.name)}); "
        f"largest difference from the float64 reference: {code(number(ref_c.reference_max_abs))} "
        f"({escape(ref_c.name)}).</p>"
    )
    if failing:
        summary += f"<p>Failing: {escape(', '.join(failing))}.</p>"

    explain = (
        '<p class="note">Each case builds a <code>torch.nn.MultiheadAttention</code>, imports its weights '
        "into a headlab layer and calls both on the same inputs and masks. "
        "<em>output</em>: max |headlab − torch| over the outputs; "
        "<em>pattern</em>: max |headlab pattern − torch's per-head attention weights| over the rows "
        "torch leaves finite; <em>float64</em>: max |headlab float32 − float64 reference|."
        + (f" All cases as JSON: {link(json_href, json_href)}." if json_href else "")
        + "</p>"
    )
    rows = [
        [
            escape(c.name),
            Html(f'<span class="settings">{escape(_settings_text(c.settings))}</span>'),
            float(c.output_max_abs),
            float(c.weights_max_abs),
            float(c.reference_max_abs),
            float(c.tolerance),
            badge(bool(c.passed)),
        ]
        for c in cases
    ]
    headers = ["case", "settings", "output max |Δ|", "pattern max |Δ|", "float64 max |Δ|", "tolerance", "result"]
    return Html(summary + explain + table(headers, rows, numeric_cols=(2, 3, 4, 5)))


def _default_suite(*, seed: int, quick: bool) -> Sequence[ParityCaseLike]:
    from headlab.interop.torch_mha import parity_suite  # heavy: builds layers and runs torch

    return parity_suite(seed=seed, quick=quick)


def make_parity_section(suite: SuiteFn | None = None) -> Section:
    """Build the parity section around a suite function.

    Args:
        suite: called as ``suite(seed=ctx.seed, quick=ctx.quick)``; defaults to
            ``headlab.interop.torch_mha.parity_suite``.

    Returns:
        A :class:`Section` that runs the suite, writes ``parity.json`` and renders the table.
    """
    run = suite if suite is not None else _default_suite

    def render(ctx: ReportContext) -> str:
        cases = list(run(seed=ctx.seed, quick=ctx.quick))
        payload = json.dumps([c.to_dict() for c in cases], indent=2, default=str) + "\n"
        href = ctx.write_file(JSON_NAME, payload)
        return render_parity(cases, json_href=href)

    return Section(id="parity", title="Parity with torch.nn.MultiheadAttention", render=render)


SECTION = make_parity_section()
