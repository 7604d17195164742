"""Bounded sockets (issue 38): an idle client WebSocket is closed after its timeout (and its
upstream socket with it); the upstream sockets client WebSockets hold are a pool of their own, so
they never starve HTTP requests, with a clear refusal when full. The real proxy, the strict
Responses fake on loopback, aiohttp and openai clients."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

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


@pytest.fixture
async def deaf():
    """An upstream that takes the socket and never reads from it (until the test ends)."""
    done = asyncio.Event()

    async def handle(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await done.wait()
        return ws

    app = web.Application()
    app.router.add_get("/v1/responses", handle)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    server.base_url, server.done = f"http://127.0.0.1:{server.port}/v1", done
    yield server
    done.set()
    await server.close()


async def test_read_ahead_is_bounded_in_decoded_bytes(deaf, make_proxy):
    """1 MiB messages that deflate to a few KiB on the wire, to an upstream that reads nothing: the
    proxy reads ahead at most its bound (4 MiB here: three of them), then stops reading the client."""
    proxy = await make_proxy(deaf.base_url, {"responses": {"websocket_read_ahead_mb": 4}})
    message = json.dumps({"type": "response.create", "model": MODEL, "input": "x" * (1 << 20)})
    read_ahead = proxy.state.sockets.read_ahead
    async with bounded() as s:
        ws = await s.ws_connect(ws_url(proxy), headers=auth("sk-deflate"), compress=15)

        async def flood() -> None:
            for _ in range(24):
                await ws.send_str(message)

        sending = asyncio.create_task(flood())
        try:
            # The sender is stuck writing to the deaf upstream; three messages fill the bound.
            await until(lambda: read_ahead.held >= 3 << 20, "the read-ahead to fill")
            for _ in range(50):  # the client's frames keep arriving; none is read past the bound
                await asyncio.sleep(0)
            assert 3 << 20 <= read_ahead.peak <= 4 << 20
        finally:
            sending.cancel()
            deaf.done.set()
            await ws.close()
    await until(lambda: read_ahead.held == 0, "the socket's read-ahead to be let go")


async def test_a_chain_past_the_body_limit_is_dropped_and_its_turns_go_as_they_came(fake, make_proxy):
    """A chained session whose history grows past the body limit (1 MiB here, 300 KB a turn): the
    proxy drops the chain (no more held for it) and forwards the next chained turn as the client sent
    it; the upstream, which holds the history, answers it: the conversation goes on."""
    from test_responses_socket_chain import Socket

    proxy = await make_proxy(fake.base_url, {"server": {"max_body_mb": 1}})
    async with Socket(proxy) as socket:
        previous = None
        for n in range(4):
            events = await socket.turn(input=[{"role": "user", "content": f"part {n}: " + "y" * 300_000}],
                                       **({"previous_response_id": previous} if previous else {}))
            assert events[-1].type == "response.completed"
            previous = events[-1].response.id
        assert proxy.state.sockets.chains_dropped == 1
        events = await socket.turn(input=[{"role": "user", "content": "and now?"}], previous_response_id=previous)
        assert events[-1].type == "response.completed"
    last = [r for r in fake.requests if r.transport == "websocket"][-1]
    assert last.json["previous_response_id"] == previous
    assert last.json["input"] == [{"role": "user", "content": "and now?"}]


async def test_a_turn_being_compacted_is_not_idle(fake, make_proxy):
    """The socket's turn waits on a slow summary (three idle timeouts long) before it goes
    upstream: no message passes either way meanwhile, yet the socket is not idle."""
    from support.compaction_helpers import filler, main_summary
    from test_responses_socket_chain import Socket

    fake.summarizer, fake.summarizer_delay_s = main_summary("slow"), 1.5
    proxy = await make_proxy(fake.base_url, {"models": {MODEL: {"context_window": 6000}},
                                             "compaction": {"prepare_percent": 0},
                                             "responses": {"websocket_idle_timeout_s": 0.5}})
    history = [{"type": "message", "role": "user" if t % 2 == 0 else "assistant",
                "content": f"part {t}: " + filler(300, t)} for t in range(16)]
    async with Socket(proxy) as socket:
        events = await socket.turn(input=[*history, {"role": "user", "content": "go on"}])
        assert events is not None, "the socket was closed while its turn was being compacted"
        assert events[-1].type == "response.completed", events[-1]
        assert events[0].response.metadata["x-compaction-status"] == "summarized"
