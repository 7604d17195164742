"""/dashboard in a real browser (design.md § The operator's view): Debian's chromium driven by Playwright loads the page
after a replay that compacts, and must find the plots drawn, the latest compaction event with its
summary, and the figures equal to /metrics. A screenshot goes to test-artifacts/dashboard.png."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from support.client import get
from support.compaction_helpers import forwarded_summary
from support.ops_replay import MODEL, SETTINGS, conversation, replay, request_points
from support.proxy_server import merge

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))
INJECTED = '<img id="injected" src="x">'  # client text that reaches the summary: shown as text only


@pytest.fixture
async def browser():
    try:
        from playwright.async_api import async_playwright
    except ImportError:  # the test extra installs it
        async_playwright = None
    if async_playwright is None or not Path(CHROMIUM).exists():
        message = "Debian's chromium (apt-get install chromium) and the playwright package are needed"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so the browser test must not be skipped")
        pytest.skip(message)
    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        await b.close()


async def metrics_figures(proxy: Any) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = (await get(proxy.root, "/metrics")).body.decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if key == "compaction_proxy_requests_total" and sample.labels["protocol"] == "none":
                continue  # the page and its feed are admin requests: not counted on the page
            if key in ("compaction_proxy_compactions_total", "compaction_proxy_cost_usd_total"):
                key += ":" + next(iter(sample.labels.values()))
            out[key] = out.get(key, 0.0) + sample.value
    return out


async def until(page: Any, expression: str, timeout_s: float = 60.0) -> Any:
    """Poll a page expression (the page's CSP forbids the eval that wait_for_function uses)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await page.evaluate(expression)
        if value or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(0.1)


PIXELS = """(args) => {
  const [id, hex] = args;
  const want = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  let n = 0;
  for (const c of document.getElementById(id).querySelectorAll("canvas")) {
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] > 200 && Math.abs(d[i] - want[0]) < 24 && Math.abs(d[i + 1] - want[1]) < 24 && Math.abs(d[i + 2] - want[2]) < 24) n++;
    }
  }
  return n;
}"""


# (widest label of a plot's left axis, the room the axis has for labels), in CSS pixels
AXIS_ROOM = """(id) => {
  const u = window.dashboard.plots[id], axis = u.axes[1];
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = axis.font[0];
  const widest = Math.max(0, ...(axis._values || []).map((v) => ctx.measureText(String(v)).width)) / devicePixelRatio;
  return [widest, axis._size - axis.ticks.size - axis.gap];
}"""


async def test_the_dashboard_draws_the_replay(upstream, make_proxy, browser):
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {
        "billing": {"prices": {MODEL: {"input": 30, "cached_input": 15, "output": 60}}}}))
    msgs = conversation("dash")
    for m in msgs[5:]:
        if m["role"] == "user":
            m["content"] += " " + INJECTED  # the summary quotes the latest request verbatim
    answers = await replay(proxy.base_url, request_points(msgs))
    assert "summarized" in {a.headers["x-compaction-status"] for a in answers}
    await proxy.state.journal.flush()

    page = await browser.new_page(viewport={"width": 1400, "height": 1900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    outside: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(proxy.root) or r.url.startswith("data:") else outside.append(r.url))
    await page.goto(proxy.root + "/dashboard?refresh=1")
    assert await until(page, "() => window.dashboard && window.dashboard.state.updates >= 2"), errors
    assert await page.evaluate("() => window.dashboard.state.error") is None
    assert errors == [] and outside == []  # offline: nothing but the proxy itself

    # The figures on the page are the numbers /metrics shows.
    m = await metrics_figures(proxy)
    shown = {k: await page.text_content(f"#fig-{k}") for k in (
        "requests", "tokens_received", "tokens_forwarded", "tool_notes", "summarizer_calls", "compactions-summarized",
        "cost_direct", "cost_proxy")}
    number = lambda s: float(s.replace(",", "").replace("$", ""))  # noqa: E731
    assert number(shown["requests"]) == m["compaction_proxy_requests_total"] == len(answers)
    assert number(shown["tokens_received"]) == m["compaction_proxy_tokens_received_total"]
    assert number(shown["tokens_forwarded"]) == m["compaction_proxy_tokens_forwarded_total"]
    assert number(shown["tool_notes"]) == m["compaction_proxy_tool_result_notes_total"]
    assert number(shown["summarizer_calls"]) == m["compaction_proxy_summarizer_calls_total"]
    assert number(shown["compactions-summarized"]) == m["compaction_proxy_compactions_total:summarized"] == 1
    assert number(shown["cost_direct"]) == pytest.approx(m["compaction_proxy_cost_usd_total:direct"], abs=5e-5)
    assert number(shown["cost_proxy"]) == pytest.approx(m["compaction_proxy_cost_usd_total:proxy"], abs=5e-5)
    assert m["compaction_proxy_cost_usd_total:direct"] > 0

    # The plots are drawn: each one's lines in their colours on its canvas, from two points or more.
    colors = await page.evaluate("() => window.dashboard.COLORS")
    for plot, color in (("plot-tokens", "received"), ("plot-tokens", "forwarded"), ("plot-cost", "direct"),
                        ("plot-tiers", "summarized"), ("plot-latency", "latency"), ("plot-cache", "cache")):
        assert await page.evaluate(PIXELS, [plot, colors[color]]) > 10, (plot, color)
    assert await page.evaluate("() => window.dashboard.plots['plot-tokens'].data[0].length") >= 2

    # Every left axis is as wide as its longest label: none is clipped at the canvas's edge, also
    # with a busy proxy's counts (millions of tokens a sample).
    for plot in await page.evaluate("() => Object.keys(window.dashboard.plots)"):
        label, room = await page.evaluate(AXIS_ROOM, plot)
        assert 0 < label <= room, (plot, label, room)
    await page.evaluate("""() => { const u = window.dashboard.plots['plot-tokens'];
        u.setData([u.data[0], u.data[1].map((v, i) => 2e7 + i * 1e6), u.data[2].map((v, i) => 9e6 + i)]); }""")
    label, room = await page.evaluate(AXIS_ROOM, "plot-tokens")
    assert 0 < label <= room, ("plot-tokens at millions", label, room)

    # The latest compaction event, with its summary: the text the proxy forwarded, shown as text.
    compacted = next(r for r in upstream.chat_requests if any("<summary>" in str(m.get("content")) for m in r["messages"]))
    summary = forwarded_summary(compacted["messages"])
    assert INJECTED in summary
    first = page.locator("#events li").first
    assert "summarized" in await first.locator(".event-head").text_content()
    assert "cut: messages 2-" in await first.text_content()
    assert await first.locator("pre.summary-text").text_content() == summary
    assert await page.locator("#injected").count() == 0

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)  # (the tokens plot at millions)
    assert (ARTIFACTS / "dashboard.png").stat().st_size > 10_000


