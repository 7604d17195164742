"""WebSocket mode on /v1/responses through the proxy (issue 14 item 5, design.md § Responses API): one upstream
socket per client socket, events relayed in order, the handshake's refusal passed on, close codes
passed on both ways, a dead or broken upstream turned into an error event and a clean close, and
an overflow before any output retried with the route's compacted message."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from proxy.fakes.responses import FakeResponses
from proxy.protocols.responses.websocket import WsTurn, relay_websocket
from support.client import openai_client, post
from support.compaction_helpers import filler, main_summary
from support.waiting import until

MODEL = "gpt-5"


@pytest.fixture
async def fake():
    async with FakeResponses() as f:
        yield f


@pytest.fixture
async def proxy(fake, make_proxy):
    return await make_proxy(fake.base_url)


def ws_url(base_url: str) -> str:
    return base_url.replace("http://", "ws://") + "/responses"


async def turn(ws, event: dict) -> list[dict]:
    await ws.send_str(json.dumps(event))
    out = []
    while True:
        msg = await ws.receive()
        assert msg.type == WSMsgType.TEXT, msg
        out.append(json.loads(msg.data))
        if out[-1]["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            return out


async def test_openai_clients_websocket_through_the_proxy(fake, proxy, client_for):
    fake.reply = "over the socket"
    client = client_for(proxy, "sk-test")
    async with client.responses.connect() as conn:
        for n in range(2):
            await conn.response.create(model=MODEL, input=f"hello {n}", store=False)
            events = []
            async for e in conn:
                events.append(e)
                if e.type in ("response.completed", "error"):
                    break
            assert events[-1].type == "response.completed" and events[-1].response.output_text == "over the socket"
            assert [e.sequence_number for e in events] == list(range(len(events)))  # all of them, in order
    ws_recs = [r for r in fake.requests if r.transport == "websocket"]
    assert [r.json["input"] for r in ws_recs] == ["hello 0", "hello 1"]
    assert len([r for r in fake.requests if r.kind == "websocket"]) == 1  # one upstream socket
    assert ws_recs[0].headers["authorization"] == "Bearer sk-test"


async def test_errors_on_the_socket_are_relayed_and_it_stays_open(fake, proxy):
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(proxy.base_url), headers={"Authorization": "Bearer sk-test"}) as ws:
            bad = await turn(ws, {"type": "response.create", "model": MODEL,
                                  "input": [{"type": "function_call", "call_id": "c1", "name": "x", "arguments": "{}"}]})
            assert bad[0]["type"] == "error" and bad[0]["status"] == 400
            assert "No tool output found" in bad[0]["error"]["message"]
            ok = await turn(ws, {"type": "response.create", "model": MODEL, "input": "still open?"})
            assert ok[-1]["type"] == "response.completed"


async def test_a_refused_handshake_is_refused_the_same_way(fake, proxy):
    fake.require_api_key = "sk-right"
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await s.ws_connect(ws_url(proxy.base_url), headers={"Authorization": "Bearer sk-wrong"})
        assert e.value.status == 401
        async with s.ws_connect(ws_url(proxy.base_url), headers={"Authorization": "Bearer sk-right"}) as ws:
            assert (await turn(ws, {"type": "response.create", "model": MODEL, "input": "x"}))[-1]["type"] == \
                "response.completed"


async def test_a_broken_upstream_message_is_an_error_event_and_a_1011_close(fake, proxy):
    fake.reply, fake.broken_sse, fake.fault_times = "one two three four five", True, 1
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(proxy.base_url)) as ws:
            await ws.send_str(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
            texts = []
            while (msg := await ws.receive()).type == WSMsgType.TEXT:
                texts.append(json.loads(msg.data))  # every message the client gets is JSON
            assert msg.type == WSMsgType.CLOSE and ws.close_code == 1011
    assert texts[-1]["type"] == "error" and texts[-1]["error"]["code"] == "bad_upstream_response"


async def test_a_dead_upstream_is_an_error_event_and_a_clean_close(fake, proxy):
    fake.reply, fake.reset_mid_response, fake.fault_times = "one two three four five six seven", True, 1
    async with aiohttp.ClientSession() as s:
        async with s.ws_connect(ws_url(proxy.base_url)) as ws:
            await ws.send_str(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
            texts = []
            while (msg := await ws.receive()).type == WSMsgType.TEXT:
                texts.append(json.loads(msg.data))
            assert msg.type == WSMsgType.CLOSE and ws.close_code == 1011  # a close frame, not a dropped link
    assert texts[-1]["type"] == "error" and texts[-1]["error"]["code"] == "upstream_unreachable"
    assert all(t["type"] != "response.completed" for t in texts)


class CloseRecorder:
    """A tiny WebSocket upstream: records the close code it gets; `close_with` closes first."""

    def __init__(self) -> None:
        self.codes: list[int | None] = []
        self.close_with: int | None = None

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        while True:
            msg = await ws.receive()
            if msg.type == WSMsgType.CLOSE:
                self.codes.append(msg.data)  # the peer's code (ws.close_code reads aiohttp's 1000 reply)
                break
            if msg.type != WSMsgType.TEXT:
                break
            if self.close_with is not None:
                await ws.close(code=self.close_with, message=b"bye")
                break
            await ws.send_str(json.dumps({"type": "response.completed", "response": {"echo": msg.data}}))
        return ws


@pytest.fixture
async def recorder():
    rec = CloseRecorder()
    app = web.Application()
    app.router.add_get("/v1/responses", rec.handle)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    rec.base_url = f"http://127.0.0.1:{server.port}/v1"
    yield rec
    await server.close()


async def test_close_codes_are_passed_on_both_ways(recorder, make_proxy):
    proxy = await make_proxy(recorder.base_url)
    async with aiohttp.ClientSession() as s:
        ws = await s.ws_connect(ws_url(proxy.base_url))
        await ws.send_str(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
        assert json.loads((await ws.receive()).data)["type"] == "response.completed"
        await ws.close(code=4001)
        await until(lambda: recorder.codes, "the upstream to see the close")
        assert recorder.codes == [4001]
        recorder.close_with = 4002
        ws = await s.ws_connect(ws_url(proxy.base_url))
        await ws.send_str(json.dumps({"type": "response.create", "model": MODEL, "input": "x"}))
        msg = await ws.receive()
        assert msg.type == WSMsgType.CLOSE and ws.close_code == 4002
        await ws.close()


async def test_an_overflow_before_output_is_retried_with_the_compacted_message(fake):
    """relay_websocket with a route hook: the first message overflows the fake's window, the
    hook's retry sends a short one, and the client sees only the retried answer."""
    fake.window = 60
    fake.reply = "answered after the retry"
    retries: list[str] = []

    async def prepare(event: dict, raw: str) -> WsTurn:
        async def retry() -> tuple[str, dict[str, str]]:
            retries.append(raw)
            return json.dumps({**event, "input": "short"}), {"x-compaction-status": "summarized"}
        return WsTurn(raw, retry=retry, report={"x-compaction-status": "none"})

    async def handler(request: web.Request) -> web.StreamResponse:
        return await relay_websocket(request, session, ws_url(fake.base_url), {}, prepare, 1 << 20)

    app = web.Application()
    app.router.add_get("/v1/responses", handler)
    server = TestServer(app, host="127.0.0.1", port=0)
    async with aiohttp.ClientSession() as session:
        await server.start_server()
        try:
            async with session.ws_connect(f"ws://127.0.0.1:{server.port}/v1/responses") as ws:
                events = await turn(ws, {"type": "response.create", "model": MODEL, "input": "word " * 200})
                assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
                assert events[-1]["response"]["output"][0]["content"][0]["text"] == "answered after the retry"
                # the report the client gets is the retry's, not the refused attempt's
                assert events[0]["response"]["metadata"] == {"x-compaction-status": "summarized"}
                assert all(e["type"] != "error" for e in events)
                # a second overflow in a later request is retried again (once per request)
                events = await turn(ws, {"type": "response.create", "model": MODEL, "input": "more " * 200})
                assert events[-1]["type"] == "response.completed"
        finally:
            await server.close()
    assert len(retries) == 2
    inputs = [r.json["input"] for r in fake.requests if r.transport == "websocket"]
    assert inputs == ["word " * 200, "short", "more " * 200, "short"]


