"""`headlab bench` through CliRunner on a tiny plan: every area runs, --json has the ratios, --out writes
RESULTS.md and its JSON; a CUDA request without CUDA is a usage error. No timing is asserted."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from headlab.bench import Plan, SuiteResult, read_results
from headlab.bench.capture import FIXED_COST
from headlab.cli import app


def _flat(output: str) -> str:
    """Rich's error box without its frame and line breaks."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", output).split())


AREAS = ["layer", "inspection", "decode", "large", "long-context", "models", "capture", "analysis", "importance",
         "patching", "circuits", "pruning", "distributed"]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    from tests.support.bench import tiny_plan

    plan = tiny_plan()  # the fixture's value, in a module-scoped fixture
    out = tmp_path_factory.mktemp("bench") / "RESULTS.md"
    threads = torch.get_num_threads()
    try:  # one thread: on a busy machine, tiny ops with several threads wait on descheduled workers
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("headlab.bench.suite.plan_for", lambda device, quick: plan)
            result = CliRunner().invoke(app, ["bench", "--quick", "--threads", "1", "--json", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), out


def test_json_has_every_area_and_ratios_of_the_medians(ran: tuple[dict, Path]) -> None:
    document, _ = ran
    assert [a["name"] for a in document["areas"]] == AREAS
    assert document["command"] == f"headlab bench --device cpu --quick --threads 1 --json --out {ran[1]}"
    assert document["machine"]["torch threads"] == "1"
    for area in document["areas"]:
        assert area["rows"], area
        for row in area["rows"]:
            assert row["ratio"] == pytest.approx(row["contender_time"]["median"] / row["peer_time"]["median"])
    goals = document["goals"]
    assert goals["met"] + goals["missed"] == sum(
        r["goal"] is not None for a in document["areas"] for r in a["rows"])


def test_rows_cover_the_peers_the_issue_names(ran: tuple[dict, Path]) -> None:
    rows = {a["name"]: a["rows"] for a in ran[0]["areas"]}
    peers = {r["peer"] for r in rows["layer"]}
    assert peers == {"raw floor", "nn.MHA need_weights=False", "nn.MHA need_weights=True",
                     "raw grouped-query floor (SDPA enable_gqa)", "raw multi-query floor (SDPA enable_gqa)"}
    assert any("grouped-query" in r["contender"] for r in rows["layer"])
    assert any("multi-query" in r["contender"] for r in rows["layer"])
    assert {r["peer"] for r in rows["models"]} == {"plain transformers (sdpa)",
                                                   "transformers eager, output_attentions=True"}
    assert sum(r["goal"] is not None for r in rows["models"]) == 4 * 4  # four models, four goal rows each
    contenders = {r["contender"] for r in rows["inspection"]}
    assert contenders == {"forward + one head's pattern", "forward + every head's pattern",
                          "forward + every head's output", "raw floor, no pattern (the bound)",
                          "raw floor + one head's pattern (the bound)"}
    assert all(r["contender_tokens_per_s"] > 0 for r in rows["decode"] + rows["capture"])
    assert any("corpus order" in r["peer"] for r in rows["capture"])
    assert [r["contender"] for r in rows["analysis"]][-2:] == ["all, as analyze runs them", FIXED_COST]
    assert -1.0 <= rows["importance"][0]["details"]["spearman |gradient| vs |ablation|"] <= 1.0
    assert {r["peer"] for r in rows["patching"]} == {"exact activation patching, every head"}
    assert all(-1.0 <= r["details"]["spearman |effect|"] <= 1.0 for r in rows["patching"])
    assert {r["contender"] for r in rows["pruning"]} >= {"headlab, half the heads pruned", "headlab, all heads"}
    assert {r["goal"] for r in rows["circuits"] if r["unit"] == "s"} == {3.0, 12.0, None}
    assert all(r["peer"].startswith(("forward + backward", "peak memory of the forward + backward"))
               for r in rows["circuits"])


def test_the_single_process_goals_of_issue_17_are_rows_measured_against_their_peers(ran: tuple[dict, Path]) -> None:
    rows = {a["name"]: a["rows"] for a in ran[0]["areas"]}
    goal = {(area, r["contender"], r["peer"], r["case"]): r["goal"] for area, rs in rows.items() for r in rs}
    one_head = [g for (area, contender, peer, _), g in goal.items()
                if area == "inspection" and contender == "forward + one head's pattern" and peer == "headlab forward"]
    assert one_head == [1.10] * len(ran[0]["plan"]["layer_shapes"])  # every position count
    same = [g for (area, contender, peer, _), g in goal.items()
            if area == "capture" and contender.startswith("capture, all")
            and peer.startswith("HF forward (sdpa), same")]
    assert same == [1.03]
    analysis = [g for (area, contender, _, _), g in goal.items()
                if area == "analysis" and contender.startswith("all")]
    assert analysis == [1.30] and {r["peer"] for r in rows["analysis"]} == {"capture only"}


def test_flop_rows_carry_the_ceiling_fraction(ran: tuple[dict, Path]) -> None:
    document = ran[0]
    ceiling = document["ceilings"]["matmul_flops_per_s"]
    assert ceiling > 0 and document["ceilings"]["copy_bytes_per_s"] > 0
    for row in document["areas"][0]["rows"]:
        assert row["flops"] > 0
        assert row["contender_flops_per_s"] == pytest.approx(row["flops"] / row["contender_time"]["median"])


def test_out_writes_markdown_and_json_that_read_back(ran: tuple[dict, Path]) -> None:
    document, out = ran
    runs = read_results(out)
    assert list(runs) == ["cpu"] and runs["cpu"] == SuiteResult.from_dict(document)
    text = out.read_text(encoding="utf-8")
    assert "## CPU, float32" in text and "torch threads" in text and torch.__version__ in text
    if not torch.cuda.is_available():
        assert "No GPU table" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["bench", "--device", "cuda"])
    assert result.exit_code == 2
    assert "CUDA is not available" in _flat(result.output)