async def test_the_page_and_its_feed_need_the_token_when_one_is_set(upstream, make_proxy, browser):
    token = "adm-dashboard-token-123"
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {"admin": {"token": token}}))
    page = await browser.new_page()
    denied = await page.goto(proxy.root + "/dashboard")
    assert denied is not None and denied.status == 401
    allowed = await page.goto(proxy.root + f"/dashboard?token={token}&refresh=1")
    assert allowed is not None and allowed.status == 200
    assert await until(page, "() => window.dashboard && window.dashboard.state.updates >= 1")
    assert await page.evaluate("() => window.dashboard.state.error") is None  # the feed got the header
    # only the page takes the token from its URL
    assert (await get(proxy.root, f"/admin/api/dashboard?token={token}")).status == 401


async def test_the_dashboard_shows_observe_modes_savings_and_the_prefix_breaks(upstream, make_proxy, browser):
    """Observe mode's would-be savings, the prefix-break count (a client that rewrote an old
    message), and the journal's events marked observed, as /metrics and the journal have them."""
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {
        "mode": "observe", "billing": {"prices": {MODEL: {"input": 30, "cached_input": 15, "output": 60}}}}))
    points = request_points(conversation("observed"))
    for i in range(0, len(points), 2):  # a step of two: the observed stages catch up between requests
        await replay(proxy.base_url, points[i:i + 2])
        await proxy.state.watcher.idle()
    rewritten = [dict(m) for m in points[-1]]
    i = next(i for i, m in enumerate(rewritten) if i > 1 and m["role"] == "user")  # (not the first: it names the conversation)
    rewritten[i]["content"] += " (rewritten by the client)"
    await replay(proxy.base_url, [rewritten])
    await proxy.state.watcher.idle()
    await proxy.state.journal.flush()

    page = await browser.new_page(viewport={"width": 1400, "height": 1900})
    await page.goto(proxy.root + "/dashboard?refresh=1")
    assert await until(page, "() => window.dashboard && window.dashboard.state.updates >= 2")
    m = await metrics_figures(proxy)
    number = lambda s: float(s.replace(",", "").replace("$", ""))  # noqa: E731
    assert number(await page.text_content("#fig-prefix_breaks")) == m["compaction_proxy_prefix_breaks_total"] == 1
    saved = m["compaction_proxy_observed_tokens_saved_total"]
    assert saved > 0 and number(await page.text_content("#fig-observed_tokens_saved")) == saved
    assert number(await page.text_content("#fig-observed_cost_saved")) == pytest.approx(
        m["compaction_proxy_observed_cost_saved_usd_total"], abs=5e-5)
    heads = [await h.text_content() for h in await page.locator("#events .event-head").all()]
    assert any("prefix-break" in h for h in heads)
    assert any("summarized (observed)" in h for h in heads), heads
