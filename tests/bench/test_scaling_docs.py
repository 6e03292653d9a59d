"""docs/scaling.md's measured numbers are read from benchmarks/RESULTS.json, never typed by hand.

The block between ``<!-- generated from benchmarks/RESULTS.json … -->`` and ``<!-- end generated -->``
is the latest CPU run's "distributed" area (``headlab bench``, written by ``make bench``), rendered
by ``tests.support.regenerate.measured_numbers``. ``make bench`` rewrites the block after the run;
alone: ``.venv/bin/python -m tests.support.regenerate scaling``.
"""

from __future__ import annotations

from tests.support.regenerate import SCALING, measured_numbers


def test_the_measured_numbers_are_those_of_results_json():
    SCALING.check(measured_numbers())


def test_a_results_file_without_the_area_says_not_measured(tmp_path):
    (tmp_path / "RESULTS.json").write_text('{"format": "headlab-bench/1", "runs": {}}\n')
    assert measured_numbers(tmp_path / "RESULTS.md").startswith("Not measured yet:")
