"""Every error the proxy makes, through raw HTTP: the status, OpenAI's error shape, a message (and
param) naming what is wrong, and never a 500 or a traceback."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.protocols.chat.body import parse_chat_body
from support.compaction_helpers import analyze
from aiohttp.client_reqrep import ConnectionKey
from proxy.errors import ProxyError
from proxy.forward import map_client_error
from proxy.tokens import MESSAGE_OVERHEAD, REPLY_OVERHEAD, TokenCounter
from support.client import get, http, post, raw_http


def _assert_openai_error(body: bytes) -> dict[str, Any]:
    parsed = orjson.loads(body)
    assert set(parsed) == {"error"}
    err = parsed["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    assert "Traceback" not in err["message"]
    return err


def _user(content: Any = "hi") -> dict[str, Any]:
    return {"role": "user", "content": content}


M = "gpt-4o"
BAD_BODIES = [
    # (id, raw body, expected param, words the message must contain)
    ("empty", b"", None, "empty"),
    ("invalid-json", b'{"model": "gpt-4o", "messages": [', None, "not valid JSON"),
    ("trailing-garbage", b'{"model": "gpt-4o", "messages": []} x', None, "not valid JSON"),
    ("not-utf8", b'{"model": "\xff"}', None, "not valid JSON"),
    ("array-body", b"[1, 2]", None, "JSON object"),
    ("string-body", b'"hello"', None, "JSON object"),
    ("empty-model", {"model": "", "messages": [_user()]}, "model", "non-empty"),
    ("model-number", {"model": 4, "messages": [_user()]}, "model", "got number"),
    ("missing-messages", {"model": M}, "messages", "'messages'"),
    ("messages-null", {"model": M, "messages": None}, "messages", "'messages'"),
    ("messages-object", {"model": M, "messages": {"role": "user"}}, "messages", "'messages'"),
    ("messages-string", {"model": M, "messages": "hi"}, "messages", "'messages'"),
    ("messages-empty", {"model": M, "messages": []}, "messages", "at least one"),
    ("message-not-object", {"model": M, "messages": ["hi"]}, "messages[0]", "messages[0]"),
    ("role-missing", {"model": M, "messages": [{"content": "hi"}]}, "messages[0].role", "role"),
    ("role-number", {"model": M, "messages": [{"role": 1, "content": "hi"}]}, "messages[0].role", "role"),
    ("role-unknown", {"model": M, "messages": [_user(), {"role": "robot", "content": "x"}]}, "messages[1].role", "robot"),
    ("content-number", {"model": M, "messages": [_user(5)]}, "messages[0].content", "content"),
    ("content-object", {"model": M, "messages": [_user({"text": "x"})]}, "messages[0].content", "content"),
    ("content-part-string", {"model": M, "messages": [_user(["hi"])]}, "messages[0].content[0]", "content[0]"),
    ("content-part-text-number", {"model": M, "messages": [_user([{"type": "text", "text": 1}])]},
     "messages[0].content[0].text", "text"),
    ("tool-calls-object", {"model": M, "messages": [_user(), {"role": "assistant", "tool_calls": {"id": "a"}}]},
     "messages[1].tool_calls", "tool_calls"),
    ("tool-call-no-id", {"model": M, "messages": [_user(), {"role": "assistant", "tool_calls": [{"type": "function"}]}]},
     "messages[1].tool_calls[0]", "tool_calls[0]"),
    ("tool-call-args-object", {"model": M, "messages": [_user(), {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]},
     "messages[1].tool_calls[0].function", "arguments"),
    ("tool-call-id-missing", {"model": M, "messages": [_user(), {"role": "tool", "content": "r"}]},
     "messages[1].tool_call_id", "tool_call_id"),
    ("tool-call-id-number", {"model": M, "messages": [_user(), {"role": "tool", "tool_call_id": 7, "content": "r"}]},
     "messages[1].tool_call_id", "tool_call_id"),
    ("name-number", {"model": M, "messages": [{"role": "user", "name": 3, "content": "x"}]}, "messages[0].name", "name"),
    ("stream-string", {"model": M, "messages": [_user()], "stream": "yes"}, "stream", "'stream'"),
    ("tools-object", {"model": M, "messages": [_user()], "tools": {"type": "function"}}, "tools", "'tools'"),
]


@pytest.mark.parametrize("raw,param,words", [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES])
async def test_bad_chat_body_is_400_naming_the_field(upstream, proxy, raw, param, words):
    data = raw if isinstance(raw, bytes) else orjson.dumps(raw)
    status, headers, body = await post(proxy, data, {"Content-Type": "application/json"})
    assert status == 400
    assert headers["Content-Type"].startswith("application/json")
    err = _assert_openai_error(body)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert words in err["message"]
    assert upstream.requests == []  # the proxy answered itself


@pytest.mark.parametrize("path", ["/chat/completions", "/embeddings"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_body_over_limit_is_413(upstream, make_proxy, path, chunked):
    p = await make_proxy(upstream.base_url, {"server": {"max_body_mb": 0.01}})  # 10485 bytes
    raw = orjson.dumps({"model": "gpt-4o", "messages": [_user("x" * 20_000)]})

    async def gen():
        for i in range(0, len(raw), 4096):
            yield raw[i : i + 4096]
            await asyncio.sleep(0)

    status, _, body = await post(p, gen() if chunked else raw, path=path)
    assert status == 413
    err = _assert_openai_error(body)
    assert err["code"] == "request_too_large"
    assert all(r.path != "/v1" + path or r.body != raw for r in upstream.requests)
    # Just under the limit is fine.
    small = orjson.dumps({"model": "gpt-4o", "messages": [_user("x" * 9_000)]})
    ok, _, _ = await post(p, gen_of(small) if chunked else small, path=path)
    assert ok == 200 or path == "/embeddings" and ok == 400  # the fake judges the embeddings body


def gen_of(raw: bytes):
    async def gen():
        for i in range(0, len(raw), 4096):
            yield raw[i : i + 4096]

    return gen()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("path,stream", [("/chat/completions", False), ("/chat/completions", True), ("/models", False)])
async def test_unreachable_upstream_is_502(make_proxy, path, stream):
    port = _closed_port()
    p = await make_proxy(f"http://127.0.0.1:{port}/v1")
    data = orjson.dumps({"model": "gpt-4o", "messages": [_user()], "stream": stream})
    status, headers, body = await (post(p, data, path=path) if "chat" in path else get(p, path))
    assert status == 502
    err = _assert_openai_error(body)
    assert (err["type"], err["code"]) == ("upstream_error", "upstream_unreachable")
    # which address failed, and why: what an operator with a wrong base_url needs first
    assert err["message"] == f"Upstream unreachable: cannot connect to 127.0.0.1:{port} (connection refused)"
    if "chat" in path:
        assert headers["x-compaction-status"] == "none"
        assert int(headers["x-compaction-tokens-before"]) > 0


def test_an_unresolved_upstream_host_is_named_with_the_reason():
    key = ConnectionKey("api.example.invalid", 443, True, True, None, None, None)
    e = aiohttp.ClientConnectorError(key, socket.gaierror(-2, "Name or service not known"))
    assert map_client_error(e).message == (
        "Upstream unreachable: cannot connect to api.example.invalid:443 (the host name did not resolve)"
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_upstream_timeout_is_504(upstream, make_proxy, stream):
    p = await make_proxy(upstream.base_url, {"upstream": {"timeout_s": 0.3, "stream_idle_timeout_s": 0.3}})
    upstream.stall_before_headers_s = 30
    status, headers, body = await post(p, orjson.dumps({"model": "gpt-4o", "messages": [_user()], "stream": stream}))
    assert status == 504
    err = _assert_openai_error(body)
    assert (err["type"], err["code"]) == ("upstream_error", "upstream_timeout")
    assert headers["x-compaction-status"] == "none"


async def test_passthrough_upstream_timeout_is_504(upstream, make_proxy):
    p = await make_proxy(upstream.base_url, {"upstream": {"stream_idle_timeout_s": 0.3}})
    upstream.stall_before_headers_s = 30
    status, _, body = await get(p, "/models")
    assert status == 504
    assert _assert_openai_error(body)["code"] == "upstream_timeout"


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/", 404), ("GET", "/chat/completions", 404), ("POST", "/v2/chat/completions", 404),
    ("GET", "/healthz/x", 404), ("POST", "/healthz", 405),
])
async def test_routes_outside_v1_are_openai_shaped(upstream, proxy, method, path, status):
    got, _, body = await http(method, proxy.root + path)
    assert got == status
    _assert_openai_error(body)
    assert upstream.requests == []


async def test_healthz(proxy):
    answer = await get(proxy.root, "/healthz")
    assert answer.status == 200
    assert answer.json()["status"] == "ok"


async def test_malformed_upstream_json_is_a_502_not_500(upstream, proxy):
    """A 200 whose JSON does not parse is a broken answer, not the upstream's error: the client gets
    an OpenAI-shaped 502 (which its SDK retries), never a body it fails to decode, never a 500."""
    upstream.malformed_json = True
    status, headers, body = await post(proxy, orjson.dumps({"model": "gpt-4o", "messages": [_user()]}))
    assert status == 502
    assert headers["x-compaction-status"] == "none"
    err = _assert_openai_error(body)
    assert (err["type"], err["code"]) == ("upstream_error", "bad_upstream_response")


# Fuzz: any JSON value as a chat body is either accepted (and countable) or refused with a 400 - a
# crash here would be a 500 for the client.
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
_part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio", "x", 3])}, optional={
    "text": _json, "image_url": _json})
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "x", None, 1])},
    optional={"content": st.one_of(_json, st.lists(_part | _json, max_size=3)), "name": _json, "tool_call_id": _json,
              "tool_calls": st.lists(st.fixed_dictionaries({"id": _json}, optional={"function": _json, "type": _json}),
                                     max_size=2) | _json},
)
_body = st.fixed_dictionaries(
    {"model": st.sampled_from(["gpt-4o", "gpt-4", "o3-mini", "llama/x", "", None, 7])},
    optional={"messages": st.lists(_message, max_size=4) | _json, "tools": _json, "stream": _json},
)
_COUNTER = TokenCounter()
# Bodies a client may send: without them the random ones above are (nearly) never accepted, and
# the accepting branch below would go untested.
_words = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
_valid_message = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "developer", "user", "assistant"]),
    "content": _words | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _words}), min_size=1, max_size=3),
})
_valid_body = st.fixed_dictionaries({"model": st.sampled_from(["gpt-4o", "gpt-4", "o3-mini", "llama/x"]),
                                     "messages": st.lists(_valid_message, min_size=1, max_size=4)})


def _text_tokens(msg: dict[str, Any], encoding: str) -> int:
    """The tokens of a message's text content, part by part."""
    content = msg.get("content")
    if isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)]
    else:
        parts = []
    return sum(_COUNTER.count_text(t, encoding) for t in parts)


