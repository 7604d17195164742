"""SSE relay: incremental, ended promptly when the upstream dies or stalls, and a client that goes
away closes the upstream request."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import openai
import orjson
import pytest

from proxy.app import create_app
from proxy.config import Config
from support.client import openai_client
from support.loopback import serving
from support.waiting import until

MSGS = [{"role": "user", "content": "Tell me a story"}]
STORY = "Once upon a time there was a proxy that never buffered a single stream chunk."


async def test_stream_is_incremental(upstream, client):
    """Everything before the final chunk reaches the client while the upstream still holds it back."""
    upstream.reply = STORY
    upstream.release_last_chunk = asyncio.Event()
    stream = await client.chat.completions.create(model="gpt-4o", messages=MSGS, stream=True)
    text = ""
    it = stream.__aiter__()
    while text != STORY:
        chunk = await asyncio.wait_for(it.__anext__(), 10)
        assert chunk.choices[0].finish_reason is None
        text += chunk.choices[0].delta.content or ""
    assert upstream.last_chunk_waiting.is_set() and not upstream.release_last_chunk.is_set()
    upstream.release_last_chunk.set()
    rest = [c async for c in it]
    assert rest[-1].choices[0].finish_reason == "stop"


async def test_stream_first_chunk_arrives_before_last_is_sent_raw(upstream, proxy):
    """Same through plain HTTP: the first SSE event is readable while the upstream is parked."""
    upstream.release_last_chunk = asyncio.Event()
    body = orjson.dumps({"model": "gpt-4o", "messages": MSGS, "stream": True})
    async with aiohttp.ClientSession() as s:
        async with s.post(proxy.base_url + "/chat/completions", data=body) as r:
            assert r.headers["x-compaction-status"] == "none"
            first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
            assert first.startswith(b"data: {") and b'"role":"assistant"' in first
            await asyncio.wait_for(upstream.last_chunk_waiting.wait(), 10)
            upstream.release_last_chunk.set()
            rest = await asyncio.wait_for(r.read(), 10)
    assert rest.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
async def test_upstream_dying_mid_response_ends_client_promptly(upstream, client, stream):
    upstream.reply = STORY * 5
    upstream.reset_mid_response = True
    upstream.fault_target = "chat"

    async def consume() -> None:
        if stream:
            s = await client.chat.completions.create(model="gpt-4o", messages=MSGS, stream=True)
            async for _ in s:
                pass
        else:
            await client.chat.completions.create(model="gpt-4o", messages=MSGS)

    with pytest.raises(openai.APIError) as exc:
        await asyncio.wait_for(consume(), 10)
    if not stream:
        assert isinstance(exc.value, openai.APIStatusError) and exc.value.status_code == 502
        assert exc.value.body["code"] == "bad_upstream_response"


async def test_upstream_stalling_mid_stream_hits_idle_timeout(upstream, make_proxy):
    p = await make_proxy(upstream.base_url, {"upstream": {"stream_idle_timeout_s": 0.5}})
    client = openai_client(p, "k")
    upstream.reply = STORY
    upstream.stall_mid_stream_s = 60
    upstream.fault_target = "chat"
    got = ""

    async def consume() -> None:
        nonlocal got
        s = await client.chat.completions.create(model="gpt-4o", messages=MSGS, stream=True)
        async for c in s:
            got += c.choices[0].delta.content or "" if c.choices else ""

    with pytest.raises(openai.APIError) as exc:
        await asyncio.wait_for(consume(), 15)
    assert "timed out" in exc.value.message
    assert got and STORY.startswith(got) and got != STORY


async def test_client_disconnect_mid_stream_closes_upstream(upstream, client):
    upstream.release_last_chunk = asyncio.Event()
    stream = await client.chat.completions.create(model="gpt-4o", messages=MSGS, stream=True)
    await asyncio.wait_for(stream.__aiter__().__anext__(), 10)
    await asyncio.wait_for(upstream.last_chunk_waiting.wait(), 10)
    await stream.close()
    await until(lambda: upstream.disconnects == 1, "the upstream to see the client leave")


async def test_client_disconnect_closes_upstream_under_any_runner(upstream):
    """The app itself asks for handler cancellation: embedded in a plain AppRunner (whose default
    would keep the handler parked on a silent upstream), a departed client still ends the upstream
    request."""
    upstream.release_last_chunk = asyncio.Event()
    cfg = Config.model_validate({"upstream": {"base_url": upstream.base_url}, "store": {"url": "memory://"}})
    async with serving(create_app(cfg), shutdown_timeout=2) as base:  # a regression must not hang
        body = orjson.dumps({"model": "gpt-4o", "messages": MSGS, "stream": True})
        async with aiohttp.ClientSession() as s:
            async with s.post(base + "/v1/chat/completions", data=body) as r:
                await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
                await asyncio.wait_for(upstream.last_chunk_waiting.wait(), 10)
        await until(lambda: upstream.disconnects == 1, "the upstream to see the client leave")


async def test_stream_after_done_client_close_is_clean(upstream, proxy, client, caplog):
    """The openai SDK closes right after `data: [DONE]`: a normal end, nothing logged as an error."""
    for _ in range(3):
        s = await client.chat.completions.create(model="gpt-4o", messages=MSGS, stream=True)
        async for _c in s:
            pass
    await asyncio.sleep(0.05)
    # Only the proxy's and aiohttp's server loggers: asyncio's own ERROR records (an unclosed
    # session garbage-collected from some earlier test) come at random times.
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(("proxy", "aiohttp"))]
    assert not errors, [r.getMessage() for r in errors]
    assert upstream.disconnects == 0
