"""The live page (overlay/web, served by overlay.net.admin) in a real browser.

Headless Chromium from Debian's packages (``chromium``, ``chromium-driver``;
``make test`` installs them) driven by selenium, against three real nodes in
this process with short slices and scheduling probability 1.  The page is
opened on node 1 — not the initializer — so what it shows of nodes 0 and 2
came through node 1's aggregation of their admin endpoints.  Checked: no
console errors, three nodes, the traffic counters and load levels move as
events flow, and a migration shows: the counter, the placement strip's
colours (channels owned by another node than the initializer) and a
migration line in the decisions feed.  A screenshot is written and its path
printed.

Selenium is blocking; every browser call runs in a thread, so the nodes in
this event loop keep serving meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pytest

from conftest import LOCAL
from overlay.testing import LoopbackCluster, Traffic

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a test dependency: pip install -e '.[test]'")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402

CHROMIUM: Final = shutil.which("chromium")
CHROMEDRIVER: Final = shutil.which("chromedriver")
# This machine's network is closed: nothing of Chromium's own may call out.
FLAGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1400,1500",
)
WAIT: Final = 30.0

pytestmark = [
    pytest.mark.timeout(110),
    pytest.mark.skipif(
        CHROMIUM is None or CHROMEDRIVER is None,
        reason="Chromium is not installed (make test installs Debian's chromium and chromium-driver; "
        "this machine could not: no root or no package registry)",
    ),
]


def _browser(profile: Path) -> Any:
    opts = Options()
    opts.binary_location = CHROMIUM  # type: ignore[assignment]
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager must not look for downloads
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


class Page:
    """The browser, called from threads."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def js(self, script: str) -> Any:
        return await self.call(self.driver.execute_script, script)

    async def until(self, script: str, what: str, timeout: float = WAIT) -> Any:
        """Poll a JS expression until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.js(f"return ({script});")
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for the page to show {what} ({script})")
            await asyncio.sleep(0.25)

    async def number(self, selector: str) -> float:
        text = await self.js(f"return document.querySelector({selector!r}).textContent;")
        return float(text.replace(",", "").split()[0])

    async def console_errors(self) -> list[dict[str, Any]]:
        logs = await self.call(self.driver.get_log, "browser")
        return [e for e in logs if e.get("level") == "SEVERE"]


async def test_live_page_shows_the_cluster_balancing(tmp_path: Path) -> None:
    async with LoopbackCluster(LOCAL, 3, admin=True, slice_seconds=0.4, probability=1.0) as cl:
        driver = await asyncio.to_thread(_browser, tmp_path / "profile")
        page = Page(driver)
        try:
            await page.call(driver.get, cl.url(1) + "/")
            # Three nodes, live, before any traffic: one channel, on the initializer.
            await page.until("document.querySelectorAll('#nodes .node').length === 3", "three nodes")
            await page.until("document.querySelector('#live').classList.contains('on')", "the live stream connected")
            assert await page.js("return document.querySelector('#served-by').textContent") == "1"
            owners = await page.js("return [...document.querySelectorAll('#placement rect')].map(r => r.dataset.owner)")
            assert owners and set(owners) == {"0"}, owners
            assert await page.number("#migrations") == 0
            assert await page.number("#events-in") == 0
            # Each node's client queues against its budget, and its slow consumers cut (net.clients rule 7).
            await page.until("document.querySelectorAll('#nodes .node .clients').length === 3", "client queues shown")
            text = await page.js("return document.querySelector('#nodes .node .clients').textContent")
            assert "clients 0 of 128 MiB" in text and "0 slow cut" in text, text

            traffic = await Traffic(cl, rate=1500).start()
            try:
                # Numbers move as traffic flows …
                first = await page.until(
                    "Number(document.querySelector('#events-in').textContent.replace(/,/g, '')) > 0", "events counted"
                )
                await page.until(
                    "[...document.querySelectorAll('#nodes .node')].some(n => Number(n.dataset.dc) > 0)",
                    "a load level above 0",
                )
                n1 = await page.number("#events-in")
                await page.until(
                    f"Number(document.querySelector('#events-in').textContent.replace(/,/g, '')) > {n1}",
                    f"events in growing past {n1} ({first})",
                )
                # … and a migration shows in the counter, the placement and the feed.
                await page.until("Number(document.querySelector('#migrations').textContent) > 0", "a migration counted")
                await page.until(
                    "[...document.querySelectorAll('#placement rect')].some(r => r.dataset.owner !== '0')",
                    "a channel placed on another node than the initializer",
                )
                await page.until(
                    "document.querySelectorAll('#feed li.migration').length > 0", "a migration in the feed"
                )
                await page.until(
                    "document.querySelectorAll('#channels tbody tr').length > 1", "the split channels listed"
                )
                # A few slices more, for the screenshot: the chart's line goes on past the migration.
                moved = await page.js(
                    "return Math.max(0, ...last.feed.filter(e => e.kind === 'migration').map(e => e.time))"
                )
                await page.until(
                    f"last.history.filter(p => p[0] > {moved}).length >= 3", "three slices charted after it"
                )
            finally:
                await traffic.stop()
            assert cl.stat("migrations") > 0
            states = await page.js("return [...document.querySelectorAll('#nodes .node')].map(n => n.dataset.state)")
            assert len(states) == 3 and all(states), states
            shot = tmp_path / "overlay-live-page.png"
            assert await page.call(driver.save_screenshot, str(shot))
            print(f"\nscreenshot of the live page: {shot}")
            errors = await page.console_errors()
            assert not errors, f"console errors on the page: {errors}"
        finally:
            await asyncio.to_thread(driver.quit)