def test_unknown_device_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, ["bench", "--device", "tpu"])
    assert result.exit_code == 2 and "device='tpu'" in _flat(result.output)


def test_tiny_plan_is_a_plan(tiny_plan: Plan) -> None:
    assert tiny_plan.layer_shapes and tiny_plan.device == "cpu"


def test_an_out_file_that_cannot_be_updated_is_refused_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "RESULTS.json").write_text('{"format": "something else"}')
    result = CliRunner().invoke(app, ["bench", "--out", str(tmp_path / "RESULTS.md")])
    assert result.exit_code == 2 and "not a headlab bench results file" in _flat(result.output)


def test_an_area_that_raises_is_recorded_and_the_other_areas_still_run(
        tmp_path: Path, tiny_plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    from headlab.bench import Area

    def broken(plan: Plan, tick: object) -> Area:
        raise RuntimeError("the contenders disagree by 0.39")

    def fine(plan: Plan, tick: object) -> Area:
        return Area("fine", "Fine", "An area that runs.", notes=["ran"])

    monkeypatch.setattr("headlab.bench.suite.plan_for", lambda device, quick: tiny_plan)
    monkeypatch.setattr("headlab.bench.suite._OWN_AREAS", (("broken", "Broken", broken), ("fine", "Fine", fine)))
    monkeypatch.setattr("headlab.bench.suite._MODEL_AREAS", ())
    out = tmp_path / "RESULTS.md"
    result = CliRunner().invoke(app, ["bench", "--quick", "--json", "--out", str(out)])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert [a["name"] for a in document["areas"]] == ["broken", "fine"]
    assert document["areas"][0]["error"] == "RuntimeError: the contenders disagree by 0.39"
    assert document["areas"][1]["error"] is None and document["areas"][1]["notes"] == ["ran"]
    assert document["failed"] == ["broken"]
    assert "area broken failed: RuntimeError: the contenders disagree by 0.39" in _flat(result.stderr)
    assert "Traceback" in result.stderr and 'raise RuntimeError("the contenders disagree by 0.39")' in result.stderr
    text = out.read_text()
    assert "Areas that failed, their goals not counted: broken." in text
    assert "**Failed**: RuntimeError: the contenders disagree by 0.39" in text
    stored = read_results(out)["cpu"]
    assert [a.error for a in stored.areas] == ["RuntimeError: the contenders disagree by 0.39", None]


def test_a_keyboard_interrupt_in_an_area_still_stops_the_run(tiny_plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    from headlab.bench.suite import run_plan

    def interrupted(plan: Plan, tick: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("headlab.bench.suite._OWN_AREAS", (("interrupted", "Interrupted", interrupted),))
    with pytest.raises(KeyboardInterrupt):
        run_plan(tiny_plan, quick=True, progress=False)


def test_area_runs_only_the_areas_named(tiny_plan: Plan, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("headlab.bench.suite.plan_for", lambda device, quick: tiny_plan)
    result = CliRunner().invoke(app, ["bench", "--quick", "--json", "--area", "decode", "--area", "layer"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [a["name"] for a in document["areas"]] == ["layer", "decode"]  # in the suite's order
    assert document["command"] == "headlab bench --device cpu --quick --area decode --area layer --json"


def test_an_unknown_area_is_a_usage_error_naming_the_areas() -> None:
    result = CliRunner().invoke(app, ["bench", "--area", "circuit"])
    assert result.exit_code == 2
    assert "unknown area(s) 'circuit'" in _flat(result.output) and "circuits" in _flat(result.output)


def test_area_with_out_is_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "--area", "circuits", "--out", str(tmp_path / "RESULTS.md")])
    assert result.exit_code == 2 and "--out records whole runs" in _flat(result.output)
    assert not (tmp_path / "RESULTS.md").exists()
