import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import settings

from tests.support.browser import CHROMIUM

settings.register_profile("default", deadline=None, max_examples=40, derandomize=True)
settings.register_profile("thorough", deadline=None, max_examples=400)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium from Debian's ``chromium`` package, driven by Playwright's sync API (browser downloads are
    impossible here; ``make install`` installs the package when it is missing). One for the whole session: the
    sync API allows one Playwright at a time, and tests/browser and tests/notebook both open pages."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    if not CHROMIUM.is_file():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (make install installs it)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield chromium
        chromium.close()
