"""The shared fault flags (proxy/fakes/faults.py) behave the same on every fake: one suite,
parametrized over the three protocols, with raw HTTP so the broken answers can be seen as sent."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from proxy.fakes.chat import FakeUpstream
from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses

REPLY = "one two three four five six seven eight"
PROTOCOLS = {
    "chat": (FakeUpstream, "/v1/chat/completions", {},
             lambda stream: {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "stream": stream}),
    "responses": (FakeResponses, "/v1/responses", {},
                  lambda stream: {"model": "gpt-5", "input": "hi", "stream": stream}),
    "messages": (FakeMessages, "/v1/messages", {"x-api-key": "k", "anthropic-version": "2023-06-01"},
                 lambda stream: {"model": "claude-sonnet-4-6", "max_tokens": 100,
                                 "messages": [{"role": "user", "content": "hi"}], "stream": stream}),
}


@pytest.fixture(params=sorted(PROTOCOLS))
async def proto(request):
    cls, path, headers, make = PROTOCOLS[request.param]
    async with cls(reply=REPLY) as fake:
        yield fake, fake.origin + path, headers, make


async def fetch(url, headers, body, timeout=5.0):
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        async with s.post(url, json=body, headers=headers) as r:
            return r.status, await r.read()


def sse_payloads(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]


async def test_clean_stream_is_all_json(proto):
    fake, url, headers, make = proto
    status, raw = await fetch(url, headers, make(True))
    assert status == 200
    for p in sse_payloads(raw):
        if p != "[DONE]":
            json.loads(p)


async def test_broken_sse_sends_an_event_that_is_not_json(proto):
    fake, url, headers, make = proto
    fake.broken_sse = True
    status, raw = await fetch(url, headers, make(True))
    last = sse_payloads(raw)[-1]
    with pytest.raises(json.JSONDecodeError):
        json.loads(last)
    assert fake.requests[-1].faulted


async def test_malformed_json_body(proto):
    fake, url, headers, make = proto
    fake.malformed_json = True
    status, raw = await fetch(url, headers, make(False))
    assert status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)


async def test_reset_mid_response(proto):
    fake, url, headers, make = proto
    fake.reset_mid_response = True
    for stream in (False, True):
        with pytest.raises(aiohttp.ClientPayloadError):
            await fetch(url, headers, make(stream))
    assert fake.disconnects == 0  # the fake's own reset is not a client disconnect


async def test_stall_before_headers(proto):
    fake, url, headers, make = proto
    fake.stall_before_headers_s = 5
    with pytest.raises(asyncio.TimeoutError):
        await fetch(url, headers, make(False), timeout=0.3)


async def test_fail_status_then_recovery(proto):
    fake, url, headers, make = proto
    fake.fail_status, fake.fault_times, fake.retry_after = 503, 1, 2
    status, raw = await fetch(url, headers, make(False))
    assert status == 503 and "error" in json.loads(raw)
    status, _ = await fetch(url, headers, make(False))
    assert status == 200 and [r.faulted for r in fake.requests] == [True, False]


async def test_release_last_chunk_parks_the_stream(proto):
    fake, url, headers, make = proto
    fake.release_last_chunk = asyncio.Event()
    task = asyncio.create_task(fetch(url, headers, make(True)))
    await asyncio.wait_for(fake.last_chunk_waiting.wait(), 5)
    assert not task.done()
    fake.release_last_chunk.set()
    status, raw = await task
    assert status == 200 and sse_payloads(raw)


async def test_fault_target_summarizer_spares_the_agent(proto):
    fake, url, headers, make = proto
    fake.fail_status, fake.fault_target = 500, "summarizer"
    status, _ = await fetch(url, headers, make(False))
    assert status == 200 and not fake.requests[-1].faulted
