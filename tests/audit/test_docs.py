"""docs/audit.md: its worked example is what the command prints, its thresholds are the code's."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from headlab.audit import calling, probes, run
from headlab.cli import app

DOCS = (Path(__file__).resolve().parents[2] / "docs" / "audit.md").read_text(encoding="utf-8")
ROUNDING = re.compile(r"\d\.\de-1\d")  # float64 rounding noise (e.g. 5.0e-16) may differ between CPUs


def test_the_worked_example_is_what_the_command_prints() -> None:
    command = "headlab audit src/headlab/audit/examples/thread_000.py:SliceSharedAttention"
    block = re.search(rf"\$ {re.escape(command)}\n(.*?)\n```", DOCS, re.DOTALL)
    assert block, "the worked example is missing from docs/audit.md"
    root = Path(__file__).resolve().parents[2]
    result = CliRunner().invoke(app, ["audit", str(root / command.split()[2])], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    printed = [line for line in result.stdout.splitlines() if line.startswith("• ")]
    assert [ROUNDING.sub("~", line) for line in printed] == [ROUNDING.sub("~", line) for line in
                                                            block.group(1).splitlines()]


def test_the_documented_thresholds_and_lengths_are_the_codes() -> None:
    f64, f32 = run._PRECISION.values()
    assert f"`rtol` is {f64.rtol:.0e} when probing in float64 and {f32.rtol:.0e} in float32".replace("e-0", "e-") in DOCS
    assert f"at most {f64.output:.0e} (float64; {f32.output:.0e} in float32)".replace("e-0", "e-") in DOCS
    assert f"with {calling._QUERY_LEN} queries and {calling._KEY_LEN} keys" in DOCS
    assert "over {} and {} positions".format(*probes._LAYOUT_LENGTHS) in DOCS
    assert f"change only the last of {run._RANDOM_LENGTH} random inputs" in DOCS
    assert "two random inputs ({} and {} positions)".format(*run._VERIFY_LENGTHS) in DOCS
