"""/dashboard and its JSON feed /admin/api/dashboard (design.md § The operator's view).

The page is one HTML response with its script, its style and uPlot inlined from package data (no
CDN, no second request that would need the admin token again), under a CSP that allows nothing
but that inline code (a nonce per response) and fetches to the proxy itself. Its figures are read
from the app's Prometheus registry, so they are the numbers /metrics shows; the plots are drawn
from points sampled every admin.sample_interval_s (and one more whenever the feed is read).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import deque
from functools import lru_cache
from importlib import resources
from typing import Any

from aiohttp import web

from proxy.ops.prices import PRICES_DATE

ASSETS = "proxy.dashboard"
TIERS = ("summarized", "masked", "degraded", "failed-open")
MIN_SAMPLE_GAP_S = 0.5  # a feed read adds a point unless the last one is this recent
EVENTS_SHOWN = 10


# A figure that is a metric's samples added up over their labels, or (a gauge) its latest value.
_SUMMED = {
    "compaction_proxy_tokens_received_total": "tokens_received",
    "compaction_proxy_tokens_forwarded_total": "tokens_forwarded",
    "compaction_proxy_tool_result_notes_total": "tool_notes",
    "compaction_proxy_summarizer_calls_total": "summarizer_calls",
    "compaction_proxy_summarizer_failures_total": "summarizer_failures",
    "compaction_proxy_summarizer_duration_seconds_sum": "summarizer_seconds",
    "compaction_proxy_store_errors_total": "store_errors",
    "compaction_proxy_prefix_breaks_total": "prefix_breaks",
    "compaction_proxy_observed_tokens_saved_total": "observed_tokens_saved",
    "compaction_proxy_observed_cost_saved_usd_total": "observed_cost_saved",
}
_LATEST = {
    "compaction_proxy_store_up": "store_up",
    "compaction_proxy_requests_in_flight": "in_flight",
    "compaction_proxy_streams_open": "streams_open",
}


def figures(metrics: Any) -> dict[str, Any]:
    """The dashboard's numbers, summed from the registry's samples (the same as /metrics)."""
    f: dict[str, Any] = {
        "requests": 0.0, "errors": 0.0, "tokens_received": 0.0, "tokens_forwarded": 0.0, "tool_notes": 0.0,
        "upstream_prompt": 0.0, "upstream_cached": 0.0, "summarizer_calls": 0.0, "summarizer_failures": 0.0,
        "summarizer_seconds": 0.0, "store_errors": 0.0, "store_up": 1.0, "cost_direct": 0.0, "cost_proxy": 0.0,
        "in_flight": 0.0, "streams_open": 0.0, "compactions": {t: 0.0 for t in TIERS},
        "prefix_breaks": 0.0, "observed_tokens_saved": 0.0, "observed_cost_saved": 0.0,
    }
    if metrics is None:
        return f
    for family in metrics.collect():
        for s in family.samples:
            name, labels, v = s.name, s.labels, s.value
            if name == "compaction_proxy_requests_total" and labels.get("protocol") != "none":
                f["requests"] += v
                if labels.get("code", "").startswith("5"):
                    f["errors"] += v
            elif name in _SUMMED:
                f[_SUMMED[name]] += v
            elif name in _LATEST:
                f[_LATEST[name]] = v
            elif name == "compaction_proxy_upstream_tokens_total" and labels.get("kind") in ("prompt", "cached"):
                f["upstream_" + labels["kind"]] += v
            elif name == "compaction_proxy_compactions_total":
                f["compactions"][labels["tier"]] = f["compactions"].get(labels["tier"], 0.0) + v
            elif name == "compaction_proxy_cost_usd_total":
                f["cost_" + labels["way"]] = v
    return f


class Series:
    """Points of the cumulative figures over time, bounded (admin.sample_points)."""

    def __init__(self, metrics: Any, interval_s: float, points: int, clock: Any = time.time) -> None:
        self.metrics = metrics
        self.interval_s = interval_s
        self.points: deque[dict[str, Any]] = deque(maxlen=points)
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> dict[str, Any]:
        f = figures(self.metrics)
        point = {k: v for k, v in f.items() if k != "compactions"}
        point.update({f"compactions_{t}": v for t, v in f["compactions"].items()})
        point["t"] = self.clock()
        self.points.append(point)
        return f

    def current(self) -> dict[str, Any]:
        """The figures now; a new point unless the last one is very recent."""
        if self.points and self.clock() - self.points[-1]["t"] < MIN_SAMPLE_GAP_S:
            return figures(self.metrics)
        return self.sample()

    def columns(self) -> dict[str, list[float]]:
        keys = list(self.points[0]) if self.points else []
        return {k: [p.get(k, 0.0) for p in self.points] for k in keys}

    def start(self) -> None:
        if self._task is None and self.metrics is not None:
            self.sample()
            self._task = asyncio.create_task(self._run(), name="dashboard-series")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.sample()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


@lru_cache(maxsize=None)
def asset(name: str) -> str:
    return resources.files(ASSETS).joinpath(name).read_text(encoding="utf-8")


def page(nonce: str) -> str:
    """The dashboard's HTML with its assets inlined (no request of its own reaches anything)."""
    css = asset("vendor/uPlot.min.css") + "\n" + asset("dashboard.css")
    js = asset("vendor/uPlot.iife.min.js") + "\n" + asset("dashboard.js")
    # The nonce goes in before the assets, which must not be searched for placeholders.
    head, rest = asset("index.html").replace("NONCE", nonce).split("/*STYLE*/", 1)
    middle, tail = rest.split("/*SCRIPT*/", 1)
    return head + css + middle + js.replace("</script", "<\\/script") + tail


async def dashboard_page(request: web.Request) -> web.Response:
    nonce = secrets.token_urlsafe(16)
    return web.Response(text=page(nonce), content_type="text/html", headers={
        "Content-Security-Policy": f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}' "
                                   "'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                                   "form-action 'none'; frame-ancestors 'none'",
        "Referrer-Policy": "no-referrer",  # the page URL may carry ?token=
        "Cache-Control": "no-store",
    })


async def feed(state: Any, series: Series) -> dict[str, Any]:
    state.hooks.settle()  # the requests that ended a moment ago are counted
    f = series.current()
    events = await state.journal.recent(EVENTS_SHOWN) if state.journal is not None else []
    return {
        "now": time.time(),
        "interval_s": series.interval_s,
        "metrics_enabled": state.metrics is not None,
        "figures": f,
        "series": series.columns(),
        "events": events,
        "bill": state.bill.report(20) if state.bill is not None else None,
        "prices_date": PRICES_DATE,
        "breakers": [{"model": m, "state": s} for m, s in state.tool_results.breaker_states()],
    }
