"""The one send layer (proxy/protocols/send.py) is the adapter's: what an overflow looks like, in an error
answer or in a stream's first events, is asked of the flow's adapter, and the relay checks the
adapter's events and reads its usage. A made-up protocol's adapter (a few overrides of the chat
one) behind a real aiohttp route, against a real upstream on loopback."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.protocols.chat.adapter import ChatAdapter
from proxy.sse import EventChecker
from proxy.exchange import EXCHANGE, Exchange, Usage
from proxy.protocols.send import Upstream, send
from support.loopback import serving

TOO_LONG = b"event: toy\ndata: {\"failed\": \"too long\"}\n\n"
OK = b"data: {\"say\": \"hi\", \"used\": 7}\n\ndata: [DONE]\n\n"


class Toy(ChatAdapter):
    """A made-up protocol: its upstream says "too long" in its stream's first event, or as a 409."""

    protocol = "toy"

    def is_overflow(self, status: int, body: bytes) -> bool:
        return b"too long" in body

    async def stream_preamble(self, upstream: Any, *, hold: bool = True) -> tuple[bytes, bool, None]:
        held = await upstream.content.readany()
        return held, held.startswith(b"event: toy"), None

    def stream_usage(self, checker: Any) -> Usage | None:
        return Usage(prompt=checker.seen_used, cached=0, completion=1)

    def event_checker(self) -> EventChecker:
        return Counting()


class Counting(EventChecker):
    seen_used = 0

    def feed(self, chunk: bytes) -> tuple[bytes, str | None]:
        if b'"used": 7' in chunk:
            self.seen_used = 7
        return super().feed(chunk)


