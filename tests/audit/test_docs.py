"""docs/audit.md: its worked examples are what the command prints, its thresholds are the code's."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from headlab.audit import calling, findings, masks, probes, run
from headlab.audit.errors import FAILURE_KINDS
from headlab.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "audit.md").read_text(encoding="utf-8")
ROUNDING = re.compile(r"\d\.\de-1\d")  # float64 rounding noise (e.g. 5.0e-16) may differ between CPUs
WORKED = re.findall(r"^\$ headlab audit (.*?)\n(.*?)\n```", DOCS, re.DOTALL | re.MULTILINE)


def test_the_docs_show_the_tutorial_layer_and_three_of_the_corpus() -> None:
    shown = [shlex.split(command)[0].split("/")[-1] for command, _ in WORKED]
    assert shown[0] == "slice_shared.py:SliceSharedAttention"
    assert len(shown) >= 4 and len(set(shown)) == len(shown)


@pytest.mark.parametrize(("command", "block"), WORKED, ids=[c.split()[0].split("/")[-1] for c, _ in WORKED])
def test_each_worked_example_is_what_the_command_prints(command: str, block: str) -> None:
    args = shlex.split(command)
    result = CliRunner().invoke(app, ["audit", str(ROOT / args[0]), *args[1:]], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    printed = [line for line in result.stdout.splitlines() if line.startswith("• ")]
    assert [ROUNDING.sub("~", line) for line in printed] == [ROUNDING.sub("~", line) for line in block.splitlines()]


def test_the_documented_thresholds_lengths_and_keywords_are_the_codes() -> None:
    f64, f32 = run._PRECISION.values()
    said = f"`rtol` is {f64.rtol:.0e} when probing in float64 and {f32.rtol:.0e} in float32"
    assert said.replace("e-0", "e-") in DOCS
    assert f"at most {f64.output:.0e} (float64; {f32.output:.0e} in float32)".replace("e-0", "e-") in DOCS
    assert f"with {calling._QUERY_LEN} queries and {calling._KEY_LEN} keys" in DOCS
    assert "over {} and {} positions".format(*probes._LAYOUT_LENGTHS) in DOCS
    assert f"change only the last of {run._RANDOM_LENGTH} random inputs" in DOCS
    assert "two random inputs ({} and {} positions)".format(*findings._VERIFY_LENGTHS) in DOCS
    assert f"hiding the last of {masks._LENGTH} keys" in DOCS
    for names in (masks.MASK_KEYWORDS, masks.CAUSAL_FLAGS, masks.WEIGHT_KEYWORDS, FAILURE_KINDS):
        assert ", ".join(f"`{name}`" for name in names[:-1]) + f", `{names[-1]}`" in DOCS.replace(" and `", ", `")
    assert len(masks.MASK_FORMS) == 4 and "in each of four forms" in DOCS
