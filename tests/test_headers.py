"""Request and response headers across the proxy: credentials, our own x-compaction-* headers and
hop-by-hop headers (RFC 9110 7.6.1), on the chat route and on pass-through routes."""

from __future__ import annotations

import asyncio
import re

import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.forward import HOP_BY_HOP, client_response_headers

from support.client import get, http, post
from support.loopback import serving

CHAT = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
ROUTES = [("POST", "/chat/completions", CHAT), ("POST", "/embeddings", b'{"model":"m","input":"x"}'), ("GET", "/models", None)]


@pytest.mark.parametrize("method,path,data", ROUTES, ids=["chat", "embeddings", "models"])
async def test_client_authorization_forwarded_not_config_key(upstream, make_proxy, method, path, data):
    p = await make_proxy(upstream.base_url, {"upstream": {"api_key": "sk-from-config"}})
    upstream.require_api_key = "sk-client"
    r = await http(method, p.base_url + path, data, {"Authorization": "Bearer sk-client"})
    assert r.status == 200
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-client"


@pytest.mark.parametrize("method,path,data", ROUTES, ids=["chat", "embeddings", "models"])
async def test_config_api_key_used_when_client_sends_none(upstream, make_proxy, method, path, data):
    p = await make_proxy(upstream.base_url, {"upstream": {"api_key": "sk-from-config"}})
    upstream.require_api_key = "sk-from-config"
    r = await http(method, p.base_url + path, data, {})
    assert r.status == 200
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-from-config"


async def test_no_authorization_invented_without_config_key(upstream, proxy):
    assert (await get(proxy, "/models")).status == 200
    assert (await post(proxy, CHAT)).status == 200
    # Both reached the upstream (an empty list would pass the check below vacuously), bare.
    assert [r.path for r in upstream.requests] == ["/v1/models", "/v1/chat/completions"]
    assert ["authorization" in r.headers for r in upstream.requests] == [False, False]


DROPPED = {
    "Connection": "keep-alive, X-Listed-In-Connection",
    "X-Listed-In-Connection": "secret-hop",
    "Keep-Alive": "timeout=5, max=100",
    "TE": "trailers",
    "Upgrade": "h2c",
    "Proxy-Authorization": "Basic dXNlcjpwYXNz",
    "Proxy-Connection": "keep-alive",
    "x-compaction-bypass": "0",
    "x-compaction-focus": "billing",
    "x-compaction-session": "s-123",
    "X-Compaction-Anything": "1",
}
KEPT = {"X-Client-Trace": "t-42", "OpenAI-Organization": "org-1", "User-Agent": "my-agent/1.0"}


@pytest.mark.parametrize("method,path,data", ROUTES, ids=["chat", "embeddings", "models"])
async def test_hop_by_hop_and_own_headers_never_reach_upstream(upstream, proxy, method, path, data):
    r = await http(method, proxy.base_url + path, data, {**DROPPED, **KEPT, "Authorization": "Bearer k"})
    assert r.status == 200
    got = upstream.requests[-1].headers
    for name in DROPPED:
        assert name.lower() not in got, name
    assert not [h for h in got if h.startswith("x-compaction")]
    for name, value in KEPT.items():
        assert got[name.lower()] == value
    assert got["authorization"] == "Bearer k"


async def test_upstream_hop_by_hop_response_headers_dropped(make_proxy):
    """Headers the upstream marks hop-by-hop stay between it and the proxy; the rest come back."""

    async def handler(request: web.Request) -> web.Response:
        return web.Response(
            body=b'{"ok":true}',
            content_type="application/json",
            headers={"Connection": "keep-alive, X-Upstream-Hop", "X-Upstream-Hop": "1", "Keep-Alive": "timeout=9",
                     "X-Upstream-Kept": "yes", "Set-Cookie": "a=b"},
        )

    app = web.Application()
    app.router.add_get("/v1/batches", handler)
    async with serving(app) as base:
        p = await make_proxy(base + "/v1")
        r = await get(p, "/batches")
    assert r.status == 200
    assert r.headers["X-Upstream-Kept"] == "yes" and r.headers["Set-Cookie"] == "a=b"
    assert "X-Upstream-Hop" not in r.headers
    assert "Keep-Alive" not in r.headers


_names = st.sampled_from(["Content-Type", "content-length", "Connection", "Keep-Alive", "Transfer-Encoding", "x-a",
                          "X-A", "Set-Cookie", "TE", "Upgrade", "x-request-id", "Date", "X-Listed", "trailer"])


@settings(max_examples=300, deadline=None)
@given(pairs=st.lists(st.tuples(_names, st.sampled_from(["1", "keep-alive", "x-listed, X-A", " , upgrade", "v"])),
                      max_size=12))
def test_the_answers_headers_are_the_upstreams_minus_hop_by_hop_in_order(pairs):
    """client_response_headers copies and deletes: the same headers, order, case and repeats as
    keeping each upstream header that is not hop-by-hop nor named by its Connection header."""
    upstream = CIMultiDictProxy(CIMultiDict(pairs))
    listed = {t.strip().lower() for v in upstream.getall("connection", []) for t in v.split(",") if t.strip()}
    kept = [(k, v) for k, v in pairs if k.lower() not in HOP_BY_HOP and k.lower() not in listed]
    assert list(client_response_headers(upstream).items()) == kept


async def test_a_clients_expect_100_continue_is_answered_by_the_proxy_not_passed_on(make_proxy):
    """curl sends `Expect: 100-continue` with a large body. The proxy answers it and has the whole
    body before it forwards: an upstream that sends no 100 Continue (it need not) still gets the
    request at once, with no Expect in it, and the client its answer."""
    seen: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")  # never a 100 Continue: straight to the answer
        length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head).group(1))
        seen.append(head + await reader.readexactly(length))
        answer = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
                               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                            "finish_reason": "stop"}]})
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(answer), answer))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        p = await make_proxy(f"http://127.0.0.1:{port}/v1")
        body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "x " * 600_000}]})
        r = await http("POST", p.base_url + "/chat/completions", body,
                       {"Expect": "100-continue", "Authorization": "Bearer k"}, timeout=20)
    finally:
        server.close()
    assert r.status == 200 and orjson.loads(r.body)["choices"][0]["message"]["content"] == "ok"
    assert len(seen) == 1 and b"\r\nexpect:" not in seen[0].lower() and seen[0].endswith(body)
