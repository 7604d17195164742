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
from support.protocols import compaction_input

from .session import BIG, COMPACTION, MAX_ROUNDS, TOOL_RESULTS, Session, Shape, file_text

pytestmark = pytest.mark.e2e

READ = {"type": "function", "name": "read", "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
INSTRUCTIONS = "You are a coding agent. Read files with the read tool and say what they do."
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


RESPONSES = Shape(system=lambda b: b.get("instructions"), items=lambda b: b["input"], summary_of=summary_of,
                  answer_text=answer_text, path="/v1/responses")


def test_a_tool_using_session_is_compacted_through_litellm_and_reused(start_proxy, litellm_server, tap):
    t = tap(litellm_server)
    proxy = start_proxy(litellm_server.upstream, upstream={"base_url": t.base_url}, compaction=COMPACTION,
                        tool_results=TOOL_RESULTS)
    client = proxy.client(api_key=litellm_server.key, timeout=900)
    model = litellm_server.model
    items: list[dict[str, Any]] = [user("Read the posting modules one by one.")]
    session = Session(RESPONSES, INSTRUCTIONS)
    for i in range(MAX_ROUNDS):
        if session.done():
            break
        stream = i % 2 == 1
        seen = len(t.exchanges)
        raw = client.responses.with_raw_response.create(model=model, instructions=INSTRUCTIONS, tools=[READ],
                                                        input=items, max_output_tokens=16, stream=stream)
        assert raw.status_code == 200
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
        fwd = sent.body
        if i != BIG + 1:
            assert fwd["input"][-1] == items[-1]  # the newest item verbatim (but the oversized one)
        session.check(raw.headers["x-compaction-status"], raw.headers, new, fwd)
        if i == BIG + 1:  # the request right after the oversized output
            [note_call] = [e for e in new if e.kind == "tool"]
            session.check_note(raw.headers, texts(note_call.body["input"]), fwd["input"][-1]["output"])
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

    session.finish(proxy.log_text())
    print(f"\nResponses via LiteLLM: statuses {session.statuses}")


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

    carried = compaction_input(out.output)
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
