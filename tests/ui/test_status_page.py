"""The status page in a real headless Chromium, live against a real proxy and simulators.

Skips when Chromium is not installed (Debian: ``apt-get install chromium``); Playwright
drives the system Chromium and never downloads a browser of its own.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import pytest

from tests.ui.conftest import TOKEN, converse, settled

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"
)
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT = Path(__file__).resolve().parents[2] / "reports" / "ui-status.png"
HOSTILE_ID = '<img src=x onerror="document.title=1">'
WAIT_MS = 20_000


async def test_page_shows_the_fleet_live_and_a_dead_replica_turns_unhealthy(proxy, fleet) -> None:
    playwright = pytest.importorskip(
        "playwright.async_api", reason="playwright is not installed (the dev extra)"
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        await settled(http, proxy.url)
        assert await converse(proxy.url) == 24
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        headers = {"X-Request-ID": HOSTILE_ID}
        async with http.post(proxy.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200

    async with playwright.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1440, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            await page.goto(f"{proxy.url}/ui?token={TOKEN}")
            # The token leaves the address bar; the polls carry it as a header.
            assert "token=" not in page.url

            await page.wait_for_function(
                "document.querySelectorAll('#backends tr[data-state=healthy]').length === 3",
                timeout=WAIT_MS,
            )
            decisions = page.locator("#decisions tr[data-request]")
            await decisions.first.wait_for(timeout=WAIT_MS)
            assert await decisions.count() >= 1
            assert await page.locator("#c-healthy").inner_text() == "3 / 3"
            assert (await page.locator("#c-p50").inner_text()).endswith("s")
            assert await page.locator("#reasons .name").count() >= 1

            # A client-chosen request id is shown as text, never parsed as markup.
            hostile = page.locator("#decisions tr[data-request]").filter(has_text="<img src=x")
            assert await hostile.count() == 1
            assert await page.locator("#decisions img").count() == 0
            assert await page.title() == "prefix-proxy status"

            victim = fleet.replicas[2]
            victim.stop()
            dead_row = page.locator(f'#backends tr[data-backend="{victim.url}"]')
            await page.wait_for_selector(
                f'#backends tr[data-backend="{victim.url}"][data-state="unhealthy"]',
                timeout=WAIT_MS,
            )
            assert await dead_row.locator(".pill").inner_text() == "unhealthy"
            await page.wait_for_function(
                "document.getElementById('c-healthy').textContent === '2 / 3'", timeout=WAIT_MS
            )
            others = page.locator('#backends tr[data-state="healthy"]')
            assert await others.count() == 2

            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(SCREENSHOT), full_page=True)
            assert errors == []
        finally:
            await browser.close()
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
