"""Hostile input against the running server (issue 7 item 3): a hand-written corpus and hypothesis
fuzzing over raw HTTP. Every answer is a 4xx (OpenAI-shaped when the request got as far as the API)
or a valid forward; never a 5xx, never a crash; and the server keeps serving afterwards.

HTTP-level garbage (a request line or header over server.max_header_kb, more than 128 headers, a
broken chunked encoding) never reaches the application: aiohttp's HTTP parser refuses it with a
plain-text 400/431 and closes the connection. Everything that parses as HTTP gets the OpenAI shape.
"""

from __future__ import annotations

import json

import asyncio
from typing import Any, AsyncIterator

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.client import auth, post, raw_http, split_response

BOUND_S = 30
MAX_BODY = 2 * 1024 * 1024
SETTINGS = {
    "server": {"max_body_mb": MAX_BODY / 1024 / 1024, "max_header_kb": 16},
    "tool_results": {"threshold_tokens": 2000},
    "compaction": {"prepare_percent": 0},
}
M = "gpt-4o"


def user(content: Any = "hi") -> dict[str, Any]:
    return {"role": "user", "content": content}


VALID = {
    "model": M,
    "messages": [
        {"role": "system", "content": "You are an agent."},
        user("Find order 42."),
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "find_order", "arguments": '{"id": 42}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "order 42: shipped"},
        user([{"type": "text", "text": "And its invoice?"}]),
    ],
    "tools": [{"type": "function", "function": {"name": "find_order", "parameters": {"type": "object"}}}],
    "temperature": 0.2,
}


@pytest.fixture
async def target(upstream, make_proxy):
    upstream.reply = "fine"
    proxy = await make_proxy(upstream.base_url, SETTINGS)
    yield proxy
    # The server keeps serving after whatever the test sent it.
    status, _, body = await post(proxy, orjson.dumps({"model": M, "messages": [user("still there?")]}), AUTH)
    assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"] == "fine"


AUTH = auth()  # an anonymous request is not compacted


def assert_fine(status: int, body: bytes, *, http_level: bool = False) -> None:
    """A 2xx forward or a 4xx error; OpenAI's shape unless the HTTP parser itself refused."""
    assert status < 500, (status, body[:300])
    assert b"Traceback" not in body
    if status >= 400 and not http_level:
        err = orjson.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def body_with(**fields: Any) -> bytes:
    return orjson.dumps({**VALID, **fields})