def _check_body(raw: bytes) -> bool:
    """Accepted and countable (True), or refused with a 400 (False); anything else fails."""
    try:
        parsed = parse_chat_body(raw)
        # each message is checked when first seen, by analyze: parse + analyze is the whole check
        conv = analyze(parsed, _COUNTER, ratio=1.0)
    except ProxyError as e:
        assert e.status == 400 and e.message
        return False
    # Countable: every message counted, each at least its framing and its text (a total above 0 is
    # no check: the reply's priming alone makes it 3).
    messages = parsed["messages"]
    tokens = conv.conversation.tokens
    assert len(tokens) == len(messages) >= 1
    for m, n in zip(messages, tokens):
        assert n >= MESSAGE_OVERHEAD + _text_tokens(m, conv.encoding), m
    assert conv.total() >= REPLY_OVERHEAD + sum(tokens)
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_valid_body | _body | _json)
def test_fuzz_chat_body_is_accepted_or_400(body):
    try:
        raw = orjson.dumps(body)
    except orjson.JSONEncodeError:  # integers beyond 64 bits: not a body a client can send as JSON here
        return
    _check_body(raw)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_valid_body)
def test_fuzz_valid_chat_body_is_accepted_and_counted(body):
    assert _check_body(orjson.dumps(body)), body


