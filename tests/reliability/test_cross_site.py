"""No web page borrows the proxy's key (issue 38 item 5): with upstream.api_key / anthropic.api_key
set, a request without a credential of its own is refused when it comes from a browser origin not
in server.allowed_origins (a WebSocket handshake, a CORS request or its preflight), or when it is a
POST to a compaction route in a type a browser sends cross-site without a preflight (text/plain,
the form types); in the protocol's error shape, and nothing reaches the upstream. Requests with
their own credential, and every request to a proxy that holds no key, are forwarded as before."""

from __future__ import annotations

import json

import aiohttp
import orjson
import pytest

from proxy.config import load_config
from proxy.crosssite import is_simple
from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses
from support.client import http

OPERATOR, ANT_OPERATOR = "sk-operator", "sk-ant-operator"
EVIL = "http://evil.example"
APP = "https://app.example"
CHAT = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
MESSAGES = orjson.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]})
SIMPLE = ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=xyz")
# path, body, whether the error is in Anthropic's shape
COMPACTION_ROUTES = [("/v1/chat/completions", CHAT, False), ("/v1/responses", b'{"model":"gpt-5","input":"hi"}', False),
                     ("/v1/responses/compact", b'{"model":"gpt-5","input":[]}', False), ("/v1/messages", MESSAGES, True),
                     ("/v1/messages/count_tokens", MESSAGES, True)]
KEYS = {"upstream": {"api_key": OPERATOR}, "anthropic": {"api_key": ANT_OPERATOR}}


def settings(upstream_url: str, messages_url: str, *, keys: bool = True) -> dict:
    out: dict = {"anthropic": {"base_url": messages_url}, "server": {"allowed_origins": [APP]}}
    if keys:
        out["upstream"] = KEYS["upstream"]
        out["anthropic"] = {**out["anthropic"], **KEYS["anthropic"]}
    return out


def error_of(body: bytes, anthropic: bool) -> tuple[str, str | None]:
    """(type, code) of an error body, checking its protocol's shape."""
    payload = orjson.loads(body)
    if anthropic:
        assert payload["type"] == "error" and set(payload["error"]) == {"type", "message"}, payload
        return payload["error"]["type"], None
    assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
    return payload["error"]["type"], payload["error"]["code"]


def ws_url(proxy) -> str:
    return proxy.base_url.replace("http://", "ws://") + "/responses"


async def a_turn(ws) -> str:
    await ws.send_str(json.dumps({"type": "response.create", "model": "gpt-5", "input": "hi"}))
    while True:
        event = json.loads((await ws.receive()).data)
        if event["type"] in ("response.completed", "response.failed", "error"):
            return event["type"]


def test_the_types_a_browser_sends_without_a_preflight():
    assert all(is_simple(t) for t in (*SIMPLE, "TEXT/PLAIN", " text/plain ; charset=x"))
    assert not any(is_simple(t) for t in ("application/json", "application/json; charset=utf-8",
                                          "application/octet-stream", "text/event-stream", ""))


def test_allowed_origins_from_the_environment():
    cfg = load_config(environ={"COMPACTION_PROXY_SERVER__ALLOWED_ORIGINS": "[https://app.example, http://localhost:3000]"})
    assert cfg.server.allowed_origins == ["https://app.example", "http://localhost:3000"]


async def test_a_browser_origin_gets_no_websocket_with_the_proxys_key(make_proxy):
    async with FakeResponses() as fake, FakeMessages() as ant:
        fake.require_api_key = OPERATOR
        proxy = await make_proxy(fake.base_url, settings(fake.base_url, ant.base_url))
        async with aiohttp.ClientSession() as s:
            for origin in (EVIL, "null", "https://app.example.evil.example"):
                with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                    await s.ws_connect(ws_url(proxy), headers={"Origin": origin})
                assert e.value.status == 403, origin
            assert [r for r in fake.requests if r.transport == "websocket" or r.kind == "websocket"] == []
            # CLI agents send no Origin; a configured origin (however cased) and a client's own key pass
            for headers in ({}, {"Origin": "HTTPS://App.Example/"}, {"Origin": EVIL, "Authorization": f"Bearer {OPERATOR}"}):
                async with s.ws_connect(ws_url(proxy), headers=headers) as ws:
                    assert await a_turn(ws) == "response.completed", headers
        # a proxy holding no key lends none: the handshake is forwarded as before, and refused upstream
        bare = await make_proxy(fake.base_url, settings(fake.base_url, ant.base_url, keys=False))
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                await s.ws_connect(ws_url(bare), headers={"Origin": EVIL})
            assert e.value.status == 401


