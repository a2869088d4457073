"""The browser fixtures of the web tests: a site served from the test's arena, a headless
Chromium (Debian's, `tests.support.browser.chromium`) and a fresh page at desktop size.

A module sets `CONSOLE_ERRORS = True` to fail its tests on any error the page logs (every
module fails on an uncaught error of the page's scripts); a module may define its own
`arena` (the tournament pages need a director and more bots)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, Page, ViewportSize

from tests.support.browser import Site, chromium, fresh_page, serving
from tests.support.gateway import Arena

DESKTOP: ViewportSize = {"width": 1280, "height": 860}
PHONE: ViewportSize = {"width": 390, "height": 844}


@pytest.fixture
async def site(arena: Arena) -> AsyncIterator[Site]:
    async with serving(arena) as served:
        yield served


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


@pytest.fixture
async def page(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    console_errors = getattr(request.module, "CONSOLE_ERRORS", False)
    async with fresh_page(browser, DESKTOP, console_errors=console_errors) as opened:
        yield opened
