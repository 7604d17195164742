"""The Messages API end to end: the real `anthropic` client -> the proxy -> LiteLLM's proxy
(Anthropic Messages, bridged to chat) -> the real llama.cpp server (SmolLM2-135M).

A tool-using session, its tool calls and results scripted and its answers the real model's, grows
turn by turn, plain and streamed requests in turn: one oversized file read becomes a note written by
the real model (a tool-summarizer call made as a Messages call through LiteLLM), the history crosses
the threshold and is summarized by the real model (a Messages call through LiteLLM), and the
requests after it reuse the stored summary byte for byte. The tap between the proxy and LiteLLM
sees every request in Messages form; LiteLLM and llama.cpp must accept every one. count_tokens
through the proxy asks LiteLLM to count what the proxy would forward.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .session import BIG, COMPACTION, MAX_ROUNDS, TOOL_RESULTS, Session, Shape, file_text

pytestmark = pytest.mark.e2e

READ = {"name": "Read", "description": "Read a file of the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
SYSTEM = "You are a coding agent. Read files with the Read tool and say what they do."


def texts(body: dict[str, Any]) -> str:
    """Every text of a Messages body: system, text blocks, tool results' contents."""
    out = [body["system"]] if isinstance(body.get("system"), str) else [b["text"] for b in body.get("system") or []]
    for m in body["messages"]:
        content = m["content"]
        for b in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            inner = b.get("content")
            if isinstance(inner, str):
                out.append(inner)
            elif isinstance(inner, list):
                out += [x.get("text", "") for x in inner]
            out.append(b.get("text", ""))
    return "\n".join(out)


def summary_of(body: dict[str, Any]) -> str:
    """The summary block's text: the first block of the first user message of a compacted request."""
    first = body["messages"][0]
    assert first["role"] == "user" and isinstance(first["content"], list)
    text = first["content"][0]["text"]
    assert "<summary>" in text
    return text


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for chunk in raw.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


MESSAGES = Shape(system=lambda b: b.get("system"), items=lambda b: b["messages"], summary_of=summary_of,
                 answer_text=lambda e: e.response_json()["content"][0]["text"], path="/v1/messages")


def test_a_tool_using_session_is_compacted_through_litellm_and_reused(start_proxy, litellm_server, tap):
    from anthropic import Anthropic

    t = tap(litellm_server)
    proxy = start_proxy(litellm_server.upstream, anthropic={"base_url": t.url}, compaction=COMPACTION,
                        tool_results=TOOL_RESULTS)
    client = Anthropic(base_url=proxy.url, api_key=litellm_server.key, max_retries=0, timeout=900)
    model = litellm_server.model
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the posting modules one by one."}]
    session = Session(MESSAGES, SYSTEM)
    for i in range(MAX_ROUNDS):
        if session.done():
            break
        stream = i % 2 == 1
        seen = len(t.exchanges)
        raw = client.messages.with_raw_response.create(model=model, max_tokens=16, system=SYSTEM, tools=[READ],
                                                       messages=messages, stream=stream)
        assert raw.status_code == 200
        new = t.exchanges[seen:]
        [sent] = [e for e in new if e.kind == "messages"]
        assert sent is new[-1] and sent.status == 200, "LiteLLM (or llama.cpp behind it) rejected a request"
        if stream:
            events = sse_events(raw.http_response.read())
            kinds = [k for k, _ in events]
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds
            # LiteLLM's events in its order, its pings too, same text
            upstream = sse_events(bytes(sent.response))
            assert kinds == [k for k, _ in upstream]
            text = "".join(d["delta"].get("text", "") for k, d in events if k == "content_block_delta")
            assert text == "".join(d["delta"].get("text", "") for k, d in upstream if k == "content_block_delta")
        else:
            answer = raw.parse()
            assert answer.role == "assistant" and answer.stop_reason in ("end_turn", "max_tokens")
            text = "".join(b.text for b in answer.content if b.type == "text")
        fwd = sent.body
        assert fwd["stream"] is stream or (not stream and "stream" not in fwd)
        if i != BIG + 1:
            assert fwd["messages"][-1] == messages[-1]  # the newest turn verbatim (but the oversized one)
        session.check(raw.headers["x-compaction-status"], raw.headers, new, fwd)
        if i == BIG + 1:  # the request right after the oversized read
            [note_call] = [e for e in new if e.kind == "tool"]
            [result] = [b for b in fwd["messages"][-1]["content"] if b["type"] == "tool_result"]
            session.check_note(raw.headers, texts(note_call.body),
                               texts({"messages": [{"role": "user", "content": [result]}]}))
        tid = f"toolu_e2e_{i:02d}"
        # Each assistant turn says something before its call: LiteLLM sends a tool_use-only turn as a
        # chat message without content, which llama-cpp-python's template rejects (500).
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": text.strip() or "Reading the next one."},
            {"type": "tool_use", "id": tid, "name": "Read", "input": {"path": f"ledger/posting_{i}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tid, "content": file_text(i)}]})

    session.finish(proxy.log_text())

    # count_tokens through the proxy: LiteLLM counts what the proxy would forward now (the stored
    # summary applies), less than the whole history it was sent.
    seen = len(t.exchanges)
    counted = client.messages.count_tokens(model=model, system=SYSTEM, tools=[READ], messages=messages)
    [count_call] = t.exchanges[seen:]
    assert count_call.kind == "count_tokens" and count_call.status == 200
    assert summary_of(count_call.body) == session.summary
    assert counted.input_tokens == count_call.response_json()["input_tokens"] > 0
    direct = Anthropic(base_url=litellm_server.url, api_key=litellm_server.key, max_retries=0)
    whole = direct.messages.count_tokens(model=model, system=SYSTEM, tools=[READ], messages=messages)
    assert counted.input_tokens < whole.input_tokens
    print(f"\nMessages via LiteLLM: statuses {session.statuses}; count_tokens {counted.input_tokens} (whole {whole.input_tokens})")
