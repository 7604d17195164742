"""Isolation between credentials (issue 7 item 6, design 4.9): identical conversations under two
keys never share a history summary or a tool-result note, and `x-compaction-session` only narrows a
credential's scope: the same session id under another key reaches nothing of the first key's.
(tests/test_compaction_flow.py covers one key with and without a session.)
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import orjson

from support.client import auth, raw_chat
from support.compaction_helpers import chat_history, main_summary
from proxy.fake_upstream import FakeUpstream

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


async def test_identical_conversations_under_two_keys_share_nothing(upstream, make_proxy):
    numbered(upstream)
    proxy = await make_proxy(upstream.base_url, {
        "models": {MODEL: {"context_window": 6000}},
        "compaction": {"prepare_percent": 0},
        "tool_results": {"threshold_tokens": 500},
    })
    msgs = conversation()

    a = (await raw_chat(proxy, msgs, auth("sk-key-A"))).headers
    carried_a = made_by(upstream)
    b = (await raw_chat(proxy, msgs, auth("sk-key-B"))).headers
    carried_b = made_by(upstream)
    assert (a["x-compaction-status"], b["x-compaction-status"]) == ("summarized", "summarized")
    assert a["x-compaction-tool-results"] == b["x-compaction-tool-results"] == "1"
    assert carried_a.isdisjoint(carried_b)  # B made its own summary and note
    kinds = [r.summarizer_kind for r in upstream.records("summarizer")]
    assert kinds.count("tool") == 2 and kinds.count("history") >= 2

    # Each key gets its own back on the next request, without a summarizer call.
    calls = len(upstream.summarizer_requests)
    assert (await raw_chat(proxy, msgs, auth("sk-key-A"))).headers["x-compaction-status"] == "reused" and made_by(upstream) == carried_a
    assert (await raw_chat(proxy, msgs, auth("sk-key-B"))).headers["x-compaction-status"] == "reused" and made_by(upstream) == carried_b
    assert len(upstream.summarizer_requests) == calls


async def test_a_session_narrows_a_keys_scope_and_never_widens_it(upstream, make_proxy):
    numbered(upstream)
    proxy = await make_proxy(upstream.base_url, {
        "models": {MODEL: {"context_window": 6000}},
        "compaction": {"prepare_percent": 0},
        "tool_results": {"threshold_tokens": 500},
    })
    msgs = conversation()
    made: dict[tuple[str, str | None], set[str]] = {}
    for key, session in [("sk-key-A", "shared-id"), ("sk-key-B", "shared-id"), ("sk-key-A", None), ("sk-key-B", None)]:
        headers = (await raw_chat(proxy, msgs, auth(key, session))).headers
        assert headers["x-compaction-status"] == "summarized", (key, session)  # nobody else's summary fits
        made[(key, session)] = made_by(upstream)
    every = [n for carried in made.values() for n in carried]
    assert len(every) == len(set(every))  # four scopes, each with its own summary and note
    # and each scope still finds its own
    for (key, session), carried in made.items():
        headers = (await raw_chat(proxy, msgs, auth(key, session))).headers
        assert headers["x-compaction-status"] == "reused" and made_by(upstream) == carried


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


async def test_a_request_with_no_credential_is_never_served_another_requests_records(upstream, make_proxy):
    """No credential and no upstream.api_key: without a session id nothing is kept or read (the
    request goes on uncompacted); with one, the session is its own scope."""
    numbered(upstream)
    proxy = await make_proxy(upstream.base_url, SMALL)
    msgs = conversation()
    for _ in range(2):
        h = (await raw_chat(proxy, msgs, {})).headers
        assert h["x-compaction-status"] == "failed-open" and h["x-compaction-tool-results"] == "0"
        assert upstream.chat_requests[-1]["messages"] == msgs
    assert upstream.summarizer_requests == []
    s1 = (await raw_chat(proxy, msgs, {"x-compaction-session": "session-one"})).headers
    carried_1 = made_by(upstream)
    s2 = (await raw_chat(proxy, msgs, {"x-compaction-session": "session-two"})).headers
    carried_2 = made_by(upstream)
    assert (s1["x-compaction-status"], s2["x-compaction-status"]) == ("summarized", "summarized")
    assert carried_1.isdisjoint(carried_2)
    again = (await raw_chat(proxy, msgs, {"x-compaction-session": "session-one"})).headers
    assert again["x-compaction-status"] == "reused" and made_by(upstream) == carried_1
    # a key-holder naming the same session reaches nothing of the anonymous one's
    keyed = (await raw_chat(proxy, msgs, {"Authorization": "Bearer sk-key-A", "x-compaction-session": "session-one"})).headers
    assert keyed["x-compaction-status"] == "summarized" and made_by(upstream).isdisjoint(carried_1)