@pytest.mark.parametrize("content_type", SIMPLE)
async def test_a_simple_cross_site_post_gets_no_compaction_route_with_the_proxys_key(upstream, make_proxy, content_type):
    async with FakeMessages() as ant:
        proxy = await make_proxy(upstream.base_url, settings(upstream.base_url, ant.base_url))
        for path, body, anthropic in COMPACTION_ROUTES:
            answer = await http("POST", proxy.root + path, body, {"Content-Type": content_type})
            assert answer.status == 415, (path, answer.body)
            kind, code = error_of(answer.body, anthropic)
            assert kind == "invalid_request_error" and code in (None, "unsupported_content_type")
        assert upstream.requests == [] and ant.requests == []
        # the same bodies as JSON go out with the proxy's key; with the client's own credential, or
        # through a proxy that holds no key, a text/plain body is forwarded as before
        assert (await http("POST", proxy.base_url + "/chat/completions", CHAT, {"Content-Type": "application/json"})).status == 200
        assert upstream.requests[-1].headers["authorization"] == f"Bearer {OPERATOR}"
        own = await http("POST", proxy.base_url + "/chat/completions", CHAT,
                         {"Content-Type": content_type, "Authorization": "Bearer sk-client"})
        assert own.status == 200 and upstream.requests[-1].headers["authorization"] == "Bearer sk-client"
        bare = await make_proxy(upstream.base_url, settings(upstream.base_url, ant.base_url, keys=False))
        assert (await http("POST", bare.base_url + "/chat/completions", CHAT, {"Content-Type": content_type})).status == 200
        assert "authorization" not in upstream.requests[-1].headers
        assert len(upstream.requests) == 3


async def test_a_cors_request_or_preflight_from_another_origin_is_refused(upstream, make_proxy):
    """A page that asks first (a preflight) and sends JSON would otherwise be answered with the key
    wherever the upstream allows CORS: every /v1 route refuses an origin not configured."""
    async with FakeMessages() as ant:
        proxy = await make_proxy(upstream.base_url, settings(upstream.base_url, ant.base_url))
        cases = [("OPTIONS", "/v1/chat/completions", None, False), ("POST", "/v1/chat/completions", CHAT, False),
                 ("GET", "/v1/models", None, False), ("POST", "/v1/embeddings", b'{"model":"m","input":"x"}', False),
                 ("POST", "/v1/messages", MESSAGES, True)]
        for method, path, body, anthropic in cases:
            answer = await http(method, proxy.root + path, body, {"Origin": EVIL, "Content-Type": "application/json"})
            assert answer.status == 403, (method, path, answer.body)
            kind, code = error_of(answer.body, anthropic)
            assert kind == "permission_error" and code in (None, "origin_not_allowed")
        assert upstream.requests == [] and ant.requests == []
        answer = await http("POST", proxy.root + "/v1/chat/completions", CHAT, {"Origin": APP, "Content-Type": "application/json"})
        assert answer.status == 200 and upstream.requests[-1].headers["authorization"] == f"Bearer {OPERATOR}"
        answer = await http("POST", proxy.root + "/v1/messages", MESSAGES,
                            {"Origin": APP, "Content-Type": "application/json", "anthropic-version": "2023-06-01"})
        assert answer.status == 200 and ant.requests[-1].headers["x-api-key"] == ANT_OPERATOR
