"""Redraw docs/dashboard.png: six conversations replayed through the proxy against the packaged
fake upstream (the operator's-view replay of the tests), then /dashboard in Debian's chromium.

    .venv/bin/python scripts/dashboard_screenshot.py
"""

import asyncio
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from playwright.async_api import async_playwright  # noqa: E402

from proxy.fakes.chat import FakeUpstream  # noqa: E402
from support.ops_replay import SETTINGS, conversation, replay, request_points  # noqa: E402
from support.proxy_server import merge, start_proxy  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


PRICE = {"input": 2.5, "cached_input": 1.25, "output": 10.0}  # gpt-4 has no built-in price


async def main() -> None:
    fake = await FakeUpstream().start()
    settings = merge(SETTINGS, {"admin": {"sample_interval_s": 1}, "billing": {"prices": {"gpt-4": PRICE}}})
    proxy = await start_proxy(fake.base_url, settings)
    try:
        for tag in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot"):
            points = request_points(conversation(tag, turns=22))
            for k in range(0, len(points), 3):  # three requests a second or so: points to plot
                await replay(proxy.base_url, points[k:k + 3], key=f"sk-{tag}")
                await asyncio.sleep(0.5)
        await proxy.state.journal.flush()
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = await browser.new_page(viewport={"width": 1400, "height": 1500})
            await page.goto(proxy.root + "/dashboard?refresh=1")
            for _ in range(100):
                if await page.evaluate("() => window.dashboard ? window.dashboard.state.updates : 0") >= 2:
                    break
                await asyncio.sleep(0.2)
            await page.screenshot(path=str(REPO / "docs" / "dashboard.png"))
            await browser.close()
    finally:
        await proxy.close()
        await fake.stop()

if __name__ == "__main__":
    asyncio.run(main())
