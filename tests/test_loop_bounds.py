"""No request holds the event loop (issue 38): work that grows with the input (decoding a body,
noting a tool output, ranking identifiers, searching an original, counting tokens) is linear or
bounded, and runs off the loop past a size. Each test sends the input at a size where the
quadratic or on-loop code held the loop for seconds, and a loop probe (support.loop_probe)
records the largest gap between the loop's ticks while the proxy works on it.
"""

from __future__ import annotations

import gzip

import orjson
import zstandard

from support.client import auth, chat, post
from support.loop_probe import STALL_BOUND_S, LoopProbe

MODEL = "gpt-4"
KEY = "sk-loop-bounds"


def distinct_tokens(n: int) -> str:
    """`n` distinct short identifiers (letters and digits), 12 to a line."""
    words = [f"k{i:x}q{i % 7}" for i in range(n)]
    return "\n".join(" ".join(words[i:i + 12]) for i in range(0, n, 12))


def tool_conversation(output: str) -> list[dict]:
    call = {"id": "call_1", "type": "function", "function": {"name": "fetch_logs", "arguments": "{}"}}
    return [
        {"role": "user", "content": "Find the failing key."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
    ]


async def test_noting_a_tool_output_of_many_distinct_identifiers_holds_no_loop(upstream, make_proxy, client_for):
    # Every identifier the summarizer's note leaves out is appended to it by code; finding which were
    # left out was a membership test on a list (20k identifiers: seconds on the loop).
    proxy = await make_proxy(upstream.base_url, {"tool_results": {"threshold_tokens": 300},
                                                 "models": {MODEL: {"context_window": 400_000}},
                                                 "compaction": {"prepare_percent": 0}})
    client = client_for(proxy, KEY)
    await chat(client, tool_conversation(distinct_tokens(2000)))  # first use: tokenizers, tables
    async with LoopProbe() as probe:
        _, headers, _ = await chat(client, tool_conversation(distinct_tokens(20_000)))
    assert headers["x-compaction-tool-results"] == "1"
    note = upstream.chat_requests[-1]["messages"][2]["content"]
    assert "## Identifiers preserved" in note and "more" in note
    assert probe.worst_s < STALL_BOUND_S, probe


def layered_body(inflated: int) -> bytes:
    """zstd over a level-0 gzip of `inflated` bytes: a few KB on the wire, a gzip layer of
    `inflated` bytes that zlib must go through in many steps."""
    inner = gzip.compress(b" " * inflated, compresslevel=0)
    return zstandard.ZstdCompressor(level=19).compress(inner)


async def test_a_small_body_in_two_layers_that_inflate_holds_no_loop(upstream, make_proxy):
    # Whether to decode off the loop was decided by the compressed size (this body is ~1 KB), and
    # zlib copied its unconsumed input at every 64 KB step: 48 MB of level 0 held the loop 5 s.
    proxy = await make_proxy(upstream.base_url)
    body = layered_body(48 << 20)
    assert len(body) < 16 << 10
    headers = {"Content-Encoding": "gzip, zstd", "Content-Type": "application/json", **auth(KEY)}
    async with LoopProbe() as probe:
        answer = await post(proxy, body, headers)
    assert answer.status == 400 and answer.json()["error"]["type"] == "invalid_request_error", answer.body[:300]
    assert probe.worst_s < STALL_BOUND_S, probe
    assert upstream.chat_requests == []


async def test_more_than_two_content_encoding_layers_are_a_415_before_any_is_decoded(upstream, make_proxy):
    proxy = await make_proxy(upstream.base_url)
    body = gzip.compress(gzip.compress(gzip.compress(orjson.dumps({"model": MODEL, "messages": []}))))
    headers = {"Content-Encoding": "gzip, gzip, gzip", "Content-Type": "application/json", **auth(KEY)}
    answer = await post(proxy, body, headers)
    assert answer.status == 415 and answer.json()["error"]["code"] == "unsupported_content_encoding", answer.body
    assert "at most 2" in answer.json()["error"]["message"]
    assert upstream.chat_requests == []
