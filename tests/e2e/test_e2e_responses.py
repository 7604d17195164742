"""The Responses API end to end: the real `openai` client's `responses.create` -> the proxy ->
LiteLLM's proxy (/v1/responses, bridged to chat) -> the real llama.cpp server (SmolLM2-135M).

A tool-using session (function_call / function_call_output items scripted, the answers the real
model's), plain and streamed requests in turn: one oversized function output becomes a note written
by the real model, the history crosses the threshold and is summarized by the real model (the
summarizer calls are Responses calls through LiteLLM), and the requests after it reuse the summary
byte for byte. Then /v1/responses/compact: LiteLLM does not serve it for this backend and says so
with a 500, which the proxy passes on (it serves compact itself only on a 404/405 or with
`responses.serve_compact`); with serve_compact on, the proxy serves it and expands its compaction
item in the next request, so LiteLLM never sees an item it cannot read.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from proxy.compaction.summarizer import clean_output

pytestmark = pytest.mark.e2e

READ = {"type": "function", "name": "read", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
INSTRUCTIONS = "You are a coding agent. Read files with the read tool and say what they do."
THRESHOLD = 1700  # tokens (the proxy's count): crossed after ~10 rounds of ~150 tokens; the
# compacted request (~1,250: summary with its code-written blocks, the recall tool, the newest
# round) has room for two reuses
BIG = 2  # this round's output is oversized (~720 tokens): above tool_results.threshold_tokens
AFTER = 2  # requests made after the one that compacts (one plain, one streamed)
MAX_ROUNDS = 20  # room for a few refused summaries (SmolLM2 replies instead, now and then)
COMPACTION = {
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
}


def file_text(i: int) -> str:
    lines = 25 if i == BIG else 4
    return "\n".join(f"def post_{i}_{k}(ledger, amount):\n    return ledger.add({k} * amount)  # posting_{i}.py:{k}"
                     for k in range(lines))


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def summary_of(body: dict[str, Any]) -> str:
    """The summary: the first part of the first user message item of a compacted request."""
    first = next(it for it in body["input"] if it.get("type", "message") == "message" and it["role"] == "user")
    text = first["content"][0]["text"]
    assert "<summary>" in text
    return text


def texts(items: list[dict[str, Any]]) -> str:
    """Every text of Responses input items: message parts and function outputs."""
    out = []
    for it in items:
        content = it.get("content")
        out += [content] if isinstance(content, str) else [p.get("text", "") for p in content or []]
        if isinstance(it.get("output"), str):
            out.append(it["output"])
    return "\n".join(out)


def sse_events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[len("data: "):]) for line in raw.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def answer_text(e: Any) -> str:
    """The text of a Responses answer the tap recorded (a summarizer's)."""
    out = e.response_json()["output"]
    return "".join(p["text"] for it in out if it["type"] == "message" for p in it["content"]
                   if p["type"] == "output_text")


def test_a_tool_using_session_is_compacted_through_litellm_and_reused(start_proxy, litellm_server, tap):
    t = tap(litellm_server)
    proxy = start_proxy(
        litellm_server.upstream,
        upstream={"base_url": t.base_url},
        compaction=COMPACTION,
        tool_results={"threshold_tokens": 500, "max_output_tokens": 160, "timeout_s": 600},
    )
    client = proxy.client(api_key=litellm_server.key, timeout=900)
    model = litellm_server.model
    items: list[dict[str, Any]] = [user("Read the posting modules one by one.")]
    statuses: list[str] = []
    summary = previous = None
    for i in range(MAX_ROUNDS):
        if "summarized" in statuses and len(statuses) - statuses.index("summarized") > AFTER:
            break
        stream = i % 2 == 1
        seen = len(t.exchanges)
        raw = client.responses.with_raw_response.create(model=model, instructions=INSTRUCTIONS, tools=[READ],
                                                        input=items, max_output_tokens=16, stream=stream)
        assert raw.status_code == 200
        status = raw.headers["x-compaction-status"]
        statuses.append(status)
        new = t.exchanges[seen:]
        [sent] = [e for e in new if e.kind == "responses"]
        assert sent is new[-1] and sent.status == 200, "LiteLLM (or llama.cpp behind it) rejected a request"
        if stream:
            events = sse_events(raw.http_response.read())
            upstream = sse_events(bytes(sent.response))
            assert [ev["type"] for ev in events] == [ev["type"] for ev in upstream]  # LiteLLM's, in its order
            kinds = [ev["type"] for ev in events]
            assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
            text = "".join(ev["delta"] for ev in events if ev["type"] == "response.output_text.delta")
            assert text == "".join(ev["delta"] for ev in upstream if ev["type"] == "response.output_text.delta")
        else:
            response = raw.parse()
            assert response.status in ("completed", "incomplete")
            text = response.output_text

        for e in new[:-1]:  # the proxy's own calls: Responses calls through LiteLLM, all answered
            assert e.kind in ("history", "tool") and e.path == "/v1/responses" and e.status == 200, e.kind
        fwd = sent.body
        if i != BIG + 1:
            assert fwd["input"][-1] == items[-1]  # the newest item verbatim (but the oversized one)
        if status == "summarized":
            assert summary is None and any(e.kind == "history" for e in new), statuses
            assert int(raw.headers["x-compaction-tokens-after"]) < int(raw.headers["x-compaction-tokens-before"])
            summary = summary_of(fwd)
            written = clean_output(answer_text([e for e in new if e.kind == "history"][-1]))
            lines = [ln.strip() for ln in written.splitlines() if ln.strip()]
            assert lines and all(ln in summary for ln in lines)  # the real model wrote it
            assert fwd["instructions"].startswith(INSTRUCTIONS + "\n\n")  # annotated
        elif status == "reused":
            assert summary is not None and not [e for e in new if e.kind == "history"], statuses
            assert summary_of(fwd) == summary  # the stored bytes, not a new summary
            assert fwd["instructions"] == previous["instructions"]
            assert fwd["input"][: len(previous["input"])] == previous["input"]  # the prefix only grows
        else:
            assert status in ("none", "failed-open") and summary is None, statuses
            assert fwd["instructions"] == INSTRUCTIONS
        previous = fwd

        if i == BIG + 1:  # the request right after the oversized output: the real model's note
            [note_call] = [e for e in new if e.kind == "tool"]
            assert file_text(BIG) in texts(note_call.body["input"])  # it was given the whole output
            sent_text = fwd["input"][-1]["output"]
            if raw.headers["x-compaction-tool-results"] == "1":  # the note, smaller than the output
                assert file_text(BIG) not in sent_text and len(sent_text) < len(file_text(BIG))
            else:  # the model's note was refused: the output itself, behind a one-line notice
                assert raw.headers["x-compaction-tool-results"] == "0"
                assert sent_text.startswith("[compaction-proxy: summarization unavailable (")
                assert file_text(BIG) in sent_text
        call_id = f"call_e2e_{i:02d}"
        # An assistant message before each call: LiteLLM sends a bare function_call as a chat message
        # without content, which llama-cpp-python's template rejects (500).
        items += [
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": text.strip() or "Reading the next one."}]},
            {"type": "function_call", "call_id": call_id, "name": "read",
             "arguments": json.dumps({"path": f"ledger/posting_{i}.py"})},
            {"type": "function_call_output", "call_id": call_id, "output": file_text(i)},
        ]

    assert "summarized" in statuses, statuses
    k = statuses.index("summarized")
    assert k > BIG + 1 and statuses[k + 1:] == ["reused"] * AFTER, statuses
    # Before it: under the threshold, or over it with the real model's answer refused (it replied
    # instead of summarizing, as a 135M model may): forwarded uncompacted, and asked again.
    crossed = statuses.index("failed-open") if "failed-open" in statuses else k
    assert statuses[:crossed] == ["none"] * crossed and statuses[crossed:k] == ["failed-open"] * (k - crossed)
    assert proxy.log_text().count("summary rejected (") >= k - crossed
    print(f"\nResponses via LiteLLM: statuses {statuses}")


HISTORY = [
    user("Fix the rounding bug in ledger/posting.py (LEDGER-4211)."),
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running the tests."}]},
    {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": '{"path": "ledger/posting.py"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": file_text(0)},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Split rounding fixed."}]},
    user("Now run the whole suite."),
]


def test_compact_behind_litellm(start_proxy, litellm_server, tap):
    t = tap(litellm_server)
    model = litellm_server.model
    # LiteLLM has no /responses/compact for a chat backend: a 500 in OpenAI's shape, passed on as is.
    proxy = start_proxy(litellm_server.upstream, upstream={"base_url": t.base_url})
    with pytest.raises(openai.InternalServerError) as e:
        proxy.client(api_key=litellm_server.key).responses.compact(model=model, input=HISTORY)
    [asked] = t.exchanges
    assert (asked.kind, asked.status) == ("compact", 500) and asked.body["input"] == HISTORY
    assert "not supported" in e.value.message and e.value.response.content == bytes(asked.response)

    # responses.serve_compact: served here with the real model's summary (a Responses call through
    # LiteLLM), and the item expanded before the next request goes to LiteLLM.
    t.exchanges.clear()
    proxy = start_proxy(litellm_server.upstream, upstream={"base_url": t.base_url}, responses={"serve_compact": True},
                        compaction={"summarizer_timeout_s": 600, "required_headings": [], "reserve_tokens": 200})
    client = proxy.client(api_key=litellm_server.key, timeout=900)
    for _ in range(3):  # SmolLM2 replies instead of summarizing now and then: the proxy refuses that
        t.exchanges.clear()
        try:
            out = client.responses.compact(model=model, input=HISTORY)
            break
        except openai.APIStatusError as refused:
            assert refused.status_code == 502 and "Compaction failed" in refused.message, refused.message
    else:
        pytest.fail("three summaries in a row refused")
    assert [o.type for o in out.output] == ["message", "message", "compaction"]  # the user messages, then ours
    item = out.output[-1]
    assert item.encrypted_content.startswith("cpx1.")
    [made] = t.exchanges
    assert (made.kind, made.status, made.path) == ("history", 200, "/v1/responses")
    written = clean_output(answer_text(made))

    carried = [o.model_dump(exclude_none=True) for o in out.output]
    raw = client.responses.with_raw_response.create(model=model, input=[*carried, user("And commit it.")],
                                                    max_output_tokens=16)
    assert raw.status_code == 200 and raw.parse().status in ("completed", "incomplete")
    [_, sent] = t.exchanges
    assert sent.kind == "responses" and sent.status == 200
    assert all(it.get("type") != "compaction" for it in sent.body["input"])  # expanded, never forwarded
    lines = [ln.strip() for ln in written.splitlines() if ln.strip()]
    forwarded = texts(sent.body["input"])
    assert lines and all(ln in forwarded for ln in lines)  # the summary the real model wrote
    print(f"\ncompact behind LiteLLM: 500 passed on; served here: {len(written)} chars of summary expanded")
