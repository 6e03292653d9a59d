"""A tiny plan: every benchmark of the suite runs, on sizes that take seconds (no timing is asserted)."""

from __future__ import annotations

import pytest

from headlab.bench import Plan
from tests.support import bench


@pytest.fixture
def tiny_plan() -> Plan:
    return bench.tiny_plan()
