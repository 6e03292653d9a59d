"""Audits shared by the tests of headlab.audit: each example is audited once per test session."""

from __future__ import annotations

import pytest
import torch

from headlab.audit import AuditResult, audit
from headlab.audit.examples import EXAMPLES, build


@pytest.fixture(scope="session")
def example_audits() -> dict[str, tuple[torch.nn.Module, AuditResult]]:
    """Every example, built twice with torch seeded by 0 (as the command does), and its audit."""
    out = {}
    for name in EXAMPLES:
        torch.manual_seed(0)
        module = build(name)
        torch.manual_seed(0)
        out[name] = (module, audit(module, rebuilt=build(name)))
    return out
