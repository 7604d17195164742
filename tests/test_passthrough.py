"""Everything under /v1/ other than chat completions passes through byte-identical, both ways.

Raw HTTP calls (support.client) send exact bytes (and exact, percent-encoded URLs); the fake upstream records
exactly what it received. The answer the client gets is compared with what the upstream sent.
"""

from __future__ import annotations

import base64
import gzip
import os

import orjson
import pytest
from aiohttp import web

from proxy.fakes.chat import FakeUpstream
from proxy.fakes.common import utf8_or_none
from support.client import get, http, post
from support.loopback import serving


def _echo_bytes(fake: FakeUpstream) -> bytes:
    """What the fake sent for its last echoed request (its echo is a function of what it received)."""
    rec = fake.requests[-1]
    echo = {
        "method": rec.method,
        "path": rec.path,
        "raw_path": rec.raw_path,
        "query": rec.query_string,
        "headers": rec.headers,
        "body_text": utf8_or_none(rec.body),
        "body_b64": base64.b64encode(rec.body).decode(),
    }
    return orjson.dumps(echo, option=orjson.OPT_INDENT_2)


async def test_models_list_and_item_are_identical_to_direct(upstream, proxy):
    direct = await get(upstream, "/models")
    via = await get(proxy, "/models")
    assert via.status == direct.status == 200
    assert via.body == direct.body
    direct_item = await get(upstream, "/models/gpt-4o")
    via_item = await get(proxy, "/models/gpt-4o")
    assert (via_item.status, via_item.body) == (direct_item.status, direct_item.body)
    missing = await get(proxy, "/models/nope")
    assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"
    # The upstream's own response headers come back to the client; its request id under
    # x-upstream-request-id, since x-request-id names the proxy's request (its access log line).
    assert via.headers["openai-version"] == "2020-10-01"
    assert via.headers["x-upstream-request-id"].startswith("req_")
    assert not via.headers["x-request-id"].startswith("req_")
    assert via.headers["Content-Type"] == "application/json"


async def test_embeddings_request_and_response_bytes_identical(upstream, proxy):
    # Odd spacing and key order: any re-serialization by the proxy would show.
    raw = b'{ "model" : "text-embedding-3-small",\n  "input": ["caf\\u00e9", "b"],  "dimensions": 4 }'
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-emb"}
    direct = await post(upstream, raw, headers, path="/embeddings")
    via = await post(proxy, raw, headers, path="/embeddings")
    assert via.status == direct.status == 200
    assert via.body == direct.body
    assert [r.body for r in upstream.requests] == [raw, raw]


async def test_arbitrary_responses_body_and_query_pass_through(upstream, proxy):
    raw = b'{"model":"gpt-4o","input":[{"role":"user","content":"hi \xe2\x9c\x93"}],"x":  [1,2 ,3]}'
    # Percent-encoded bytes in path and query must arrive exactly as the client wrote them.
    target = "/responses/resp%2Fabc?api-version=2024-10-01&q=a%2Bb%20c&empty=&flag"
    status, headers, body = await post(proxy, raw, {"Content-Type": "application/json"}, path=target)
    assert status == 200
    rec = upstream.requests[-1]
    assert rec.method == "POST"
    assert rec.raw_path == "/v1" + target
    assert rec.body == raw
    assert headers["x-upstream-echo"] == "1"
    assert body == _echo_bytes(upstream)


async def test_get_with_query_passes_through(upstream, proxy):
    status, _, body = await get(proxy, "/files?purpose=fine-tune&limit=2&after=file%3Dx")
    assert status == 200
    rec = upstream.requests[-1]
    assert rec.method == "GET" and rec.raw_path == "/v1/files?purpose=fine-tune&limit=2&after=file%3Dx"
    assert rec.body == b""
    assert body == _echo_bytes(upstream)


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
async def test_other_methods_pass_through(upstream, proxy, method):
    status, _, body = await http(method, proxy.base_url + "/files/file-1", b"x=1")
    assert status == 200
    rec = upstream.requests[-1]
    assert (rec.method, rec.path, rec.body) == (method, "/v1/files/file-1", b"x=1")
    assert body == _echo_bytes(upstream)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_large_binary_body_streams_both_ways(upstream, proxy, chunked):
    # Over 1 MiB: the proxy streams the request body and the (larger) echoed response.
    raw = os.urandom(1_300_000) + b"\xff\xfe"

    async def gen():
        for i in range(0, len(raw), 100_000):
            yield raw[i : i + 100_000]

    status, headers, body = await post(proxy, gen() if chunked else raw, {"Content-Type": "application/octet-stream"},
                                       path="/audio/transcriptions?model=whisper-1")
    assert status == 200
    rec = upstream.requests[-1]
    assert rec.body == raw
    assert rec.raw_path == "/v1/audio/transcriptions?model=whisper-1"
    assert body == _echo_bytes(upstream)
    assert len(body) > 1 << 20
    if not chunked:  # a known size stays known: some upstreams refuse chunked uploads
        assert rec.headers["content-length"] == str(len(raw))
        assert "transfer-encoding" not in rec.headers


async def test_upstream_error_on_passthrough_route_unchanged(upstream, proxy):
    upstream.fail_status = 429
    upstream.retry_after = 7
    direct = await get(upstream, "/models")
    via = await get(proxy, "/models")
    assert via.status == direct.status == 429
    assert via.body == direct.body
    assert via.headers["Retry-After"] == "7"


async def test_upstream_compressed_body_is_relayed_as_sent(make_proxy):
    """auto_decompress is off: an encoded response goes back still encoded, with its header."""
    packed = gzip.compress(b'{"object":"list","data":[]}' * 100)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=packed, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    app = web.Application()
    app.router.add_get("/v1/vector_stores", handler)
    async with serving(app) as base:
        p = await make_proxy(base + "/v1")
        status, headers, body = await get(p, "/vector_stores", {"Accept-Encoding": "gzip"}, decompress=False)
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert body == packed
