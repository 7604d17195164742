"""/metrics (design.md § The operator's view): Prometheus text format, parsed with prometheus_client's own parser after a
replay that summarizes a tool result, compacts the history and reuses the summary; the counters
must agree with what the client saw in the x-compaction-* headers and with what the fake upstream
recorded (summarizer calls, its usage reports)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.fakes.common import FakeError
from support.client import auth, get, openai_client, post, raw_chat
from support.loopback import serving
from support.ops_replay import KEY, MODEL, SETTINGS, conversation, replay, request_points
from support.proxy_server import merge
from support.waiting import DEADLINE_S

ROUTE = "/v1/chat/completions"


async def scrape(proxy: Any, headers: dict[str, str] | None = None) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of the proxy's /metrics."""
    answer = await get(proxy.root, "/metrics", headers)
    text = answer.body.decode()
    assert answer.status == 200, text
    assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum over every series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


async def test_counters_agree_with_the_headers_the_client_received(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, SETTINGS)
    answers = await replay(proxy.base_url, request_points(conversation()))
    statuses = Counter(a.headers["x-compaction-status"] for a in answers)
    assert statuses["summarized"] == 1 and statuses["reused"] >= 2 and statuses["none"] >= 5  # the replay compacts
    m = await scrape(proxy)

    for status, n in statuses.items():
        assert value(m, "compaction_proxy_requests_total", route=ROUTE, protocol="chat_completions", code="200",
                     compaction=status) == n
    assert value(m, "compaction_proxy_tokens_received_total", protocol="chat_completions") == sum(
        int(a.headers["x-compaction-tokens-before"]) for a in answers)
    assert value(m, "compaction_proxy_tokens_forwarded_total", protocol="chat_completions") == sum(
        int(a.headers["x-compaction-tokens-after"]) for a in answers)
    notes = sum(int(a.headers["x-compaction-tool-results"]) for a in answers)
    assert notes == len(answers)  # the tool result is a note in every request
    assert value(m, "compaction_proxy_tool_result_notes_total", protocol="chat_completions") == notes
    assert value(m, "compaction_proxy_compactions_total", tier="summarized") == 1

    # x-compaction-wait-ms as a histogram in seconds: one observation per request, same total.
    assert value(m, "compaction_proxy_compaction_wait_seconds_count", protocol="chat_completions") == len(answers)
    waited = sum(int(a.headers["x-compaction-wait-ms"]) for a in answers) / 1000
    assert value(m, "compaction_proxy_compaction_wait_seconds_sum", protocol="chat_completions") == pytest.approx(waited)
    assert waited > 0

    # Summarizer calls by kind, as the fake upstream counted them.
    assert value(m, "compaction_proxy_summarizer_calls_total", kind="history") == len(upstream.history_summarizer_requests) > 0
    assert value(m, "compaction_proxy_summarizer_calls_total", kind="tool_result") == len(upstream.tool_summarizer_requests) == 1
    assert value(m, "compaction_proxy_summarizer_duration_seconds_count", kind="history") == len(upstream.history_summarizer_requests)
    assert total(m, "compaction_proxy_summarizer_failures_total") == 0

    # The upstream's own usage, streamed answers included, as the client received it.
    chat = [r for r in upstream.records() if r.kind == "chat"]
    for kind, key in (("prompt", "prompt_tokens"), ("completion", "completion_tokens")):
        assert value(m, "compaction_proxy_upstream_tokens_total", protocol="chat_completions", kind=kind) == sum(
            a.usage[key] for a in answers)
    cached = sum(a.usage["prompt_tokens_details"]["cached_tokens"] for a in answers)
    assert cached == sum(r.cached_tokens for r in chat) > 0
    assert value(m, "compaction_proxy_upstream_tokens_total", protocol="chat_completions", kind="cached") == cached

    # Upstream timings: one observation per forwarded request.
    for name in ("compaction_proxy_upstream_ttfb_seconds_count", "compaction_proxy_upstream_duration_seconds_count"):
        assert value(m, name, protocol="chat_completions") == len(answers)
    assert value(m, "compaction_proxy_request_duration_seconds_count", route=ROUTE, protocol="chat_completions") == len(answers)
    # Nothing is left in flight but the scrape itself; every stream was closed.
    assert value(m, "compaction_proxy_requests_in_flight") == 1
    assert value(m, "compaction_proxy_streams_open") == 0
    assert value(m, "compaction_proxy_store_up") == 1 and value(m, "compaction_proxy_store_errors_total") == 0