# ---- the x-compaction-* report of a WebSocket turn ------------------------------------------------

REPORT = ("x-compaction-status", "x-compaction-tokens-before", "x-compaction-tokens-after",
          "x-compaction-tool-results", "x-compaction-wait-ms")


def _history(turns: int) -> list[dict]:
    out = []
    for t in range(turns):
        out.append({"type": "message", "role": "user", "content": f"question {t}: " + filler(150, t)})
        out.append({"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": f"answer {t}: " + filler(150, t + 3)}]})
    return out + [{"type": "message", "role": "user", "content": "What next?"}]


async def _ws_turns(proxy, bodies: list[dict], key: str = "sk-ws-report") -> list[list]:
    client = openai_client(proxy, key)
    out = []
    async with client.responses.connect() as conn:
        for body in bodies:
            await conn.response.create(**body)
            events = []
            async for e in conn:
                events.append(e)
                if e.type in ("response.completed", "response.failed", "error"):
                    break
            out.append(events)
    await client.close()
    return out


async def test_each_websocket_turn_reports_what_the_proxy_did_in_response_created(fake, make_proxy):
    """Spec 11.3: a socket has no per-message headers, so each turn's x-compaction-* report goes in
    the `metadata` of its `response.created`: the same values an HTTP request gets, read here by the
    openai client; no event is added (sequence numbers stay whole) and other events are untouched."""
    fake.summarizer = main_summary("ws-report")
    # recall off: an HTTP request declares the recall tool, a socket's does not (it counts in tokens-after)
    proxy = await make_proxy(fake.base_url, {"models": {MODEL: {"context_window": 6000}},
                                             "compaction": {"prepare_percent": 0}, "recall": {"enabled": False}})
    small = {"model": MODEL, "input": "hello", "store": False, "metadata": {"run": "7"}}
    long = {"model": MODEL, "input": _history(14), "store": False}
    turns = await _ws_turns(proxy, [small, long, long])
    reports = []
    for events in turns:
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        meta = events[0].response.metadata
        reports.append({k: meta[k] for k in REPORT})
        assert not any(k.startswith("x-compaction-") for k in events[-1].response.metadata or {})
    assert turns[0][0].response.metadata["run"] == "7"  # the client's own metadata kept beside ours
    assert [r["x-compaction-status"] for r in reports] == ["none", "summarized", "reused"]
    assert int(reports[1]["x-compaction-tokens-after"]) < int(reports[1]["x-compaction-tokens-before"])
    # the same body over HTTP gets the same report in its headers
    answer = await post(proxy, long, {"Authorization": "Bearer sk-ws-report"}, path="/responses", expect=200)
    assert {k: answer.headers[k] for k in REPORT if k != "x-compaction-wait-ms"} == {
        k: v for k, v in reports[2].items() if k != "x-compaction-wait-ms"}


