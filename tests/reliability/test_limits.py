"""Limits at their edges (issue 7 item 8): exactly at the limit passes, one over is refused or waits.

- server.max_body_mb: a body of exactly the limit is served, one byte more is a 413 (chat and
  pass-through routes, Content-Length and chunked uploads);
- server.max_header_kb: a header value of exactly the limit is served, one byte more is refused
  by the HTTP parser; the URL (path and query) likewise;
- compaction.max_concurrent_summaries: N summaries run at once, the N+1th waits for a slot;
- tool_results.concurrency: N notes are made at once (the bound itself is tested in
  test_tool_results_flow.py);
- compaction.prepare_queue: N jobs wait in the queue, the N+1th is dropped, never waited for
  (with a queue of 1 in test_prepared.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator

import orjson
import pytest

from support.client import auth, post, raw_http, status_of
from support.conversations import MODEL, WINDOW, send, synthetic

BOUND_S = 30
AUTH = {"Content-Type": "application/json", **auth("sk-test")}
LIMIT_MB = 0.05
LIMIT = int(LIMIT_MB * 1024 * 1024)  # 52428 bytes


def padded(body: dict[str, Any], size: int) -> bytes:
    """The body's JSON padded with trailing whitespace (still valid JSON) to exactly `size` bytes."""
    raw = orjson.dumps(body)
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


async def chunks(raw: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(raw), 8192):
        yield raw[i : i + 8192]