CORPUS: dict[str, tuple[bytes, int | None]] = {
    # id: (body, expected status or None for "any 2xx/4xx")
    "empty": (b"", 400),
    "whitespace": (b" \n\t ", 400),
    "truncated": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"', 400),
    "single-quotes": (b"{'model': 'gpt-4o'}", 400),
    "trailing-comma": (b'{"model": "gpt-4o", "messages": [],}', 400),
    "nan": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400),
    "infinity-number": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "temperature": 1e400}', 400),
    "bom": (b"\xef\xbb\xbf" + body_with(), None),
    "binary": (bytes(range(256)), 400),
    "invalid-utf8": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\xc3\x28"}]}', 400),
    "overlong-utf8": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\xc0\xaf"}]}', 400),
    "lone-surrogate": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\\ud800"}]}', 400),
    "nul-in-string": (body_with(messages=[user("a\u0000b")]), 200),
    "deep-100000-arrays": (nested(100_000), 400),
    "deep-1000-in-content": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": ' + nested(1000) + b"}]}", 400),
    "deep-300-in-metadata": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "metadata": '
                             + nested(300) + b"}", 400),
    "deep-300-in-a-tool-schema": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "tools": ['
                                  + b'{"type": "function", "function": {"name": "f", "parameters": ' + nested(300)
                                  + b"}}]}", 400),
    "deep-300-in-a-content-part": (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": [{"type": "image_url",'
                                   + b' "image_url": ' + nested(300) + b"}]}]}", 400),
    "array-body": (b"[1, 2, 3]", 400),
    "number-body": (b"42", 400),
    "null-body": (b"null", 400),
    "unknown-role": (body_with(messages=[user(), {"role": "root", "content": "obey"}]), 400),
    "role-object": (body_with(messages=[{"role": {"name": "system"}, "content": "x"}]), 400),
    "tool-without-call": (body_with(messages=[user(), {"role": "tool", "tool_call_id": "nope", "content": "r"}]), 400),
    "tool-first": (body_with(messages=[{"role": "tool", "tool_call_id": "c", "content": "r"}]), 400),
    "unanswered-call": (body_with(messages=[user(), VALID["messages"][2], user("next")]), 400),
    "call-function-null": (body_with(messages=[user(), {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": None}]}, {"role": "tool", "tool_call_id": "c", "content": "r"}]), 400),
    "tools-not-objects": (body_with(tools=[1, "two", None]), 400),
    "content-parts-junk": (body_with(messages=[user([{"type": "image_url"}, {"type": "input_audio", "x": [1]}])]), None),
    "huge-number": (body_with(temperature="T").replace(b'"T"', b"1" + b"0" * 400), 400),
    "duplicate-keys": (b'{"model": "x", "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}', 400),
    "huge-string": (body_with(messages=[user("lorem ipsum " * 150_000)]), None),
    "huge-tool-output": (body_with(messages=VALID["messages"][:3] + [
        {"role": "tool", "tool_call_id": "call_1", "content": "row\n" * 400_000}]), 200),
    "huge-image-url": (body_with(messages=[user([{"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + "A" * 1_500_000}}])]), 200),
    "many-messages": (orjson.dumps({"model": M, "messages": [user(str(i)) if i % 2 == 0 else
                                                             {"role": "assistant", "content": str(i)}
                                                             for i in range(10_001)]}), None),
    "many-tool-calls": (body_with(messages=[user(), {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in range(3000)]}]
        + [{"role": "tool", "tool_call_id": f"c{i}", "content": "ok"} for i in range(3000)]), 200),
    "over-the-body-limit": (body_with(messages=[user("x" * MAX_BODY)]), 413),
}


@pytest.mark.parametrize("case", list(CORPUS))
async def test_corpus(target, upstream, case):
    body, expected = CORPUS[case]
    status, headers, answer = await post(target, body, {**AUTH, "Content-Type": "application/json"})
    assert_fine(status, answer)
    if expected is not None:
        assert status == expected, answer[:300]
    if status >= 400 and not upstream.requests:
        assert headers.get("x-compaction-status") is None  # refused before any work


async def test_exactly_one_level_under_the_nesting_limit_is_accepted(target, upstream):
    """254 levels is what orjson writes: the deepest body the proxy can re-send, and it does."""
    status, _, _ = await post(target, b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "x": '
                              + nested(253) + b"}", AUTH)
    assert status == 200
    status, _, _ = await post(target, b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}], "x": '
                              + nested(254) + b"}", AUTH)
    assert status == 400


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_slow_drip_body_is_served_and_blocks_no_one(target, chunked):
    body = orjson.dumps({"model": M, "messages": [user("dripped " * 200)]})
    pieces = [body[i : i + len(body) // 20 + 1] for i in range(0, len(body), len(body) // 20 + 1)]
    halfway, quick_served = asyncio.Event(), asyncio.Event()

    async def drip() -> AsyncIterator[bytes]:
        for i, p in enumerate(pieces):
            if i == len(pieces) // 2:
                halfway.set()
                # the rest only once the other client was answered: however slowly a loaded
                # machine serves it, it is served while this body is still arriving
                await quick_served.wait()
            yield p
            await asyncio.sleep(0.02)

    headers = {} if chunked else {"Content-Length": str(len(body))}
    slow = asyncio.create_task(post(target, drip(), {**AUTH, **headers}))
    await asyncio.wait_for(halfway.wait(), BOUND_S)
    # meanwhile another client is served
    quick = post(target, orjson.dumps({"model": M, "messages": [user("quick")]}), AUTH)
    status, _, _ = await asyncio.wait_for(quick, BOUND_S)
    assert status == 200 and not slow.done()
    quick_served.set()
    status, _, answer = await slow
    assert status == 200 and orjson.loads(answer)["choices"][0]["message"]["content"] == "fine"


async def test_a_body_slower_than_the_body_timeout_gets_408(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, {"server": {"body_timeout_s": 0.3}})
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.server.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n{\"model\": ")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
    assert head.startswith(b"HTTP/1.1 408")
    length = int(next(l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")).split(b":")[1])
    error = orjson.loads(await asyncio.wait_for(reader.readexactly(length), BOUND_S))["error"]
    assert error["code"] == "request_timeout" and "0.3 s" in error["message"]
    writer.close()
    assert not upstream.requests


@pytest.mark.parametrize("declared", [100, 10_000_000], ids=["short-body", "length-over-limit"])
async def test_a_body_shorter_than_its_content_length_then_a_hang_up(target, upstream, declared):
    reader, writer = await asyncio.open_connection("127.0.0.1", target.server.port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {declared}\r\n\r\n".encode() + b'{"model": ')
    await writer.drain()
    if declared > MAX_BODY:  # refused on the declared length, before reading any of it
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND_S)
        assert answer.startswith(b"HTTP/1.1 413 ")
    writer.close()
    await asyncio.sleep(0.1)
    assert upstream.requests == []


@pytest.mark.parametrize("request_bytes", [
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(200)) + b"\r\n",
    b"GET /v1/" + b"m" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + b"X" * 20_000 + b": v\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\nabcde",
    b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Bad: a\x00b\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS hello on the plain port
], ids=["header-value-20k", "200-headers", "request-line-20k", "header-name-20k", "bad-chunk-size",
        "conflicting-lengths", "nul-in-header", "tls-hello"])
async def test_http_level_garbage_is_a_4xx_and_reaches_no_one(target, upstream, request_bytes):
    status, body = split_response(await raw_http(target.server.port, request_bytes, timeout=BOUND_S))
    assert 400 <= status < 500
    assert_fine(status, body, http_level=True)
    assert upstream.requests == []


# -- hypothesis: wrong types at every level of a valid body ------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


def _paths(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, at + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, at + (i,))
    return out


def _replace(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[path[0]] = _replace(node[path[0]], path[1:], value)
    return copy


@st.composite
def mutated(draw: Any) -> Any:
    body: Any = VALID
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(body)))
        body = _replace(body, path, draw(_json))
    return body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(body=mutated())
async def test_fuzz_wrong_types_at_every_level(target, body):
    status, _, answer = await post(target, orjson.dumps(body), AUTH)
    assert_fine(status, answer)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
async def test_fuzz_raw_bytes(target, data):
    status, _, answer = await post(target, data, AUTH)
    assert_fine(status, answer)


async def test_a_message_too_deep_to_write_inside_a_body_is_still_compacted(upstream, make_proxy):
    """A message 254 levels deep can be written alone (it passes) but not inside a body orjson
    writes whole. A rewritten body carries each kept message as the bytes written for it at parse,
    so the request is compacted all the same and the deep message goes upstream intact."""
    from support.compaction_helpers import chat_history

    proxy = await make_proxy(upstream.base_url, {"models": {"gpt-4": {"context_window": 6000}},
                                                 "compaction": {"prepare_percent": 0}})
    messages = chat_history(12, 150)
    deep = b'{"role": "user", "content": [{"type": "text", "text": "and this", "x": ' + nested(251) + b"}]}"
    raw = orjson.dumps({"model": "gpt-4", "messages": messages})[:-2] + b", " + deep + b"]}"
    status, headers, _ = await post(proxy, raw, AUTH)
    assert status == 200 and headers["x-compaction-status"] == "summarized"
    sent = upstream.records("chat")[-1].body
    assert sent != raw and json.loads(sent)["messages"][-1] == json.loads(deep)
