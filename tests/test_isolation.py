"""Isolation between credentials (issue 7 item 6, design.md § Made once, reused), what only the chat path has: Azure's
`api-key` and a configured upstream key. Two keys sharing nothing, a session narrowing a key's
scope, and a request with no credential are checked for every protocol in
tests/every_protocol/test_protocols_shared.py; tests/compaction/test_compaction_flow.py covers one key with and without a
session.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import orjson

from support.client import raw_chat
from support.compaction_helpers import chat_history, main_summary
from proxy.fakes.chat import FakeUpstream

MODEL = "gpt-4"


def numbered(upstream: FakeUpstream) -> None:
    """History summaries and tool notes say which summarizer call made them."""
    calls = [0]

    def answer(body: dict[str, Any]) -> str | None:
        calls[0] += 1
        if upstream.summarizer_kind(body) == "tool":
            return f"[Summary of lookup output]\nnote-number-{calls[0]}\n## Key facts\n- fine\n## Original size\nbig\n"
        return main_summary(f"number-{calls[0]}")

    upstream.summarizer = answer


def made_by(upstream: FakeUpstream) -> set[str]:
    """Which summarizer calls made what the last forwarded request carries: its history summary
    (a fold or a split turn takes several calls) and its tool note."""
    fwd = orjson.dumps(upstream.chat_requests[-1]["messages"]).decode()
    summary = set(re.findall(r"summary-marker-number-(\d+)", fwd))
    note = set(re.findall(r"note-number-(\d+)", fwd))
    assert summary and len(note) == 1, fwd[:300]
    return summary | note


def conversation() -> list[dict[str, Any]]:
    """Over the threshold, with an oversized tool result in the kept part."""
    msgs = chat_history(12, 150)
    msgs += [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_same", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_same",
         "content": "\n".join(f"entry {i}: account ACC-{i:04d} active" for i in range(120))},
    ]
    return msgs


SMALL = {
    "models": {MODEL: {"context_window": 6000}},
    "compaction": {"prepare_percent": 0},
    "tool_results": {"threshold_tokens": 500},
}


@pytest.mark.parametrize("header", ["api-key", "x-api-key"])
async def test_two_keys_in_the_same_non_authorization_header_share_nothing(upstream, make_proxy, header):
    """Azure's `api-key` and Anthropic's `x-api-key` scope like `Authorization` does, and the
    proxy's own summarizer calls carry that same header with the client's value, and no other."""
    numbered(upstream)
    proxy = await make_proxy(upstream.base_url, {**SMALL, "upstream": {"api_key": "sk-configured"}})
    msgs = conversation()
    a = (await raw_chat(proxy, msgs, {header: "sk-key-A"})).headers
    carried_a = made_by(upstream)
    calls_a = len(upstream.summarizer_requests)
    b = (await raw_chat(proxy, msgs, {header: "sk-key-B"})).headers
    carried_b = made_by(upstream)
    assert (a["x-compaction-status"], b["x-compaction-status"]) == ("summarized", "summarized")
    assert carried_a.isdisjoint(carried_b) and len(upstream.summarizer_requests) > calls_a
    summarizer = upstream.records("summarizer")
    assert {r.headers.get(header) for r in summarizer} == {"sk-key-A", "sk-key-B"}
    for rec in upstream.records():  # the configured key never joins a client's own credential
        assert "authorization" not in rec.headers, rec.headers
    calls = len(upstream.summarizer_requests)
    assert (await raw_chat(proxy, msgs, {header: "sk-key-A"})).headers["x-compaction-status"] == "reused"
    assert made_by(upstream) == carried_a
    assert (await raw_chat(proxy, msgs, {header: "sk-key-B"})).headers["x-compaction-status"] == "reused"
    assert made_by(upstream) == carried_b
    assert len(upstream.summarizer_requests) == calls
