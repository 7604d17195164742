"""Everything under /v1/ other than chat completions passes through byte-identical, both ways.

Raw aiohttp clients send exact bytes (and exact, percent-encoded URLs); the fake upstream records
exactly what it received. The answer the client gets is compared with what the upstream sent.
"""

from __future__ import annotations

import base64
import gzip
import os

import aiohttp
import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.fake_upstream import FakeUpstream, _utf8_or_none


async def _get(session: aiohttp.ClientSession, url: str, **kw) -> tuple[int, bytes, CIMultiDict[str]]:
    async with session.get(URL(url, encoded=True), **kw) as r:
        return r.status, await r.read(), CIMultiDict(r.headers)


async def _post(session: aiohttp.ClientSession, url: str, **kw) -> tuple[int, bytes, CIMultiDict[str]]:
    async with session.post(URL(url, encoded=True), **kw) as r:
        return r.status, await r.read(), CIMultiDict(r.headers)


def _echo_bytes(fake: FakeUpstream) -> bytes:
    """What the fake sent for its last echoed request (its echo is a function of what it received)."""
    rec = fake.requests[-1]
    echo = {
        "method": rec.method,
        "path": rec.path,
        "raw_path": rec.raw_path,
        "query": rec.query_string,
        "headers": rec.headers,
        "body_text": _utf8_or_none(rec.body),
        "body_b64": base64.b64encode(rec.body).decode(),
    }
    return orjson.dumps(echo, option=orjson.OPT_INDENT_2)


async def test_models_list_and_item_are_identical_to_direct(upstream, proxy):
    async with aiohttp.ClientSession() as s:
        direct = await _get(s, upstream.base_url + "/models")
        via = await _get(s, proxy.base_url + "/models")
        assert via[0] == direct[0] == 200
        assert via[1] == direct[1]
        direct_item = await _get(s, upstream.base_url + "/models/gpt-4o")
        via_item = await _get(s, proxy.base_url + "/models/gpt-4o")
        assert via_item[:2] == direct_item[:2]
        missing = await _get(s, proxy.base_url + "/models/nope")
        assert missing[0] == 404 and orjson.loads(missing[1])["error"]["code"] == "model_not_found"
    # The upstream's own response headers come back to the client; its request id under
    # x-upstream-request-id, since x-request-id names the proxy's request (its access log line).
    assert via[2]["openai-version"] == "2020-10-01"
    assert via[2]["x-upstream-request-id"].startswith("req_")
    assert not via[2]["x-request-id"].startswith("req_")
    assert via[2]["Content-Type"] == "application/json"


async def test_embeddings_request_and_response_bytes_identical(upstream, proxy):
    # Odd spacing and key order: any re-serialization by the proxy would show.
    raw = b'{ "model" : "text-embedding-3-small",\n  "input": ["caf\\u00e9", "b"],  "dimensions": 4 }'
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-emb"}
    async with aiohttp.ClientSession() as s:
        direct = await _post(s, upstream.base_url + "/embeddings", data=raw, headers=headers)
        via = await _post(s, proxy.base_url + "/embeddings", data=raw, headers=headers)
    assert via[0] == direct[0] == 200
    assert via[1] == direct[1]
    assert [r.body for r in upstream.requests] == [raw, raw]


async def test_arbitrary_responses_body_and_query_pass_through(upstream, proxy):
    raw = b'{"model":"gpt-4o","input":[{"role":"user","content":"hi \xe2\x9c\x93"}],"x":  [1,2 ,3]}'
    # Percent-encoded bytes in path and query must arrive exactly as the client wrote them.
    target = "/responses/resp%2Fabc?api-version=2024-10-01&q=a%2Bb%20c&empty=&flag"
    async with aiohttp.ClientSession() as s:
        status, body, headers = await _post(
            s, proxy.base_url + target, data=raw, headers={"Content-Type": "application/json"}
        )
    assert status == 200
    rec = upstream.requests[-1]
    assert rec.method == "POST"
    assert rec.raw_path == "/v1" + target
    assert rec.body == raw
    assert headers["x-upstream-echo"] == "1"
    assert body == _echo_bytes(upstream)


async def test_get_with_query_passes_through(upstream, proxy):
    async with aiohttp.ClientSession() as s:
        status, body, _ = await _get(s, proxy.base_url + "/files?purpose=fine-tune&limit=2&after=file%3Dx")
    assert status == 200
    rec = upstream.requests[-1]
    assert rec.method == "GET" and rec.raw_path == "/v1/files?purpose=fine-tune&limit=2&after=file%3Dx"
    assert rec.body == b""
    assert body == _echo_bytes(upstream)


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
async def test_other_methods_pass_through(upstream, proxy, method):
    async with aiohttp.ClientSession() as s:
        async with s.request(method, proxy.base_url + "/files/file-1", data=b"x=1") as r:
            assert r.status == 200
            body = await r.read()
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

    async with aiohttp.ClientSession() as s:
        status, body, headers = await _post(
            s,
            proxy.base_url + "/audio/transcriptions?model=whisper-1",
            data=gen() if chunked else raw,
            headers={"Content-Type": "application/octet-stream"},
        )
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
    async with aiohttp.ClientSession() as s:
        direct = await _get(s, upstream.base_url + "/models")
        via = await _get(s, proxy.base_url + "/models")
    assert via[0] == direct[0] == 429
    assert via[1] == direct[1]
    assert via[2]["Retry-After"] == "7"


async def test_upstream_compressed_body_is_relayed_as_sent(make_proxy):
    """auto_decompress is off: an encoded response goes back still encoded, with its header."""
    packed = gzip.compress(b'{"object":"list","data":[]}' * 100)

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=packed, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})

    app = web.Application()
    app.router.add_get("/v1/vector_stores", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        p = await make_proxy(f"http://127.0.0.1:{runner.addresses[0][1]}/v1")
        async with aiohttp.ClientSession(auto_decompress=False) as s:
            status, body, headers = await _get(s, p.base_url + "/vector_stores", headers={"Accept-Encoding": "gzip"})
    finally:
        await runner.cleanup()
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert body == packed
