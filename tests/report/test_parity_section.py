"""The parity section: summary and table computed from the cases, JSON written next to the page."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from headlab.report import build_report
from headlab.report.html import number
from headlab.report.sections.parity import JSON_NAME, make_parity_section, render_parity


@dataclass(frozen=True)
class FakeCase:
    name: str
    output_max_abs: float
    weights_max_abs: float
    reference_max_abs: float
    passed: bool
    tolerance: float = 1e-5
    settings: dict[str, object] = field(default_factory=lambda: {"d_model": 64, "n_heads": 8})

    def to_dict(self) -> dict:
        return asdict(self)


CASES = [
    FakeCase("self-attention", 1.2e-7, 3.0e-8, 4.5e-7, True),
    FakeCase("cross-attention kdim=24 vdim=40 · key padding", 9.9e-6, 2.5e-7, 1.1e-6, True),
    FakeCase("causal <mask> & padding", 3.0e-4, 8.0e-8, 2.0e-7, False, settings={"masks": "causal+padding"}),
]


def _row(html: str, name_escaped: str) -> str:
    rows = re.findall(r"<tr>(.*?)</tr>", html)
    matching = [r for r in rows if f"<td>{name_escaped}</td>" in r]
    assert len(matching) == 1, f"expected one row for {name_escaped!r}"
    return matching[0]


def test_summary_counts_passing_cases_and_names_the_largest_differences() -> None:
    html = render_parity(CASES)
    assert "2 of 3 cases pass" in html
    assert "2 / 3 pass" in html
    assert f"<code>{number(3.0e-4)}</code> (causal &lt;mask&gt; &amp; padding)" in html
    assert f"<code>{number(2.5e-7)}</code> (cross-attention kdim=24 vdim=40 · key padding)" in html
    assert f"<code>{number(1.1e-6)}</code> (cross-attention" in html
    assert "Failing: causal &lt;mask&gt; &amp; padding." in html


def test_table_numbers_match_each_case() -> None:
    html = render_parity(CASES)
    names = ["self-attention", "cross-attention kdim=24 vdim=40 · key padding", "causal &lt;mask&gt; &amp; padding"]
    for case, name in zip(CASES, names):
        row = _row(html, name)
        nums = re.findall(r'<td class="num">([^<]*)</td>', row)
        expected = [case.output_max_abs, case.weights_max_abs, case.reference_max_abs, case.tolerance]
        assert nums == [number(x) for x in expected]
        assert f'badge {"pass" if case.passed else "fail"}' in row


def test_all_passing_has_no_failing_line_and_settings_are_shown() -> None:
    html = render_parity(CASES[:2])
    assert "2 of 2 cases pass" in html and "Failing" not in html
    assert "d_model=64 · n_heads=8" in html


def test_a_nan_difference_is_reported_as_the_largest() -> None:
    cases = [FakeCase("fine", 1e-3, 1e-7, 1e-7, True), FakeCase("broken", math.nan, 1e-7, 1e-7, False)]
    assert "<code>nan</code> (broken)" in render_parity(cases)


def test_no_cases_is_an_error() -> None:
    with pytest.raises(ValueError, match="no cases"):
        render_parity([])


def test_section_runs_the_suite_with_the_report_seed_and_writes_json(tmp_path: Path) -> None:
    calls: list[dict] = []

    def suite(*, seed: int, quick: bool) -> list[FakeCase]:
        calls.append({"seed": seed, "quick": quick})
        return CASES

    result = build_report(tmp_path, sections=[make_parity_section(suite)], seed=5, quick=True, progress=False)

    assert calls == [{"seed": 5, "quick": True}]
    assert result.sections[0].ok and result.sections[0].id == "parity"
    assert json.loads((tmp_path / JSON_NAME).read_text()) == [c.to_dict() for c in CASES]
    assert f'href="{JSON_NAME}"' in result.index.read_text()


_HAS_INTEROP = importlib.util.find_spec("headlab.interop") is not None and (
    importlib.util.find_spec("headlab.interop.torch_mha") is not None
)


@pytest.mark.skipif(not _HAS_INTEROP, reason="headlab.interop.torch_mha is not importable yet (parity_suite missing)")
def test_real_parity_suite_renders_and_every_case_passes(tmp_path: Path) -> None:
    result = build_report(tmp_path, sections=[make_parity_section()], seed=0, quick=True, progress=False)
    assert result.sections[0].ok, result.sections[0].error
    cases = json.loads((tmp_path / JSON_NAME).read_text())
    assert cases, "parity_suite returned no cases"
    html = result.index.read_text()
    assert f"{len(cases)} of {len(cases)} cases pass" in html, [c["name"] for c in cases if not c["passed"]]
