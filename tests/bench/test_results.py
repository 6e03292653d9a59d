"""RESULTS.md and RESULTS.json: the writer round trip, one entry per device, plain statements."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from headlab.bench import read_results, to_markdown, write_results
from headlab.bench.records import Area, Comparison
from headlab.bench.results import (
    TABLE_HEADERS,
    format_bytes,
    format_seconds,
    inconclusive,
    json_path,
    noise,
    noise_note,
    table_rows,
)
from headlab.bench.timing import Timing
from tests.support.bench import suite_result


def test_write_then_read_gives_the_run_back(tmp_path: Path) -> None:
    run = suite_result()
    markdown, source = write_results(run, tmp_path / "out" / "RESULTS.md")
    assert source == tmp_path / "out" / "RESULTS.json" == json_path(markdown)
    assert read_results(markdown) == {"cpu": run}
    assert read_results(source) == {"cpu": run}


def test_markdown_describes_the_machine_ceilings_goals_and_every_row(tmp_path: Path) -> None:
    run = suite_result()
    text = write_results(run, tmp_path / "RESULTS.md")[0].read_text(encoding="utf-8")
    assert "| cpu | test |" in text
    assert f"{run.ceilings.matmul_flops_per_s / 1e9:,.1f} GFLOP/s" in text
    assert "Goals: 1 of 2 met." in text and "missed (layer)" in text
    assert "headlab bench --quick" in text and "a note" in text
    for area in run.areas:
        for cells in table_rows(area, run.ceilings.matmul_flops_per_s):
            assert "| " + " | ".join(cells) + " |" in text


def test_without_a_gpu_run_the_file_says_plainly_why(tmp_path: Path) -> None:
    run = suite_result()
    run.machine["cuda available"] = "no"
    text = to_markdown({"cpu": run})
    assert "No GPU table: no CUDA device was available" in text
    run.machine["cuda available"] = "yes"
    assert "No GPU (CUDA) table: the suite has not been run with `--device cuda`" in to_markdown({"cpu": run})


def test_a_run_replaces_only_its_own_device(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    cpu = suite_result()
    gpu = dataclasses.replace(cpu, plan=dataclasses.replace(cpu.plan, device="cuda", dtype="bfloat16"),
                              command="headlab bench --device cuda")
    write_results(cpu, path)
    write_results(gpu, path)
    newer = dataclasses.replace(cpu, seconds=99.0)
    write_results(newer, path)
    assert read_results(path) == {"cpu": newer, "cuda": gpu}
    text = path.read_text(encoding="utf-8")
    assert "## CPU, float32" in text and "## GPU (CUDA), bfloat16" in text and "No GPU" not in text


def test_a_foreign_json_file_is_refused_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "RESULTS.json").write_text(json.dumps({"something": "else"}))
    with pytest.raises(ValueError, match="not a headlab bench results file"):
        write_results(suite_result(), tmp_path / "RESULTS.md")
    (tmp_path / "RESULTS.json").write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        read_results(tmp_path / "RESULTS.md")


def test_no_file_means_no_runs(tmp_path: Path) -> None:
    assert read_results(tmp_path / "RESULTS.md") == {}


def test_table_cells() -> None:
    run = suite_result()
    ceiling = run.ceilings.matmul_flops_per_s
    first, second = table_rows(run.areas[0], ceiling)
    assert len(first) == len(TABLE_HEADERS)
    cell = dict(zip(TABLE_HEADERS, first))
    assert (cell["ratio"], cell["goal"], cell["met"]) == ("1.000, within noise", "≤ 1.05", "yes")  # noise 75%
    assert cell["rate"] == f"0.0 GFLOP/s ({2e6 / 1.0 / ceiling:.0%} of ceiling)"
    cell = dict(zip(TABLE_HEADERS, second))
    assert (cell["met"], cell["rate"], cell["details"]) == ("no", "25 vs 50 tokens/s", "padding 1.500")


@pytest.mark.parametrize(("seconds", "text"), [(5e-4, "500 µs"), (0.0123, "12.3 ms"), (2.5, "2.5 s")])
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(("n", "text"), [(812 * 2**10, "812 KiB"), (12.3 * 2**20, "12.3 MiB"),
                                         (1.5 * 2**30, "1.5 GiB")])
def test_format_bytes(n: float, text: str) -> None:
    assert format_bytes(n) == text


def test_a_memory_rows_cells_hold_bytes() -> None:
    row = Comparison("c", "peak memory of EAP", "peak memory of the peer", Timing((48 * 2**20,)),
                     Timing((16 * 2**20,)), goal=2.0, unit="bytes")
    cell = dict(zip(TABLE_HEADERS, table_rows(Area("circuits", "Circuits", "what ran", [row]), 1e9)[0]))
    assert (cell["time"], cell["peer time"], cell["ratio"], cell["met"], cell["rate"]) == (
        "48 MiB", "16 MiB", "3.000", "no", "")


def test_a_row_noisier_than_its_effect_says_it_cannot_conclude() -> None:
    """Pruning half the heads "2.27× slower" with noise 275% says nothing about which side is faster."""
    noisy = Comparison("c", "half the heads pruned", "all heads", Timing((0.5, 2.27, 10.0)), Timing((1.0, 1.0, 1.0)))
    clear = Comparison("c", "pruned", "all heads", Timing((0.79, 0.8, 0.81)), Timing((0.99, 1.0, 1.01)))
    assert noisy.ratio == pytest.approx(2.27) and noise(noisy) > 1.27 and inconclusive(noisy)
    assert noise(clear) < 0.05 and not inconclusive(clear)
    area = Area("pruning", "Pruning", "what ran", [noisy, clear])
    ratios = [dict(zip(TABLE_HEADERS, cells))["ratio"] for cells in table_rows(area, 1e9)]
    assert ratios == ["2.270, within noise", "0.800"]
    note = noise_note(area)
    assert note == ('1 of 2 rows cannot conclude (ratio marked "within noise"): their timing noise is larger than the '
                    "ratio's distance from 1, so they do not say which side is faster; the noisiest, half the heads "
                    f"pruned vs all heads, has ratio 2.270 with noise {noise(noisy):.0%}.")
    run = suite_result()
    run.areas = [area]
    assert note in to_markdown({"cpu": run})
    assert noise_note(Area("pruning", "Pruning", "what ran", [clear])) is None
