"""Playwright (sync API) driving headless Chromium from Debian's ``chromium`` package.

The browser (tests/conftest.py's ``browser``) is launched from /usr/bin/chromium, browser downloads being
impossible here (``make install`` installs the package when it is missing). Each test gets a ``Tab``
(tests/support/browser.py): a page whose console errors and uncaught exceptions are collected, and which
saves screenshots into test-artifacts/ (git-ignored) for people to look at.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.browser import Tab


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    record = Tab(page)
    page.on("console", lambda message: record.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: record.errors.append(f"uncaught: {error}"))
    yield record
    context.close()