async def test_upstream_errors_and_pass_through_are_counted_by_route_and_code(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, SETTINGS)
    upstream.reply = FakeError.openai(429, "slow down", "rate_limit_exceeded")
    await raw_chat(proxy, [{"role": "user", "content": "hi"}], auth(KEY), model=MODEL, expect=429)
    await post(proxy, b"{not json", expect=400)
    assert (await get(proxy, "/models")).status == 200
    assert (await get(proxy.root, "/nowhere")).status == 404
    m = await scrape(proxy)
    assert value(m, "compaction_proxy_requests_total", route=ROUTE, protocol="chat_completions", code="429",
                 compaction="none") == 1
    # A body the proxy refused never reached compaction: no status of its own.
    assert value(m, "compaction_proxy_requests_total", route=ROUTE, protocol="chat_completions", code="400",
                 compaction="") == 1
    assert value(m, "compaction_proxy_requests_total", route="/v1/{tail}", protocol="none", code="200",
                 compaction="") == 1
    # Unknown paths share one label: clients cannot grow the number of series.
    assert value(m, "compaction_proxy_requests_total", route="unmatched", protocol="none", code="404",
                 compaction="") == 1


async def test_summarizer_failures_by_reason_and_the_breaker_state(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {"tool_results": {"breaker_failures": 2}}))
    upstream.summarizer = FakeError.openai(500, "summarizer down", "server_error")
    convs = [conversation(f"fail{i}")[:4] for i in range(3)]  # a different tool output each
    for msgs in convs:
        answers = await replay(proxy.base_url, [msgs])
        assert answers[0].headers["x-compaction-tool-results"] == "0"
    m = await scrape(proxy)
    # Two failures opened the breaker; the third result was not sent to the summarizer at all.
    assert len(upstream.tool_summarizer_requests) == 2
    assert value(m, "compaction_proxy_summarizer_failures_total", kind="tool_result", reason="http") == 2
    assert value(m, "compaction_proxy_summarizer_breaker_state", model=MODEL, state="open") == 1
    assert value(m, "compaction_proxy_summarizer_breaker_state", model=MODEL, state="closed") == 0


async def test_a_store_outage_shows_as_store_up_0_and_errors(upstream, make_proxy, tmp_path: Path):
    (tmp_path / "a-file").write_bytes(b"")  # where the store's directory must go: fails even as root
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {"store": {"url": f"sqlite:///{tmp_path}/a-file/s.db"}}))
    await replay(proxy.base_url, request_points(conversation())[:2])
    m = await scrape(proxy)
    assert value(m, "compaction_proxy_store_up") == 0
    assert value(m, "compaction_proxy_store_errors_total") >= 1


async def test_two_apps_in_one_process_count_apart(upstream, make_proxy):
    a = await make_proxy(upstream.base_url, SETTINGS)
    b = await make_proxy(upstream.base_url, SETTINGS)
    await replay(a.base_url, request_points(conversation("a"))[:3])
    await replay(b.base_url, request_points(conversation("b"))[:1])
    count = lambda m: total(m, "compaction_proxy_requests_total", route=ROUTE)  # noqa: E731
    assert count(await scrape(a)) == 3
    assert count(await scrape(b)) == 1


async def test_metrics_can_be_turned_off(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, merge(SETTINGS, {"metrics": {"enabled": False}}))
    answers = await replay(proxy.base_url, request_points(conversation())[:2])
    assert answers[0].headers["x-compaction-status"] == "none"
    assert proxy.state.metrics is None
    assert (await get(proxy.root, "/metrics")).status == 404


async def test_the_compaction_engine_counters_are_exported(upstream, make_proxy):
    """Masks, summaries and digests the engine made, identifiers left for recall and cached-call
    fallbacks: each series equals the engine's own tally, and each moved in this replay."""

    from proxy.ops.metrics import ENGINE_TIERS
    from support.careless import CarelessSummarizer
    from proxy.fakes.chat.replies import content_text
    from proxy.prompts import Prompts
    from support.coding_session import coding_session

    s = coding_session(24)
    upstream.window = 12000
    careless = CarelessSummarizer()  # replies now and then: the cached call is asked again
    again = Prompts().text("compaction-cached-summary-again")
    refused = []

    def summarizer(body: dict[str, Any]) -> Any:
        if again in content_text(body["messages"][-1].get("content")) and not refused:
            refused.append(body)  # once, a reply to the firmer ask too: the call falls back to the transcript
            return "Sure! Running the tests again now."
        return careless(body)

    upstream.summarizer = summarizer
    proxy = await make_proxy(upstream.base_url, {
        "models": {"gpt-4": {"context_window": 12000}},
        "compaction": {"prepare_percent": 0, "cached_summary_call": True, "identifiers_share": 0.02}})
    points = s.request_points()
    async with openai_client(proxy, KEY) as client:
        for k, history in enumerate(points):
            if k == 2 * len(points) // 3:  # the summarizer goes down: the floor (digests) from here
                upstream.fault_target, upstream.fail_status = "summarizer", 500
            await client.chat.completions.create(model="gpt-4", messages=history, tools=s.tools)
    stats = proxy.state.compaction.stats
    m = await scrape(proxy)
    for tier, key in ENGINE_TIERS:
        assert stats[key] >= 1, key
        assert value(m, "compaction_proxy_engine_compactions_total", tier=tier) == stats[key], tier
    assert stats["identifiers_to_recall"] >= 1 and stats["cached_call_fallbacks"] >= 1 and stats["cached_call_retries"] >= 1
    assert value(m, "compaction_proxy_identifiers_to_recall_total") == stats["identifiers_to_recall"]
    assert value(m, "compaction_proxy_cached_summary_call_fallbacks_total") == stats["cached_call_fallbacks"]
    assert value(m, "compaction_proxy_cached_summary_call_retries_total") == stats["cached_call_retries"]


