"""Memory under upstream events that never end (issue 19 item 10): 16 streams whose upstream sends
`data: {"...` and then megabytes without an event end. Each stream holds at most one event's
bound (sse.MAX_EVENT_BYTES), then ends with an `error` event, and the proxy process's RSS
stays bounded. Before the bound was lowered from 16 MiB (and the pending event copied on every
chunk), 16 such streams pushed RSS from 169 to 484 MB.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.sse import MAX_EVENT_BYTES
from support.replicas import Replica

STREAMS = 16
RSS_BOUND_MB = 64  # growth allowed over the idle process: 16 bounded events plus buffers


class EndlessEvents:
    """An upstream whose chat completion stream starts an event and never ends it."""

    def __init__(self) -> None:
        self.port = 0
        self.sent = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()

    async def chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"id": "chatcmpl-1", "choices": [{"delta": {"content": "')
        chunk = b"a" * 65536
        try:
            for _ in range(2000):  # 128 MiB at most per stream
                await resp.write(chunk)
                self.sent += len(chunk)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            pass
        return resp

    def __enter__(self) -> "EndlessEvents":
        def run() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self.chat)
            runner = web.AppRunner(app)
            self._loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._runner = runner
            self._ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(runner.cleanup())

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def endless() -> Iterator[EndlessEvents]:
    with EndlessEvents() as e:
        yield e


async def test_endless_events_hold_at_most_one_bounded_event_per_stream(tmp_path, endless):
    replica = Replica(tmp_path, "mem", f"http://127.0.0.1:{endless.port}/v1", "memory://", {})
    replica.start()
    replica.wait_ready()
    assert replica.proc is not None
    try:
        idle = rss_mb(replica.proc.pid)
        peak = idle
        body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True})

        async def one(s: aiohttp.ClientSession) -> bytes:
            async with s.post(replica.base_url + "/chat/completions", data=body,
                              headers={"Authorization": "Bearer sk-test"}) as r:
                return await r.read()

        async def sample(stop: asyncio.Event) -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, rss_mb(replica.proc.pid))
                await asyncio.sleep(0.05)

        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(stop))
        async with aiohttp.ClientSession() as s:
            answers = await asyncio.wait_for(asyncio.gather(*(one(s) for _ in range(STREAMS))), 120)
        stop.set()
        await sampler
    finally:
        replica.stop()
    for a in answers:
        assert a.startswith(b"data: {") and b"bad_upstream_response" in a and len(a) < 4096, a[:200]
    assert endless.sent >= STREAMS * MAX_EVENT_BYTES  # the upstream did send more than the bound
    print(f"RSS idle {idle:.0f} MB, peak {peak:.0f} MB")
    assert peak - idle < RSS_BOUND_MB, (idle, peak)
