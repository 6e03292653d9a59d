"""Playwright (sync API) driving headless Chromium from Debian's ``chromium`` package.

Browser downloads are impossible here, so the browser is launched from /usr/bin/chromium
(``make install`` installs the package when it is missing). Each test gets a ``Tab``
(tests/support/browser.py): a page whose console errors and uncaught exceptions are collected,
and which saves screenshots into test-artifacts/ (git-ignored) for people to look at.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import CHROMIUM, Tab


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (the test extra)")
    if not CHROMIUM.is_file():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (make install installs it)")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    record = Tab(page)
    page.on("console", lambda message: record.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: record.errors.append(f"uncaught: {error}"))
    yield record
    context.close()
