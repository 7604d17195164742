"""Anthropic clients through the proxy (design.md § Messages API, issue 15 items 1, 7): /v1/messages,
count_tokens and every other Anthropic request reach `anthropic.base_url` (the strict fake
Messages upstream), beside OpenAI clients of the same proxy; credentials, anthropic-version and
anthropic-beta go as sent; streams are checked and errors are in Anthropic's shape."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from anthropic import APIStatusError, BadRequestError

from proxy.fakes.messages import FakeMessages
from support.client import anthropic_client, get, http, openai_client, post, sync_anthropic_client
from support.loopback import serving

MODEL = "claude-sonnet-4-6"
HEADERS = {"x-api-key": "sk-ant-route", "anthropic-version": "2023-06-01"}
JSON = {"Content-Type": "application/json"}
READ = {"name": "Read", "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
THINK = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture
async def fake():
    async with FakeMessages() as f:
        yield f


@pytest.fixture
async def both(upstream, fake, make_proxy):
    """One proxy, the OpenAI fake as upstream.base_url and the Messages fake as anthropic.base_url."""
    return await make_proxy(upstream.base_url, {"anthropic": {"base_url": fake.base_url}})


def anthropic_error(payload: dict, type_: str) -> str:
    assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}, payload
    assert payload["error"]["type"] == type_, payload
    return payload["error"]["message"]


async def test_async_client_reaches_the_messages_upstream_with_its_headers(both, upstream, fake):
    async with anthropic_client(both, "sk-ant-route", default_headers={"anthropic-beta": "interleaved-thinking-2025-05-14"}) as c:
        raw = await c.messages.with_raw_response.create(model=MODEL, max_tokens=100, system="Be brief.",
                                                        messages=[{"role": "user", "content": "Hello there"}])
    msg = await raw.parse()
    assert msg.content[0].text == "ok: Hello there"
    assert raw.headers["x-compaction-status"] == "none"
    assert int(raw.headers["x-compaction-tokens-before"]) == int(raw.headers["x-compaction-tokens-after"]) > 0
    got = fake.records("messages")[-1]
    # The anthropic package sends its key as a Bearer token, and its own anthropic-version.
    assert got.path == "/v1/messages" and got.headers["authorization"] == "Bearer sk-ant-route"
    assert got.headers["anthropic-version"] == raw.http_request.headers["anthropic-version"]
    assert got.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert upstream.requests == []  # nothing went to the OpenAI upstream


async def test_sync_client(both, fake):
    def call() -> str:
        with sync_anthropic_client(both, "sk-ant-route") as c:
            return c.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "sync"}]
                                     ).content[0].text
    assert await asyncio.to_thread(call) == "ok: sync"


async def test_streaming_tools_and_signed_thinking_round_trip(both, fake):
    fake.reply = {"thinking": "The user wants a.py.", "tool_calls": [{"name": "Read", "input": {"path": "a.py"}}]}
    async with anthropic_client(both) as c:
        async with c.messages.stream(model=MODEL, max_tokens=2000, thinking=THINK, tools=[READ],
                                     messages=[{"role": "user", "content": "read a.py"}]) as s:
            types = [e.type async for e in s]
            final = await s.get_final_message()
        assert types[0] == "message_start" and types[-1] == "message_stop"
        assert [b.type for b in final.content] == ["thinking", "tool_use"]
        turn = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in final.content]}
        fake.reply = "done"
        # The signed thinking goes back unchanged: the strict fake checks its signature.
        r = await c.messages.create(model=MODEL, max_tokens=2000, thinking=THINK, tools=[READ], messages=[
            {"role": "user", "content": "read a.py"}, turn,
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": final.content[1].id,
                                          "content": "print(1)"}]}])
    assert r.content[-1].text == "done"


async def test_count_tokens_goes_to_the_messages_upstream(both, fake):
    async with anthropic_client(both) as c:
        n = await c.messages.count_tokens(model=MODEL, tools=[READ], messages=[{"role": "user", "content": "count"}])
    assert n.input_tokens == fake.records("count_tokens")[-1].prompt_tokens > 0


async def test_openai_and_anthropic_clients_side_by_side(both, upstream, fake):
    async with anthropic_client(both, "sk-ant-route") as a, openai_client(both, "sk-oa") as o:
        answers = await asyncio.gather(
            a.messages.create(model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "from claude"}]),
            o.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "from openai"}]))
    assert answers[0].content[0].text == "ok: from claude"
    assert answers[1].choices[0].message.content
    assert [r.path for r in fake.requests] == ["/v1/messages"]
    assert [r.path for r in upstream.requests] == ["/v1/chat/completions"]
    assert upstream.requests[0].headers["authorization"] == "Bearer sk-oa"
    assert fake.requests[0].headers["authorization"] == "Bearer sk-ant-route"


async def test_other_anthropic_paths_are_passed_to_anthropic(both, upstream, fake):
    models = await get(both.root, "/v1/models?limit=5", HEADERS)
    assert models.status == 404  # the fake serves no /v1/models: its own Anthropic-shaped 404
    anthropic_error(models.json(), "not_found_error")
    assert (await post(both.root, {"requests": []}, HEADERS, path="/v1/messages/batches")).status == 404
    await get(both.root, "/v1/models", {"Authorization": "Bearer sk-oa"})  # no anthropic-version: an OpenAI client's request
    assert [(r.method, r.path, r.query_string) for r in fake.requests] == [("GET", "/v1/models", "limit=5"),
                                                                      ("POST", "/v1/messages/batches", "")]
    assert [r.path for r in upstream.requests] == ["/v1/models"]


async def test_bearer_credential_and_configured_key(upstream, fake, make_proxy):
    proxy = await make_proxy(upstream.base_url, {"anthropic": {"base_url": fake.base_url, "api_key": "sk-ant-conf"},
                                                 "upstream": {"api_key": "sk-openai-conf"}})
    beta = {**HEADERS, "anthropic-beta": "context-1m-2025-08-07,fine-grained-tool-streaming-2025-05-14"}
    status, _, _ = await post(proxy.root, {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "key"}]}, {**beta, **JSON}, path="/v1/messages")
    assert status == 200
    sent = fake.requests[-1].headers
    assert sent["x-api-key"] == "sk-ant-route" and "authorization" not in sent
    assert (sent["anthropic-version"], sent["anthropic-beta"]) == ("2023-06-01", beta["anthropic-beta"])
    status, _, _ = await post(proxy.root, {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "bearer"}]}, {"Authorization": "Bearer sk-ant-b", "anthropic-version": "2023-06-01", **JSON},
        path="/v1/messages")
    assert status == 200
    assert fake.requests[-1].headers["authorization"] == "Bearer sk-ant-b" and "x-api-key" not in fake.requests[-1].headers
    status, _, _ = await post(proxy.root, {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "nokey"}]}, {"anthropic-version": "2023-06-01", **JSON}, path="/v1/messages")
    assert status == 200
    sent = fake.requests[-1].headers
    # The configured Anthropic key, as Anthropic takes it; the OpenAI key never goes to Anthropic.
    assert sent["x-api-key"] == "sk-ant-conf" and "authorization" not in sent


@pytest.mark.parametrize(("body", "says"), [
    (b"{not json", "not valid JSON"),
    (b"", "empty"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5}, "model: Field required"),
    ({"model": MODEL, "max_tokens": 5, "messages": "hi"}, "messages: Input should be a valid list"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [{"text": "x"}]}]},
     "messages.0.content.0: Unable to extract tag"),
    ({"model": MODEL, "max_tokens": 5, "system": 3, "messages": [{"role": "user", "content": "x"}]}, "system:"),
])
async def test_bad_requests_get_anthropic_shaped_400s(both, fake, body, says):
    status, _, raw = await post(both.root, body, {**HEADERS, **JSON}, path="/v1/messages")
    payload = json.loads(raw)
    assert status == 400
    assert says in anthropic_error(payload, "invalid_request_error")
    # the proxy answered it; but a body without a model goes as it came (a local server picks its
    # own): the upstream answered that one
    assert len(fake.requests) == (says == "model: Field required")


async def test_the_client_raises_the_matching_error_class(both):
    async with anthropic_client(both) as c:
        with pytest.raises(BadRequestError) as e:
            await c.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "robot", "content": "x"}])
    assert e.value.body["error"]["type"] == "invalid_request_error"


async def test_upstream_errors_pass_through_as_they_came(both, fake):
    status, headers, raw = await post(both.root, {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}, {"role": "assistant", "content": "y "}]}, {**HEADERS, **JSON},
        path="/v1/messages")
    payload = json.loads(raw)
    assert status == 400 and "final assistant content cannot end with trailing whitespace" in \
        anthropic_error(payload, "invalid_request_error")
    assert headers["x-compaction-status"] == "none"


async def test_unreachable_upstream_is_an_anthropic_502(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, {"anthropic": {"base_url": "http://127.0.0.1:9"}})
    status, _, raw = await post(proxy.root, {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "x"}]}, {**HEADERS, **JSON}, path="/v1/messages")
    payload = json.loads(raw)
    assert status == 502 and "Upstream unreachable" in anthropic_error(payload, "api_error")
    status, _, raw = await post(proxy.root, b"", {**HEADERS, **JSON}, path="/v1/models")
    payload = json.loads(raw)
    assert status == 502 and anthropic_error(payload, "api_error")


async def stream_events(url: str, body: dict) -> list[tuple[str, dict]]:
    raw = (await http("POST", url, body, HEADERS)).body.decode()
    out = []
    for block in filter(None, raw.split("\n\n")):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


STREAM_BODY = {"model": MODEL, "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "s"}]}


async def test_a_broken_event_ends_the_stream_with_an_anthropic_error_event(both, fake):
    fake.reply, fake.broken_sse = "one two three four five six", True
    events = await stream_events(both.root + "/v1/messages", STREAM_BODY)
    name, data = events[-1]
    assert name == "error" and data["type"] == "error" and data["error"]["type"] == "api_error"
    assert "not valid JSON" in data["error"]["message"]
    assert events[0][0] == "message_start"
    async with anthropic_client(both) as c:
        with pytest.raises(APIStatusError):
            async with c.messages.stream(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "s"}]) as s:
                async for _ in s:
                    pass


async def test_an_upstream_error_event_is_relayed_as_sent(both, fake):
    fake.reply, fake.error_mid_stream = "a b c d e f g h", "overloaded_error"
    events = await stream_events(both.root + "/v1/messages", STREAM_BODY)
    assert events[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert sum(name == "error" for name, _ in events) == 1  # the proxy adds none of its own


async def test_a_stream_cut_off_ends_with_an_error_event(both, fake):
    fake.reply, fake.reset_mid_response = "a b c d e f g h i j", True
    async with anthropic_client(both) as c:
        with pytest.raises(APIStatusError):
            async with c.messages.stream(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "s"}]) as s:
                async for _ in s:
                    pass


async def test_a_stream_that_stops_before_message_stop_gets_an_error_event(upstream, make_proxy):
    """A server that ends its stream cleanly but early (no message_stop): the SDK would hand back
    half a message; the proxy says so instead."""
    async def early_end(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        start = {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                 "model": MODEL, "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": 5, "output_tokens": 1}}}
        await resp.write(b"event: message_start\ndata: " + json.dumps(start).encode() + b"\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/messages", early_end)
    async with serving(app) as early:
        proxy = await make_proxy(upstream.base_url, {"anthropic": {"base_url": early}})
        events = await stream_events(proxy.root + "/v1/messages", STREAM_BODY)
    assert [name for name, _ in events] == ["message_start", "error"]
    assert "before message_stop" in events[-1][1]["error"]["message"]


async def test_bypass_forwards_the_bytes_untouched(both, fake):
    raw = b'{"model": "%s", "max_tokens": 5, "messages": [{"role": "user", "content": "as is"}]}' % MODEL.encode()
    status, headers, _ = await post(both.root, raw, {**HEADERS, "x-compaction-bypass": "1", **JSON}, path="/v1/messages")
    assert status == 200 and headers["x-compaction-status"] == "bypassed"
    assert fake.requests[-1].body == raw and "x-compaction-bypass" not in fake.requests[-1].headers