def test_a_tally_counts_as_prometheus_client_observes():
    """The request path's histograms are added up in a Tally and flushed into the series: the
    samples must be what observing each amount would have made, after one flush or several."""
    from prometheus_client import CollectorRegistry, Histogram

    from proxy.ops.metrics import LATENCY_BUCKETS, Tally

    amounts = (0.0, 0.005, 0.0051, 0.3, 300, 301, 1e9, *LATENCY_BUCKETS)
    samples = []
    for way in ("observe", "one flush", "flush each"):
        r = CollectorRegistry()
        h = Histogram("h", "h", ["x"], buckets=LATENCY_BUCKETS, registry=r).labels("a")
        tally = Tally(h)
        for v in amounts:
            if way == "observe":
                h.observe(v)
            else:
                tally.add(v)
                if way == "flush each":
                    tally.flush()
        tally.flush()
        samples.append([(s.name, s.labels, s.value) for f in r.collect() for s in f.samples if not s.name.endswith("_created")])
    assert samples[0] == samples[1] == samples[2]
    assert any(s[2] for s in samples[0])


async def test_a_stream_is_counted_open_while_it_is_relayed(upstream, make_proxy):
    """streams_open is a plain count until the metrics are read (no gauge lock on a stream's
    first-event path): a scrape during a relayed stream shows it, one after it ended does not."""
    proxy = await make_proxy(upstream.base_url, SETTINGS)
    upstream.release_last_chunk = asyncio.Event()
    body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True})
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy.base_url + "/chat/completions", data=body, headers=auth(KEY)) as r:
            await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
            assert value(await scrape(proxy), "compaction_proxy_streams_open") == 1
            upstream.release_last_chunk.set()
            await asyncio.wait_for(r.read(), 10)
    deadline = time.monotonic() + DEADLINE_S  # the handler's end follows the last byte the client read
    while value(await scrape(proxy), "compaction_proxy_streams_open") != 0:
        assert time.monotonic() < deadline, "the stream still counted open"
        await asyncio.sleep(0.01)


async def test_an_upstreams_own_compaction_headers_never_become_label_values(make_proxy):
    """An upstream that answers every request with an x-compaction-status (and figures) of its own,
    300 distinct values: the pass-through answers relay them to the client as they came, the chat
    route's answers carry ours, and /metrics has only the proxy's own statuses as label values."""
    seen = itertools.count()

    def theirs() -> dict[str, str]:
        return {"x-compaction-status": f"upstream-{next(seen)}", "x-compaction-tokens-before": "999999",
                "x-compaction-tokens-after": "1", "x-compaction-tool-results": "7"}

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []}, headers=theirs())

    async def completions(_: web.Request) -> web.Response:
        return web.json_response({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}, headers=theirs())

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", completions)
    async with serving(app) as base:
        proxy = await make_proxy(base + "/v1", SETTINGS)
        for i in range(290):
            answer = await get(proxy, "/models")
            assert answer.status == 200 and answer.headers["x-compaction-status"] == f"upstream-{i}"
        for _ in range(10):
            answer = await raw_chat(proxy, [{"role": "user", "content": "hi"}], auth(KEY), model=MODEL)
            assert answer.headers["x-compaction-status"] == "none"
        m = await scrape(proxy)
    labels = {dict(ls).get("compaction") for (n, ls) in m if n == "compaction_proxy_requests_total"}
    assert labels == {"", "none"}
    assert value(m, "compaction_proxy_requests_total", route="/v1/{tail}", protocol="none", code="200",
                 compaction="") == 290
    # the upstream's figures are not counted as the proxy's (only the chat answers' own are)
    assert total(m, "compaction_proxy_tokens_received_total") < 999999