@pytest.mark.parametrize("path,body", [
    ("/chat/completions", {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 40_000}]}),
    ("/embeddings", {"model": "text-embedding-3-small", "input": "x" * 40_000}),
], ids=["chat", "passthrough"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_size_at_and_one_over_the_limit(upstream, make_proxy, path, body, chunked):
    proxy = await make_proxy(upstream.base_url, {"server": {"max_body_mb": LIMIT_MB}})
    exact, over = padded(body, LIMIT), padded(body, LIMIT + 1)
    status, _, _ = await post(proxy, chunks(exact) if chunked else exact, AUTH, path=path)
    assert status == 200
    assert upstream.requests[-1].body == exact  # forwarded whole
    forwarded = len(upstream.requests)
    status, _, answer = await post(proxy, chunks(over) if chunked else over, AUTH, path=path)
    assert status == 413 and orjson.loads(answer)["error"]["code"] == "request_too_large"
    assert len(upstream.requests) == forwarded


async def test_header_and_url_at_and_one_over_the_limit(upstream, make_proxy):
    """aiohttp's parser applies max_header_kb to each header's value (and name) and to the URL.
    /healthz answers from the proxy itself: the fake upstream's own (default) limits stay out of it."""
    kb = 16
    proxy = await make_proxy(upstream.base_url, {"server": {"max_header_kb": kb}})
    limit = kb * 1024

    def request(value_bytes: int = 1, url_bytes: int = len("/healthz")) -> bytes:
        url = b"/healthz" + (b"?" + b"q" * (url_bytes - len("/healthz") - 1) if url_bytes > len("/healthz") else b"")
        return (b"GET " + url + b" HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"v" * value_bytes
                + b"\r\nConnection: close\r\n\r\n")

    assert status_of(await raw_http(proxy.server.port, request(value_bytes=limit), until=b"\r\n")) == 200
    assert 400 <= status_of(await raw_http(proxy.server.port, request(value_bytes=limit + 1), until=b"\r\n")) < 500
    assert status_of(await raw_http(proxy.server.port, request(url_bytes=limit), until=b"\r\n")) == 200
    assert 400 <= status_of(await raw_http(proxy.server.port, request(url_bytes=limit + 1), until=b"\r\n")) < 500
    assert upstream.requests == []


async def test_max_concurrent_summaries_runs_n_at_once_and_queues_the_next(upstream, make_proxy, client_for):
    n = 2
    upstream.window = WINDOW
    proxy = await make_proxy(upstream.base_url, {
        "models": {MODEL: {"context_window": WINDOW}},
        "compaction": {"prepare_percent": 0, "max_concurrent_summaries": n},
        # each span in one summarizer call: the recall tool's room would make this window fold some
        "recall": {"enabled": False},
    })
    running = peak = 0
    n_running, release = asyncio.Event(), asyncio.Event()

    async def gated(body: dict[str, Any]) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == n:
            n_running.set()
        await release.wait()
        running -= 1
        return None  # the fake's default summary

    upstream.summarizer = gated
    c = client_for(proxy)
    # three conversations, each compacted with exactly one summarizer call
    turns = [asyncio.create_task(send(c, synthetic(f"limit {i}"))) for i in range(n + 1)]
    await asyncio.wait_for(n_running.wait(), BOUND_S)
    await asyncio.sleep(0.3)  # room for the third call to start, were the limit broken
    assert running == n and len(upstream.summarizer_requests) == n
    release.set()
    done = await asyncio.wait_for(asyncio.gather(*turns), BOUND_S)
    assert [t.status for t in done] == ["summarized"] * (n + 1)
    assert peak == n and len(upstream.summarizer_requests) == n + 1


async def test_tool_results_concurrency_runs_exactly_n_notes_at_once(upstream, make_proxy):
    n = 3
    # (one scope here: its own share, concurrency_per_scope, is raised to the global limit tested)
    proxy = await make_proxy(upstream.base_url, {"tool_results": {"threshold_tokens": 200, "concurrency": n,
                                                                  "concurrency_per_scope": n},
                                                 "compaction": {"prepare_percent": 0}})
    all_in, release = asyncio.Event(), asyncio.Event()
    running = 0

    async def gated(body: dict[str, Any]) -> None:
        nonlocal running
        running += 1
        if running == n:
            all_in.set()
        await release.wait()
        return None

    upstream.summarizer = gated
    ids = [f"call_{i}" for i in range(n)]
    msgs = [{"role": "user", "content": "Look everything up."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": i, "type": "function", "function": {"name": "lookup", "arguments": "{}"}} for i in ids]}]
    msgs += [{"role": "tool", "tool_call_id": i, "content": "\n".join(f"{i} row {k}: fine" for k in range(150))}
             for i in ids]
    task = asyncio.create_task(post(proxy, orjson.dumps({"model": "gpt-4", "messages": msgs}), AUTH))
    await asyncio.wait_for(all_in.wait(), BOUND_S)  # all n at once: none waits for another
    release.set()
    status, _, _ = await task
    assert status == 200 and running == n


async def test_prepare_queue_holds_n_jobs_and_drops_the_next(upstream, make_proxy, caplog, client_for):
    n = 2
    upstream.window = WINDOW
    release = asyncio.Event()

    async def held(body: dict[str, Any]) -> None:  # the one worker stays busy with the first job
        await release.wait()

    upstream.summarizer = held
    proxy = await make_proxy(upstream.base_url, {
        "models": {MODEL: {"context_window": WINDOW}},
        "compaction": {"prepare_percent": 80, "prepare_workers": 1, "prepare_queue": n},
    })
    caplog.set_level(logging.DEBUG, logger="proxy.compaction")
    c = client_for(proxy)

    async def past_80_percent(i: int) -> None:
        turn = await asyncio.wait_for(send(c, synthetic(f"queue {i}", turns=12)), BOUND_S)
        assert (turn.status, turn.wait_ms) == ("none", 0)  # queuing never makes a request wait

    await past_80_percent(0)
    await upstream.wait_for_requests(1, "summarizer")  # the worker took job 0
    for i in range(1, n + 1):
        await past_80_percent(i)
    assert not [r for r in caplog.records if "prepare queue full" in r.getMessage()]  # exactly at the limit
    await past_80_percent(n + 1)
    assert len([r for r in caplog.records if "prepare queue full" in r.getMessage()]) == 1
    # Once the worker is free it prepares what waited: the n queued jobs, not the dropped one.
    release.set()
    await asyncio.wait_for(proxy.state.compaction.idle(), BOUND_S)
    prepared = {i for i in range(n + 2)
                if any(f"trip queue {i}?" in r.body.decode() for r in upstream.records("summarizer"))}
    assert prepared == set(range(n + 1))