@pytest.fixture
async def toy_upstream():
    """Answers by body: b"big" fails (in the stream, or as 400 when the body says so), anything else streams OK."""
    bodies: list[bytes] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        bodies.append(body)
        if body == b"big-400":
            return web.Response(status=400, body=b'{"error": "too long"}', content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(TOO_LONG if body.startswith(b"big") else OK)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/toy", handle)
    async with serving(app) as base:
        yield base, bodies


async def through_proxy(base: str, first: bytes, retries: list[int]) -> tuple[int, bytes, Exchange]:
    """A route that sends `first` with the toy adapter; its retry sends b"small" (and counts)."""
    seen: dict[str, Exchange] = {}

    async def route(request: web.Request) -> web.StreamResponse:
        request[EXCHANGE] = seen["ex"] = Exchange("r", "POST", "/", "toy", "toy")

        async def retry() -> tuple[bytes, dict[str, str]]:
            retries.append(1)
            return b"small", {"x-compaction-status": "summarized"}

        async with aiohttp.ClientSession() as http:
            up = Upstream(URL(base + "/toy"), CIMultiDict(), aiohttp.ClientTimeout(total=10))
            return await send(request, http, Toy(), up, first, {"x-compaction-status": "none"}, retry=retry)

    app = web.Application()
    app.router.add_post("/", route)
    async with serving(app) as proxy_base, aiohttp.ClientSession() as c:
        async with c.post(proxy_base + "/", data=b"x") as r:
            out = r.status, await r.read(), r.headers.get("x-compaction-status")
    return out[0], out[1] + b"|" + (out[2] or "").encode(), seen["ex"]


@pytest.mark.parametrize("first", [b"big", b"big-400"], ids=["in-the-stream", "error-answer"])
async def test_the_adapter_says_what_an_overflow_is_and_the_layer_retries_once(toy_upstream, first):
    base, bodies = toy_upstream
    retries: list[int] = []
    status, body, ex = await through_proxy(base, first, retries)
    assert status == 200 and body == OK + b"|summarized"  # the stream the retry got, with its headers
    assert bodies == [first, b"small"] and retries == [1]
    assert ex.usage is not None and ex.usage.prompt == 7  # the adapter's checker and usage read the relay


async def test_what_the_adapter_does_not_call_an_overflow_is_relayed_as_it_came(toy_upstream):
    base, bodies = toy_upstream
    retries: list[int] = []
    status, body, _ = await through_proxy(base, b"fine", retries)
    assert (status, body) == (200, OK + b"|none") and retries == [] and bodies == [b"fine"]


class Parsed(ChatAdapter):
    """Counts how the usage of a whole answer is read: from the relay's parse, or from the bytes."""

    def __init__(self) -> None:
        self.parsed: list[Any] = []
        self.bytes_read = 0

    def answer_usage(self, answer: Any) -> Usage | None:
        self.parsed.append(answer)
        return super().answer_usage(answer)

    def usage(self, answer: bytes) -> Usage | None:
        self.bytes_read += 1
        return super().usage(answer)


@pytest.mark.parametrize("answer, content_type, status", [
    (b'{"id": "c1", "usage": {"prompt_tokens": 5, "completion_tokens": 2}}', "application/json", 200),
    (b'{"id": "c1", "usage": {"prompt_tokens": 5, "completion_tokens": 2}}', "text/plain", 200),
    (b'{"error": {"message": "no"}}', "application/json", 429),
    (b'{"id": "c1", "usage": {"prompt_tokens": 5, ', "application/json", 200),
], ids=["json-200", "not-json-type", "error-status", "malformed"])
async def test_a_whole_answer_is_parsed_once_for_its_check_and_its_usage(answer, content_type, status):
    """The relay's JSON check parses a 200 JSON answer; its usage is read from that parse, never
    from the bytes again. What the check does not parse keeps the byte-reading path (a 200 of
    another type), or has no usage (an error, a malformed answer: the client gets a 502)."""

    async def upstream(request: web.Request) -> web.Response:
        return web.Response(status=status, body=answer, content_type=content_type)

    adapter = Parsed()
    seen: dict[str, Exchange] = {}

    async def route(request: web.Request) -> web.StreamResponse:
        request[EXCHANGE] = seen["ex"] = Exchange("r", "POST", "/", "toy", "toy")
        async with aiohttp.ClientSession() as http:
            up = Upstream(URL(base + "/up"), CIMultiDict(), aiohttp.ClientTimeout(total=10))
            return await send(request, http, adapter, up, b"{}", {"x-compaction-status": "none"})

    up_app, app = web.Application(), web.Application()
    up_app.router.add_post("/up", upstream)
    app.router.add_post("/", route)
    async with serving(up_app) as base, serving(app) as proxy_base, aiohttp.ClientSession() as c:
        async with c.post(proxy_base + "/", data=b"x") as r:
            got = r.status, await r.read()
    usage = seen["ex"].usage
    if content_type == "application/json" and status == 200 and got[0] == 200:
        assert adapter.parsed == [orjson.loads(answer)] and adapter.bytes_read == 0 and got == (200, answer)
        assert usage == Usage(prompt=5, cached=0, completion=2)
    elif content_type == "text/plain":
        assert adapter.parsed and adapter.bytes_read == 1 and usage == Usage(prompt=5, cached=0, completion=2)
    elif status == 429:
        assert got == (429, answer) and not adapter.parsed and adapter.bytes_read == 0 and usage is None
    else:
        assert got[0] == 502 and not adapter.parsed and adapter.bytes_read == 0 and usage is None


async def _resumptions_of_the_caller(events: int) -> tuple[int, bytes]:
    """How often the coroutine awaiting `send` resumes while a stream of `events` events (each its
    own read) is relayed; and what the client received."""
    stream = b"".join(b'data: {"n": %d}\n\n' % i for i in range(events)) + b"data: [DONE]\n\n"

    async def upstream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in stream.split(b"\n\n")[:-1]:
            await resp.write(event + b"\n\n")
            await asyncio.sleep(0.002)  # (each event a read of its own)
        await resp.write_eof()
        return resp

    up_app = web.Application()
    up_app.router.add_post("/toy", upstream)
    resumed = [0]

    async def route(request: web.Request) -> web.StreamResponse:
        request[EXCHANGE] = Exchange("r", "POST", "/", "toy", "toy")
        async with aiohttp.ClientSession() as http:
            up = Upstream(URL(base + "/toy"), CIMultiDict(), aiohttp.ClientTimeout(total=10))
            return await send(request, http, ChatAdapter(), up, b"{}", {})

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code is route.__code__:
            resumed[0] += 1

    app = web.Application()
    app.router.add_post("/", route)
    async with serving(up_app) as base, serving(app) as proxy_base, aiohttp.ClientSession() as c:
        sys.setprofile(profile)
        try:
            async with c.post(proxy_base + "/", data=b"x") as r:
                body = await r.read()
        finally:
            sys.setprofile(None)
    return resumed[0], body


async def test_a_streams_events_do_not_resume_the_coroutines_that_wait_for_its_relay():
    """Each event read resumes the relay alone (its own task), not every frame between aiohttp's
    handler task and the relay: the caller's coroutine resumes as often for 40 events as for 4."""
    few, body = await _resumptions_of_the_caller(4)
    many, body_many = await _resumptions_of_the_caller(40)
    assert body.count(b"data: ") == 5 and body_many.count(b"data: ") == 41  # (relayed whole)
    assert many == few
