"""Exact bytes (issue 19 item 9): a rewritten body keeps integers beyond 64 bits exactly, a body with
duplicate keys is refused with a 400 naming them, a bypassed body goes upstream byte for byte
however odd, and a request whose compacted form is not smaller is never `summarized`.
"""

from __future__ import annotations

import orjson
import pytest

from support.client import auth, post
from support.compaction_helpers import chat_history

MODEL = "gpt-4"
AUTH = {**auth(), "Content-Type": "application/json"}
SMALL = {"models": {MODEL: {"context_window": 6000}}, "compaction": {"prepare_percent": 0}}


async def test_integers_beyond_64_bits_survive_a_rewrite_exactly(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url, SMALL)
    msgs = chat_history(12, 150)
    tool = {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer", "maximum": 100}}}}}
    raw = orjson.dumps({"model": MODEL, "messages": msgs, "tools": [tool]}).replace(
        b'"model"', b'"seed":123456789012345678901234567890,"model"', 1).replace(
        b'"maximum":100', b'"maximum":100000000000000000000')
    status, headers, _ = await post(proxy, raw, AUTH)
    assert status == 200 and headers["x-compaction-status"] == "summarized"
    sent = upstream.records("chat")[-1].body
    assert b'"seed":123456789012345678901234567890' in sent
    assert b'"maximum":100000000000000000000' in sent
    assert b"e+" not in sent and b"e29" not in sent


@pytest.mark.parametrize("body, names", [
    (b'{"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}], "model": "gpt-4o"}', "'model'"),
    (b'{"model": "gpt-4", "messages": [{"role": "user", "content": "a", "content": "b"}]}', "'content'"),
    # spacing before the colon hides nothing
    (b'{"model" : "gpt-4", "stream": false, "messages": [{"role": "user", "content": "hi"}], "stream":true}', "'stream'"),
    # nor a quote written as \u0022 inside a key
    (b'{"model": "gpt-4", "a\\u0022": 1, "a\\"": 2, "messages": [{"role": "user", "content": "hi"}]}', "'a\"'"),
    # nor a colon written as \u003a, which the parsed body has one more of than the bytes: as many
    # colons on both sides as if no key had been dropped
    (b'{"model": "gpt-4", "stream": false, "x": "\\u003a", "messages": [{"role": "user", "content": "hi"}], '
     b'"stream": true}', "'stream'"),
    (b'{"model": "gpt-4", "k\\u003A": 1, "messages": [{"role": "user", "content": "hi"}], "k\\u003A": 2}', "'k:'"),
])
async def test_duplicate_keys_are_refused_naming_them(upstream, make_proxy, body, names):
    proxy = await make_proxy(upstream.base_url, SMALL)
    status, _, answer = await post(proxy, body, AUTH)
    err = orjson.loads(answer)["error"]
    assert status == 400 and err["code"] == "duplicate_keys" and names in err["message"], err
    assert upstream.records("chat") == []


@pytest.mark.parametrize("body", [
    b'{"model" : "gpt-4", "messages" : [{"role": "user", "content": "say \\"hi\\": now \\u0022x\\u0022"}]}',
    # escaped colons and what else starts so (Go writes < as \u003c), no key twice
    b'{"model":"gpt-4","messages":[{"role":"user","content":"a\\u003ab\\u003Ac \\u003ctag\\u003e: d"}]}',
])
async def test_spacing_and_escapes_without_duplicates_are_served(upstream, make_proxy, body):
    proxy = await make_proxy(upstream.base_url, SMALL)
    status, headers, _ = await post(proxy, body, AUTH)
    assert status == 200 and headers["x-compaction-status"] == "none"
    assert upstream.records("chat")[-1].body == body  # unchanged: the client's own bytes


@pytest.mark.parametrize("body", [
    b'{"model": "gpt-4", "messages": [{"role": "robot", "content": "\\ud800 lone surrogate"}]}',
    b'{"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}], "model": "other"}',
    b'{"model": 7, "messages": "not a list", "seed": 123456789012345678901234567890}',
    b'not json at all \x00\xff',
])
async def test_a_bypassed_body_is_forwarded_byte_for_byte_without_validation(upstream, make_proxy, body):
    proxy = await make_proxy(upstream.base_url, SMALL)
    status, headers, _ = await post(proxy, body, {**AUTH, "x-compaction-bypass": "1"})
    assert headers["x-compaction-status"] == "bypassed"
    assert upstream.records()[-1].body == body  # whatever the upstream makes of it
    assert status == upstream.records()[-1].status


async def test_a_newest_turn_over_the_window_is_never_summarized(upstream, make_proxy):
    """The history before it is tiny, so its summary is larger than what it replaces: what would be
    forwarded is not smaller, so the original goes (the upstream's own overflow answer follows)."""
    proxy = await make_proxy(upstream.base_url, {**SMALL, "compaction": {"prepare_percent": 0, "keep_recent_tokens": 0}})
    msgs = chat_history(2, 10)
    msgs[-1]["content"] = "Read this: " + " ".join(f"word{i}" for i in range(7000))
    raw = orjson.dumps({"model": MODEL, "messages": msgs})
    status, headers, _ = await post(proxy, raw, AUTH)
    assert headers["x-compaction-status"] != "summarized", dict(headers)
    assert int(headers["x-compaction-tokens-after"]) <= int(headers["x-compaction-tokens-before"])
    assert upstream.records("chat")[0].body == raw