async def test_oversized_header_is_refused_without_500(upstream, make_proxy):
    p = await make_proxy(upstream.base_url, {"server": {"max_header_kb": 8}})
    status, _, body = await get(p, "/models", {"X-Big": "a" * 16_000})
    assert (await get(p, "/models", {"X-Big": "a" * 4_000})).status == 200
    assert 400 <= status < 500
    assert b"Traceback" not in body
    assert upstream.requests[0].headers["x-big"] == "a" * 4_000 and len(upstream.requests) == 1


@pytest.mark.parametrize("target", ["/v1/../secret", "/v1/%2e%2e/admin", "/v1/models/..%2f..%2fadmin", "/v1/./models"])
async def test_dot_segments_never_reach_the_upstream(upstream, proxy, target):
    """A raw request line (HTTP clients normalize such URLs away): a path that would leave the
    configured base URL once normalized upstream is refused, not forwarded."""
    raw = await raw_http(proxy.server.port, f"GET {target} HTTP/1.1\r\nHost: proxy\r\nConnection: close\r\n\r\n".encode(),
                         timeout=10)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert _assert_openai_error(body)["code"] == "invalid_path"
    assert upstream.requests == []


async def test_a_message_too_deep_to_write_is_refused_as_a_field_too_deep_is(upstream, proxy):
    """The adapter writes each message itself (so checks it), the body check the other fields: one
    400 either way, with the same words and code."""
    deep = "[" * 300 + "]" * 300
    said = []
    for raw in ('{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"metadata":' + deep + "}",
                '{"model":"gpt-4o","messages":[{"role":"user","content":' + deep + "}]}"):
        status, _, body = await post(proxy, raw.encode(), {"Content-Type": "application/json"})
        err = _assert_openai_error(body)
        assert status == 400 and "nested too deeply" in err["message"], err
        said.append((err["message"], err["code"]))
    assert said[0] == said[1] and said[0][1] == "too_deep"
    assert upstream.requests == []