@pytest.mark.parametrize("overflow", ["error", "response.failed"])
async def test_an_overflow_retried_on_the_socket_reports_the_retry(fake, make_proxy, overflow):
    """Through the real proxy: the upstream's overflow on the socket (an `error` event, or a
    `response.failed` before any output) is compacted and retried once, and the turn reports the retry."""
    fake.window = 4000  # smaller than the proxy believes: the first attempt overflows
    fake.overflow_as_failed_event = overflow == "response.failed"
    proxy = await make_proxy(fake.base_url, {"models": {MODEL: {"context_window": 12000}},
                                             "compaction": {"prepare_percent": 0}})
    [events] = await _ws_turns(proxy, [{"model": MODEL, "input": _history(14), "store": False}])
    assert events[-1].type == "response.completed", (events[-1], [(r.status, r.prompt_tokens) for r in fake.records()])
    assert events[0].response.metadata["x-compaction-status"] == "summarized"
    assert all(e.type != "response.failed" for e in events)  # the refused attempt never reached the client
    calls = fake.records("responses")
    assert len(calls) == 2 and calls[0].prompt_tokens > 4000 >= calls[1].prompt_tokens


async def test_the_websocket_report_can_be_turned_off(fake, make_proxy):
    proxy = await make_proxy(fake.base_url, {"responses": {"websocket_report": False}})
    [events] = await _ws_turns(proxy, [{"model": MODEL, "input": "hello", "store": False}])
    assert not events[0].response.metadata
