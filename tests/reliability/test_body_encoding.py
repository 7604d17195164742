"""Compressed request bodies (issue 14 item 6, design.md § Responses API): zstd, gzip, deflate and br decoded on
the routes the proxy reads, forwarded decoded with a right Content-Length; the size limit on the
decoded size, a bomb refused before it is inflated whole; pass-through routes forward the client's
bytes with their Content-Encoding."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import brotli
import orjson
import pytest
import zstandard

from proxy import bodycoding, errors
from support.client import auth, post

BODY = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hello " * 300}]})
JSON = {"Content-Type": "application/json"}


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(wbits=-15)
    return c.compress(data) + c.flush()


ENCODERS = {
    "zstd": zstandard.ZstdCompressor().compress,
    "gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
}


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_each_coding_decodes(coding: str) -> None:
    assert bodycoding.decode(ENCODERS[coding](BODY), coding, 1 << 20) == BODY


def test_raw_deflate_and_streamed_zstd_without_content_size() -> None:
    assert bodycoding.decode(_raw_deflate(BODY), "deflate", 1 << 20) == BODY
    # Codex compresses as a stream: the frame does not say its size.
    streamed = zstandard.ZstdCompressor(write_content_size=False).compressobj()
    data = streamed.compress(BODY) + streamed.flush()
    assert bodycoding.decode(data, "zstd", 1 << 20) == BODY


def test_stacked_codings_are_undone_last_first() -> None:
    data = brotli.compress(gzip.compress(BODY))
    assert bodycoding.decode(data, "gzip, br", 1 << 20) == BODY
    assert bodycoding.decode(gzip.compress(BODY) + gzip.compress(b"tail"), "gzip", 1 << 20) == BODY + b"tail"
    assert bodycoding.decode(BODY, "identity", 10 << 20) == BODY


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_a_bomb_is_refused_without_inflating_it(coding: str) -> None:
    inflated = 64 << 20  # zeros: each coding shrinks them to a few KiB or less
    bomb = ENCODERS[coding](bytes(inflated))
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(errors.ProxyError) as e:
            bodycoding.decode(bomb, coding, 1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.status == 413 and e.value.code == "request_too_large"
    assert peak < 8 << 20, f"{coding}: {peak} bytes held to refuse a bomb"


def test_the_limit_is_on_the_decoded_size() -> None:
    data = ENCODERS["zstd"](BODY)
    assert bodycoding.decode(data, "zstd", len(BODY)) == BODY
    with pytest.raises(errors.ProxyError) as e:
        bodycoding.decode(data, "zstd", len(BODY) - 1)
    assert e.value.status == 413


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_corrupt_or_cut_bodies_are_a_400(coding: str) -> None:
    good = ENCODERS[coding](BODY)
    for bad in (b"this is not compressed at all", good[: len(good) // 2]):
        with pytest.raises(errors.ProxyError) as e:
            bodycoding.decode(bad, coding, 1 << 20)
        assert e.value.status == 400 and e.value.code == "invalid_body_encoding", (coding, bad[:10])


def test_an_unknown_coding_is_a_415() -> None:
    with pytest.raises(errors.ProxyError) as e:
        bodycoding.decode(BODY, "compress", 1 << 20)
    assert e.value.status == 415 and e.value.code == "unsupported_content_encoding"


# ---- through the proxy ------------------------------------------------------------------------


@pytest.mark.parametrize("coding", sorted(ENCODERS))
async def test_chat_body_is_forwarded_decoded(upstream, proxy, coding: str) -> None:
    answer = await post(proxy, ENCODERS[coding](BODY), {"Content-Encoding": coding, **JSON, **auth("sk-test")},
                        expect=200)
    assert answer.compaction == "none"
    rec = upstream.requests[-1]
    assert rec.body == BODY  # nothing to change: the decoded bytes, exactly
    assert "content-encoding" not in rec.headers
    assert rec.headers["content-length"] == str(len(BODY))


async def test_a_bomb_on_the_chat_route_is_a_413_and_never_forwarded(upstream, make_proxy) -> None:
    proxy = await make_proxy(upstream.base_url, {"server": {"max_body_mb": 1}})
    bomb = await post(proxy, ENCODERS["zstd"](bytes(64 << 20)), {"Content-Encoding": "zstd", **JSON}, expect=413)
    assert bomb.json()["error"]["code"] == "request_too_large"
    unknown = await post(proxy, BODY, {"Content-Encoding": "compress", **JSON}, expect=415)
    assert unknown.json()["error"]["code"] == "unsupported_content_encoding"
    assert not [r for r in upstream.requests if r.path.endswith("/chat/completions")]


async def test_pass_through_routes_forward_the_clients_bytes_and_encoding(upstream, proxy) -> None:
    data = gzip.compress(b'{"model": "text-embedding-3-small", "input": "hello"}')
    await post(proxy, data, {"Content-Encoding": "gzip", **JSON, **auth("sk-test")}, path="/embeddings")
    rec = upstream.requests[-1]
    assert rec.path == "/v1/embeddings"
    assert rec.headers.get("content-encoding") == "gzip"
    # The fake (aiohttp, decoding as servers do) read the JSON the client compressed.
    assert rec.json == {"model": "text-embedding-3-small", "input": "hello"}


def test_past_the_budget_a_layer_is_left_for_elsewhere_and_past_the_limit_refused() -> None:
    data = brotli.compress(gzip.compress(BODY))
    with pytest.raises(bodycoding.OverBudget):
        bodycoding.decode(data, "gzip, br", 1 << 20, budget=len(BODY) - 1)
    assert bodycoding.decode(data, "gzip, br", 1 << 20, budget=len(BODY)) == BODY
    with pytest.raises(errors.ProxyError) as e:  # a budget over the limit: the limit decides
        bodycoding.decode(data, "gzip, br", len(BODY) - 1, budget=1 << 20)
    assert e.value.status == 413


def test_gzip_members_and_padding_in_slices() -> None:
    # The zlib input goes in slices: members that cross a slice's end, and zeros after the last.
    members = b"".join(gzip.compress(bytes([65 + i % 26]) * 70_000, compresslevel=0) for i in range(5))
    assert bodycoding.decode(members + bytes(100), "gzip", 1 << 20) == b"".join(
        bytes([65 + i]) * 70_000 for i in range(5))
    with pytest.raises(errors.ProxyError) as e:
        bodycoding.decode(members + b"\x00\x01", "gzip", 1 << 20)
    assert e.value.status == 400
