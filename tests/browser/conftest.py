"""Playwright (sync API) driving headless Chromium from Debian's ``chromium`` package.

The browser (tests/conftest.py's ``browser``) is launched from /usr/bin/chromium, browser downloads being
impossible here (``make install`` installs the package when it is missing). Each test gets a ``Tab``: a page
whose console errors and uncaught exceptions are collected, and which saves screenshots
into test-artifacts/ (git-ignored) for people to look at.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@dataclass
class Tab:
    """A browser page with its console errors on record."""

    page: Any
    errors: list[str] = field(default_factory=list)

    def shot(self, name: str, selector: str | None = None) -> Path:
        """Save a screenshot as test-artifacts/<name>.png: of the element ``selector``, or of the whole page."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        if selector is None:
            self.page.screenshot(path=str(path), full_page=True)
        else:
            self.page.locator(selector).screenshot(path=str(path))
        return path

    def wait_ready(self, root: str = ".hv", **attributes: object) -> None:
        """Wait until the viewer ``root`` has rendered (``data-ready="1"``) with the given data attributes."""
        selector = root + "[data-ready='1']" + "".join(f"[data-{k}='{v}']" for k, v in attributes.items())
        self.page.wait_for_selector(selector, timeout=30_000)

    def assert_clean(self) -> None:
        """No console error and no uncaught exception so far."""
        assert self.errors == [], self.errors


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    record = Tab(page)
    page.on("console", lambda message: record.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: record.errors.append(f"uncaught: {error}"))
    yield record
    context.close()
