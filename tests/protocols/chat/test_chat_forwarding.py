"""Chat completions through the proxy when it has nothing to compact: the real openai client (async
and sync, streaming or not, tools round-tripping) gets what it would get from the upstream, the
upstream gets the client's bytes unchanged, and every answer carries the x-compaction-* headers."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import orjson
import pytest

from support.compaction_helpers import analyze
from support.client import auth, post, sync_openai_client
from support.loopback import serving

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_order",
            "description": "Look up an order by id.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
        },
    }
]
CALL = {"id": "call_Ord3r7", "name": "get_order", "arguments": {"order_id": "#W5918442"}}


def _counted(proxy, body: dict) -> int:
    """The proxy's own count of a request (messages + tools), as its headers must report it."""
    return analyze(body, proxy.state.counter, ratio=1.0).total()


def _tool_history(first_reply) -> list[dict]:
    call = first_reply.tool_calls[0]
    return [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "Where is my order #W5918442?"},
        {
            "role": "assistant",
            "content": first_reply.content,
            "tool_calls": [{"id": call.id, "type": "function",
                            "function": {"name": call.function.name, "arguments": call.function.arguments}}],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"status": "shipped", "tracking": "1Z999AA10123456784"}'},
    ]


async def test_async_client_tools_round_trip(upstream, proxy, client):
    upstream.reply = lambda body: (
        {"content": None, "tool_calls": [CALL]} if body["messages"][-1]["role"] == "user" else "It shipped: 1Z999AA10123456784."
    )
    first_msgs = [{"role": "system", "content": "You are a support agent."},
                  {"role": "user", "content": "Where is my order #W5918442?"}]
    raw = await client.chat.completions.with_raw_response.create(model="gpt-4o", messages=first_msgs, tools=TOOLS)
    first = raw.parse()
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("call_Ord3r7", "get_order", {"order_id": "#W5918442"})
    assert raw.headers["x-compaction-status"] == "none"
    expected = _counted(proxy, {"model": "gpt-4o", "messages": first_msgs, "tools": TOOLS})
    assert raw.headers["x-compaction-tokens-before"] == raw.headers["x-compaction-tokens-after"] == str(expected)

    history = _tool_history(first.choices[0].message)
    second = await client.chat.completions.create(model="gpt-4o", messages=history, tools=TOOLS)
    assert second.choices[0].message.content == "It shipped: 1Z999AA10123456784."
    # The upstream saw exactly the client's messages and tools, both times.
    assert upstream.chat_requests[0]["messages"] == first_msgs
    assert upstream.chat_requests[1]["messages"] == history
    assert upstream.chat_requests[1]["tools"] == TOOLS


async def test_async_client_streaming_tool_calls(upstream, proxy, client):
    upstream.reply = {"content": "Checking.", "tool_calls": [CALL]}
    msgs = [{"role": "user", "content": "Where is my order #W5918442?"}]
    resp = await client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=msgs, tools=TOOLS, stream=True, stream_options={"include_usage": True}
    )
    assert resp.headers["x-compaction-status"] == "none"
    assert resp.headers["x-compaction-tokens-before"] == str(_counted(proxy, {"model": "gpt-4o-mini", "messages": msgs, "tools": TOOLS}))
    assert resp.headers["content-type"].startswith("text/event-stream")
    text, args, finish, usage = "", "", None, None
    async for chunk in resp.parse():
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            for tc in c.delta.tool_calls or ():
                args += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert text == "Checking."
    assert json.loads(args) == {"order_id": "#W5918442"}
    assert finish == "tool_calls"
    assert usage is not None and usage.prompt_tokens > 0


def _sync_conversation(base_url: str) -> tuple[str, str, dict]:
    client = sync_openai_client(base_url, "sk-sync", timeout=20)
    try:
        plain = client.chat.completions.create(model="gpt-4.1", messages=[{"role": "user", "content": "Say hi"}])
        streamed = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(
                model="gpt-4.1", messages=[{"role": "user", "content": "Say hi"}], stream=True
            )
            if c.choices
        )
        raw = client.chat.completions.with_raw_response.create(model="gpt-4.1", messages=[{"role": "user", "content": "x"}])
        return plain.choices[0].message.content, streamed, dict(raw.headers)
    finally:
        client.close()


async def test_sync_client_in_thread(upstream, proxy):
    upstream.reply = "Hello there, friend."
    plain, streamed, headers = await asyncio.to_thread(_sync_conversation, proxy.base_url)
    assert plain == streamed == "Hello there, friend."
    assert headers["x-compaction-status"] == "none"
    # three requests (plain, streamed, raw), each with the client's key
    assert [r.headers["authorization"] for r in upstream.records("chat")] == ["Bearer sk-sync"] * 3


