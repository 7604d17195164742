"""Bounded sockets (issue 38): an idle client WebSocket is closed after its timeout (and its
upstream socket with it); the upstream sockets client WebSockets hold are a pool of their own, so
they never starve HTTP requests, with a clear refusal when full. The real proxy, the strict
Responses fake on loopback, aiohttp and openai clients."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import WSMsgType

from proxy.fakes.responses import FakeResponses
from support.client import BOUND_S, auth, post
from support.waiting import until

MODEL = "gpt-5"


@pytest.fixture
async def fake():
    async with FakeResponses() as f:
        yield f


def bounded() -> aiohttp.ClientSession:
    """A client session whose handshakes are bounded (a hang fails the test)."""
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=BOUND_S))


def ws_url(proxy) -> str:
    return proxy.base_url.replace("http://", "ws://") + "/responses"


async def answered(ws) -> dict:
    await ws.send_str(json.dumps({"type": "response.create", "model": MODEL, "input": "hi", "store": False}))
    while True:
        msg = await asyncio.wait_for(ws.receive(), BOUND_S)  # (a receive timeout restarts at each pong)
        assert msg.type == WSMsgType.TEXT, msg
        ev = json.loads(msg.data)
        if ev["type"] in ("response.completed", "error"):
            return ev


async def test_an_idle_socket_is_closed_with_1001_and_frees_its_upstream_socket(fake, make_proxy):
    proxy = await make_proxy(fake.base_url, {"responses": {"websocket_idle_timeout_s": 0.5}})
    async with bounded() as s:
        # A client that pings (its keep-alive) but sends nothing is idle all the same.
        ws = await s.ws_connect(ws_url(proxy), headers=auth("sk-idle"), heartbeat=0.1)
        assert (await answered(ws))["type"] == "response.completed"
        assert fake.sockets_open == 1
        msg = await asyncio.wait_for(ws.receive(), BOUND_S)  # (a receive timeout restarts at each pong)
        assert msg.type == WSMsgType.CLOSE and ws.close_code == 1001 and msg.extra == "idle timeout"
        await until(lambda: fake.sockets_open == 0, "the upstream socket to close")
        assert proxy.state.sockets.open == 0


async def test_a_turn_under_way_is_not_idle(fake, make_proxy):
    fake.stall_before_headers_s, fake.fault_times = 1.5, 1  # the upstream thinks three timeouts long
    proxy = await make_proxy(fake.base_url, {"responses": {"websocket_idle_timeout_s": 0.5}})
    async with bounded() as s:
        async with s.ws_connect(ws_url(proxy), headers=auth("sk-slow")) as ws:
            assert (await answered(ws))["type"] == "response.completed"


async def test_sockets_hold_a_pool_of_their_own_and_one_more_is_refused(fake, make_proxy):
    """Two HTTP connections upstream at most, three sockets: every socket holds an upstream
    connection, yet HTTP requests are answered; a fourth socket gets a 503 at once."""
    proxy = await make_proxy(fake.base_url, {"upstream": {"max_connections": 2, "max_websockets": 3,
                                                          "connect_timeout_s": 3}})
    async with bounded() as s:
        sockets = [await s.ws_connect(ws_url(proxy), headers=auth("sk-pool")) for _ in range(3)]
        for ws in sockets:
            assert (await answered(ws))["type"] == "response.completed"
        assert fake.sockets_open == 3
        for n in range(4):
            body = {"model": MODEL, "input": f"over HTTP {n}", "store": False}
            answer = await post(proxy, body, auth("sk-pool"), path="/responses", expect=200)
            assert json.loads(answer.body)["status"] == "completed"
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await s.ws_connect(ws_url(proxy), headers=auth("sk-pool"))
        assert refused.value.status == 503
        for ws in sockets:
            await ws.close()
    await until(lambda: fake.sockets_open == 0, "the upstream sockets to close")
    assert proxy.state.sockets.open == 0
