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

from proxy.compaction.summarizer import clean_output

pytestmark = pytest.mark.e2e

READ = {"name": "Read", "description": "Read a file of the repository.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
SYSTEM = "You are a coding agent. Read files with the Read tool and say what they do."
THRESHOLD = 1700  # tokens (the proxy's count): crossed after ~10 rounds of ~150 tokens; the
# compacted request (~1,200: summary with its code-written blocks, the recall tool, the newest
# round) has room for two reuses
BIG = 2  # this round's file read is oversized (~720 tokens): above tool_results.threshold_tokens
AFTER = 2  # requests made after the one that compacts (one plain, one streamed)
MAX_ROUNDS = 20  # room for a few refused summaries (SmolLM2 replies instead, now and then)


def file_text(i: int) -> str:
    lines = 25 if i == BIG else 4
    return "\n".join(f"def post_{i}_{k}(ledger, amount):\n    return ledger.add({k} * amount)  # posting_{i}.py:{k}"
                     for k in range(lines))


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


def test_a_tool_using_session_is_compacted_through_litellm_and_reused(start_proxy, litellm_server, tap):
    from anthropic import Anthropic

    t = tap(litellm_server)
    proxy = start_proxy(
        litellm_server.upstream,
        anthropic={"base_url": t.url},
        compaction={
            "threshold_tokens": THRESHOLD,
            "reserve_tokens": 200,  # summary output cap: the model rambles to it
            "keep_recent_tokens": 100,  # the newest round kept verbatim: room for reuses after
            "prepare_percent": 0,  # summaries on the request path only: one request at a time
            "summarizer_timeout_s": 600,
            "required_headings": [],  # a 135M model cannot follow the full format
            # The transcript form, not the conversation's own request plus one instruction: SmolLM2
            # carries the conversation on when asked in it (refused as a reply).
            "cached_summary_call": False,
            "failure_cooldown_s": 0,  # a refused summary is asked for again on the next request
            "mask_tool_outputs": False,  # this test is about the real model's summary
            "learn_token_ratio": False,  # the threshold is in the proxy's own count
        },
        tool_results={"threshold_tokens": 500, "max_output_tokens": 160, "timeout_s": 600},
    )
    client = Anthropic(base_url=proxy.url, api_key=litellm_server.key, max_retries=0, timeout=900)
    model = litellm_server.model
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the posting modules one by one."}]
    statuses: list[str] = []
    summary = previous = None
    for i in range(MAX_ROUNDS):
        if "summarized" in statuses and len(statuses) - statuses.index("summarized") > AFTER:
            break
        stream = i % 2 == 1
        seen = len(t.exchanges)
        raw = client.messages.with_raw_response.create(model=model, max_tokens=16, system=SYSTEM, tools=[READ],
                                                       messages=messages, stream=stream)
        assert raw.status_code == 200
        status = raw.headers["x-compaction-status"]
        statuses.append(status)
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
        assert sent.body["stream"] is stream or (not stream and "stream" not in sent.body)

        for e in new[:-1]:  # the proxy's own calls: Messages calls through LiteLLM, all answered
            assert e.kind in ("history", "tool") and e.path == "/v1/messages" and e.status == 200, e.kind
        fwd = sent.body
        if i != BIG + 1:
            assert fwd["messages"][-1] == messages[-1]  # the newest turn verbatim (but the oversized one)
        if status == "summarized":
            assert summary is None and any(e.kind == "history" for e in new), statuses
            assert int(raw.headers["x-compaction-tokens-after"]) < int(raw.headers["x-compaction-tokens-before"])
            summary = summary_of(fwd)
            # The real model wrote it: every line of its answer is in the summary.
            written = clean_output([e for e in new if e.kind == "history"][-1].response_json()["content"][0]["text"])
            lines = [ln.strip() for ln in written.splitlines() if ln.strip()]
            assert lines and all(ln in summary for ln in lines)
            # the client's string system stays a string (LiteLLM hands blocks to the chat template)
            assert isinstance(fwd["system"], str) and fwd["system"].startswith(SYSTEM + "\n\n")
        elif status == "reused":
            assert summary is not None and not [e for e in new if e.kind == "history"], statuses
            assert summary_of(fwd) == summary  # the stored bytes, not a new summary
            assert fwd["system"] == previous["system"]
            assert fwd["messages"][: len(previous["messages"])] == previous["messages"]  # the prefix only grows
        else:
            assert status in ("none", "failed-open") and summary is None, statuses
            assert fwd["system"] == SYSTEM
        previous = fwd

        if i == BIG + 1:  # the request right after the oversized read: the real model's note
            [note_call] = [e for e in new if e.kind == "tool"]
            assert file_text(BIG) in texts(note_call.body)  # it was given the whole output
            [result] = [b for b in fwd["messages"][-1]["content"] if b["type"] == "tool_result"]
            sent_text = texts({"messages": [{"role": "user", "content": [result]}]})
            if raw.headers["x-compaction-tool-results"] == "1":  # the note, smaller than the output
                assert file_text(BIG) not in sent_text and len(sent_text) < len(file_text(BIG))
            else:  # the model's note was refused: the output itself, behind a one-line notice
                assert raw.headers["x-compaction-tool-results"] == "0"
                assert sent_text.startswith("[compaction-proxy: summarization unavailable (")
                assert file_text(BIG) in sent_text
        tid = f"toolu_e2e_{i:02d}"
        # Each assistant turn says something before its call: LiteLLM sends a tool_use-only turn as a
        # chat message without content, which llama-cpp-python's template rejects (500).
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": text.strip() or "Reading the next one."},
            {"type": "tool_use", "id": tid, "name": "Read", "input": {"path": f"ledger/posting_{i}.py"}}]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tid, "content": file_text(i)}]})

    assert "summarized" in statuses, statuses
    k = statuses.index("summarized")
    assert k > BIG + 1 and statuses[k + 1:] == ["reused"] * AFTER, statuses
    # Before it: under the threshold, or over it with the real model's answer refused (it replied
    # instead of summarizing, as a 135M model may): forwarded uncompacted, and asked again.
    crossed = statuses.index("failed-open") if "failed-open" in statuses else k
    assert statuses[:crossed] == ["none"] * crossed and statuses[crossed:k] == ["failed-open"] * (k - crossed)
    assert proxy.log_text().count("summary rejected (") >= k - crossed

    # count_tokens through the proxy: LiteLLM counts what the proxy would forward now (the stored
    # summary applies), less than the whole history it was sent.
    seen = len(t.exchanges)
    counted = client.messages.count_tokens(model=model, system=SYSTEM, tools=[READ], messages=messages)
    [count_call] = t.exchanges[seen:]
    assert count_call.kind == "count_tokens" and count_call.status == 200
    assert summary_of(count_call.body) == summary
    assert counted.input_tokens == count_call.response_json()["input_tokens"] > 0
    direct = Anthropic(base_url=litellm_server.url, api_key=litellm_server.key, max_retries=0)
    whole = direct.messages.count_tokens(model=model, system=SYSTEM, tools=[READ], messages=messages)
    assert counted.input_tokens < whole.input_tokens
    print(f"\nMessages via LiteLLM: statuses {statuses}; count_tokens {counted.input_tokens} (whole {whole.input_tokens})")