# Unusual but valid JSON: whitespace, key order, escapes, numbers in exponent form. Any
# re-serialization by the proxy would change these bytes.
RAW_BODY = (
    b'{ "messages" : [ {"content": "caf\\u00e9 \xe2\x9c\x93 \\"q\\"", "role":"user"} ],\n'
    b'  "temperature": 1.0e0, "model": "gpt-4o", "metadata": {"z": 1, "a": [ ]}%s }'
)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("bypass", [False, True], ids=["normal", "bypass"])
async def test_unchanged_request_goes_upstream_byte_identical(upstream, proxy, stream, bypass):
    raw = RAW_BODY % (b', "stream": true' if stream else b"")
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-raw"}
    if bypass:
        headers["x-compaction-bypass"] = "1"
    _, got, body = await post(proxy, raw, headers, expect=200)
    assert upstream.records("chat")[-1].body == raw
    assert got["x-compaction-status"] == ("bypassed" if bypass else "none")
    n = _counted(proxy, orjson.loads(raw))
    assert got["x-compaction-tokens-before"] == got["x-compaction-tokens-after"] == str(n)
    if stream:
        assert body.endswith(b"data: [DONE]\n\n")
    else:
        assert orjson.loads(body)["object"] == "chat.completion"


async def test_bypass_forwards_original_even_when_compaction_would_run(upstream, make_proxy):
    """With x-compaction-bypass the proxy forwards untouched a request it would otherwise compact."""
    p = await make_proxy(upstream.base_url, {"models": {"gpt-4": {"context_window": 2000}},
                                             "tool_results": {"threshold_tokens": 50}})
    big_tool = "order W%07d shipped\n" * 200
    msgs = [
        {"role": "user", "content": "look up orders"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_orders", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": big_tool},
        {"role": "user", "content": "summarize them"},
    ]
    raw = orjson.dumps({"model": "gpt-4", "messages": msgs})
    status, got, _ = await post(p, raw, {"x-compaction-bypass": "1", **auth("k")})
    # The fake's window (128000) takes it; the point is what the proxy did, not the answer.
    assert status == 200
    assert got["x-compaction-status"] == "bypassed"
    assert got["x-compaction-tool-results"] == "0"
    assert upstream.records("chat")[-1].body == raw
    assert upstream.summarizer_requests == []
    # The same request without the header is rewritten: the bypass is what kept it intact.
    assert (await post(p, raw, auth("k"), expect=200)).compaction != "bypassed"
    assert upstream.summarizer_requests
    assert upstream.records("chat")[-1].body != raw


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("status", [401, 429, 500, 503])
async def test_upstream_errors_pass_through_with_headers(upstream, proxy, status, stream):
    upstream.fail_status = status
    upstream.retry_after = 3
    raw = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": stream})
    direct = await post(upstream, raw)
    via = await post(proxy, raw)
    got = via.headers
    assert (via.status, via.body) == (direct.status, direct.body)
    assert via.status == status
    assert got["Retry-After"] == "3"
    assert got["x-compaction-status"] == "none"
    assert int(got["x-compaction-tokens-before"]) > 0
    assert "x-compaction-tokens-after" in got


async def test_upstream_validation_error_passes_through(upstream, proxy, client):
    """Semantics are the upstream's to judge: an unanswered tool call is forwarded and the
    upstream's 400 reaches the client as it came."""
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "user", "content": "and?"},
    ]
    with pytest.raises(openai.BadRequestError) as exc:
        await client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert "did not have response messages: c9" in exc.value.message
    assert exc.value.response.headers["x-compaction-status"] == "none"
    assert len(upstream.chat_requests) == 1


async def test_chat_query_string_is_forwarded(upstream, proxy):
    """Azure-style deployments put `api-version` in the query string; it must reach the upstream."""
    raw = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
    await post(proxy, raw, path="/chat/completions?api-version=2024-10-21&x=a%2Bb", expect=200)
    assert upstream.records("chat")[-1].raw_path == "/v1/chat/completions?api-version=2024-10-21&x=a%2Bb"


async def test_images_and_unusual_valid_messages_forwarded(upstream, proxy, client):
    msgs = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "name": "ana", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
        ]},
    ]
    resp = await client.chat.completions.with_raw_response.create(model="gpt-4o", messages=msgs)
    assert resp.parse().choices[0].message.content
    assert upstream.chat_requests[-1]["messages"] == msgs
    assert int(resp.headers["x-compaction-tokens-before"]) >= 765  # the image's fixed estimate


async def test_upstream_redirect_is_relayed_not_followed(make_proxy):
    """The upstream comes from config only: a redirect goes back to the client, the proxy does not
    carry the client's request (and credentials) to wherever it points."""
    from aiohttp import web

    followed: list[str] = []

    async def redirect(request: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": "/v1/elsewhere"})

    async def elsewhere(request: web.Request) -> web.Response:
        followed.append(request.headers.get("Authorization", ""))
        return web.json_response({"object": "chat.completion", "choices": []})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", redirect)
    app.router.add_post("/v1/elsewhere", elsewhere)
    async with serving(app) as base:
        p = await make_proxy(base + "/v1")
        raw = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
        async with aiohttp.ClientSession() as s:
            async with s.post(p.base_url + "/chat/completions", data=raw, allow_redirects=False,
                              headers={"Authorization": "Bearer sk-secret"}) as r:
                status, location, state = r.status, r.headers.get("Location"), r.headers.get("x-compaction-status")
    assert (status, location, state) == (307, "/v1/elsewhere", "none")
    assert followed == []
