"""The fault matrix (issue 7 item 1): every way the upstream, the summarizers or the proxy's own
stages can fail, and what the client sees. Real HTTP on loopback; every call is bounded in time, so
a hang fails the test instead of stalling the run.

Upstream faults reach the client as the upstream's own error (status, body, Retry-After) or as an
OpenAI-shaped 502/504, before headers; once a stream has started, as an `error` event that the
openai SDK raises as an APIError. Summarizer faults never fail the request.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from proxy.flow import Flow, Stage
from support.client import auth, openai_client, post
from support.compaction_helpers import chat_history, proxy_count
from proxy.fakes.chat import FakeUpstream
from support.invariants import check_forwarded
from support.waiting import DEADLINE_S

BOUND_S = 20  # no call below may take longer: a hang is a failure, not a slow test
AUTH = auth("sk-faults")
MSGS = [{"role": "user", "content": "Tell me a story about a careful proxy."}]
STORY = "Once upon a time a proxy relayed every byte of every answer, in order, and never hung. " * 3
MODEL = "gpt-4"  # cl100k_base on both sides


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _events(raw: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body, parsed (`[DONE]` kept as the string)."""
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        for line in block.splitlines():
            if line.startswith(b"data: "):
                payload = line[6:]
                out.append(payload.decode() if payload == b"[DONE]" else orjson.loads(payload))
    return out


def _openai_error(body: bytes) -> dict[str, Any]:
    parsed = orjson.loads(body)
    assert set(parsed) == {"error"} and set(parsed["error"]) == {"message", "type", "param", "code"}
    return parsed["error"]


def _body(stream: bool, messages: list[dict[str, Any]] = MSGS, model: str = "gpt-4o") -> dict[str, Any]:
    return {"model": model, "messages": messages, "stream": stream}


# -- upstream faults ---------------------------------------------------------------------------

TIMEOUTS = {"upstream": {"timeout_s": 0.5, "stream_idle_timeout_s": 0.5}}  # only stalled calls get near them


def _fault(upstream: FakeUpstream, name: str) -> None:
    upstream.reply = STORY
    upstream.fault_target = "chat"
    if name == "reset":
        upstream.reset_mid_response = True
    elif name == "stall-before-headers":
        upstream.stall_before_headers_s = 60
    elif name == "stall-mid-body":
        upstream.stall_mid_stream_s = 60
    elif name == "malformed":
        upstream.malformed_json = True
    elif name == "broken-sse":
        upstream.broken_sse = True
    elif name == "429":
        upstream.fail_status, upstream.retry_after = 429, 7
    elif name == "503":
        upstream.fail_status, upstream.retry_after = 503, 2
    elif name == "500":
        upstream.fail_status = 500


# (fault, stream) -> (status, error code or None for a pass-through, code of the error event or None)
MATRIX = {
    ("refused", False): (502, "upstream_unreachable", None),
    ("refused", True): (502, "upstream_unreachable", None),
    ("reset", False): (502, "bad_upstream_response", None),
    ("reset", True): (200, None, "bad_upstream_response"),
    ("stall-before-headers", False): (504, "upstream_timeout", None),
    ("stall-before-headers", True): (504, "upstream_timeout", None),
    ("stall-mid-body", False): (504, "upstream_timeout", None),
    ("stall-mid-body", True): (200, None, "upstream_timeout"),
    ("malformed", False): (502, "bad_upstream_response", None),
    ("broken-sse", True): (200, None, "bad_upstream_response"),
    ("429", False): (429, "rate_limit_exceeded", None),
    ("429", True): (429, "rate_limit_exceeded", None),
    ("503", False): (503, None, None),
    ("503", True): (503, None, None),
    ("500", True): (500, None, None),
}


@pytest.mark.parametrize("fault,stream", list(MATRIX), ids=[f"{f}-{'stream' if s else 'plain'}" for f, s in MATRIX])
async def test_upstream_fault_reaches_the_client_promptly_in_openai_shape(upstream, make_proxy, fault, stream):
    base = f"http://127.0.0.1:{_closed_port()}/v1" if fault == "refused" else upstream.base_url
    proxy = await make_proxy(base, TIMEOUTS)
    _fault(upstream, fault)
    status, code, event_code = MATRIX[(fault, stream)]
    started = time.monotonic()
    got, headers, raw = await post(proxy, orjson.dumps(_body(stream)), AUTH, timeout=BOUND_S)
    assert time.monotonic() - started < BOUND_S / 2  # far sooner than any stall would have ended
    assert got == status
    assert headers["x-compaction-status"] == "none"  # our headers on every answer, errors included
    if event_code is not None:
        events = _events(raw)
        assert events and events[0]["choices"][0]["delta"]["role"] == "assistant"  # what came before is kept
        err = events[-1]["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == event_code
        assert "[DONE]" not in events
        return
    err = _openai_error(raw)
    if status in (502, 504):
        assert err["type"] == "upstream_error" and err["code"] == code
        return
    # The upstream's own error, passed through as it came: body and Retry-After.
    direct_status, direct_headers, direct_body = await post(upstream, orjson.dumps(_body(stream)), timeout=BOUND_S)
    assert (got, raw) == (direct_status, direct_body)
    assert headers.get("Retry-After") == direct_headers.get("Retry-After")
    if fault in ("429", "503"):
        assert headers["Retry-After"] == str(upstream.retry_after)
    assert code is None or err["code"] == code


async def test_a_broken_stream_is_an_api_error_for_the_openai_sdk(upstream, make_proxy):
    """What an agent sees: the chunks before the break, then an APIError (not a JSON decode error)."""
    proxy = await make_proxy(upstream.base_url)
    _fault(upstream, "broken-sse")
    client = openai_client(proxy, "sk-faults")
    text = ""

    async def consume() -> None:
        nonlocal text
        stream = await client.chat.completions.create(model="gpt-4o", messages=MSGS, stream=True)
        async for chunk in stream:
            text += chunk.choices[0].delta.content or "" if chunk.choices else ""

    with pytest.raises(openai.APIError) as exc:
        await asyncio.wait_for(consume(), BOUND_S)
    assert "not valid JSON" in exc.value.message
    assert text and STORY.startswith(text) and text != STORY
    await client.close()


# -- llama.cpp: 200 and an empty event stream for a prompt over its window ------------------------


async def test_an_empty_stream_is_treated_as_an_overflow_and_retried_compacted(upstream, make_proxy):
    upstream.window = 4000  # the real window; the proxy believes 8000 (threshold 6800)
    upstream.empty_stream_on_overflow = True
    # and the connection closes a moment later: the retry's own calls must not pick it from the pool
    upstream.close_after_empty_stream_s = 0.2
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 8000}},
                                                 "compaction": {"prepare_percent": 0}})
    msgs = chat_history(13, 150)
    assert 4000 < proxy_count({"model": MODEL, "messages": msgs}) <= 6800
    status, headers, raw = await post(proxy, orjson.dumps(_body(True, msgs, MODEL)), AUTH, timeout=BOUND_S)
    assert status == 200
    events = _events(raw)
    assert events[-1] == "[DONE]" and "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-1] if e["choices"]).startswith("ok: ")
    assert headers["x-compaction-status"] == "summarized"
    chats = upstream.records("chat")
    assert [r.status for r in chats] == [200, 200] and chats[0].json["messages"] == msgs
    assert int(headers["x-compaction-tokens-after"]) <= 0.8 * (6800 // 2)  # half the threshold, hysteresis
    check_forwarded(msgs, chats[1].json["messages"], compacted=True)


@pytest.mark.parametrize("compaction", [True, False], ids=["retry-also-empty", "no-retry"])
async def test_an_empty_stream_with_no_retry_left_is_a_502(upstream, make_proxy, compaction):
    upstream.model_windows = {MODEL: 50 if compaction else 4000}  # too small even for the compacted retry
    upstream.empty_stream_on_overflow = True
    proxy = await make_proxy(upstream.base_url, {
        "models": {MODEL: {"context_window": 8000}},
        # the summarizer's model has room: the retry is made, and comes back empty too
        "compaction": {"prepare_percent": 0, "enabled": compaction, "summarizer_model": "gpt-4o-mini"},
    })
    status, headers, raw = await post(proxy, orjson.dumps(_body(True, chat_history(13, 150), MODEL)), AUTH, timeout=BOUND_S)
    assert status == 502
    err = _openai_error(raw)
    assert err["code"] == "bad_upstream_response" and "llama.cpp" in err["message"]
    assert len(upstream.records("chat")) == (2 if compaction else 1)
    assert headers["x-compaction-status"] == ("summarized" if compaction else "none")


def _templating_failure(pad_words: int) -> list[dict[str, Any]]:
    """A tool call whose assistant message has `content: null`, which llama.cpp's server rejects
    (after its stream has started: an empty stream), then `pad_words` words of history."""
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    return [
        {"role": "user", "content": "look it up " + "word " * pad_words},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "found"},
        {"role": "user", "content": "and?"},
    ]


async def test_an_empty_stream_for_a_small_request_is_a_502_not_an_overflow(upstream, make_proxy):
    """A 522-token request can never overflow an 8000-token window: no compaction, no retry, a
    502 that says what happened."""
    upstream.reject_null_content_with_tool_calls = True
    upstream.empty_stream_on_llama_error = True
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 8000}},
                                                 "compaction": {"prepare_percent": 0}})
    msgs = _templating_failure(480)
    assert 400 < proxy_count({"model": MODEL, "messages": msgs}) < 4000
    status, headers, raw = await post(proxy, orjson.dumps(_body(True, msgs, MODEL)), AUTH, timeout=BOUND_S)
    assert status == 502
    err = _openai_error(raw)
    assert err["code"] == "bad_upstream_response"
    assert "without sending an event" in err["message"] and "well under the model's 8000-token window" in err["message"]
    assert [r.status for r in upstream.records("chat")] == [200]  # sent once, never retried
    assert upstream.records("summarizer") == []
    assert headers["x-compaction-status"] == "none"


async def test_an_empty_stream_for_a_request_near_the_window_is_still_retried_compacted(upstream, make_proxy):
    """The other side of the line: past half the window the same empty stream may be an overflow,
    so the request is compacted and retried (here the retry no longer carries the bad message)."""
    upstream.reject_null_content_with_tool_calls = True
    upstream.empty_stream_on_llama_error = True
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 8000}},
                                                 "compaction": {"prepare_percent": 0, "required_headings": []}})
    msgs = _templating_failure(10) + chat_history(13, 150)[1:]
    assert 4000 <= proxy_count({"model": MODEL, "messages": msgs}) <= 6800
    status, headers, raw = await post(proxy, orjson.dumps(_body(True, msgs, MODEL)), AUTH, timeout=BOUND_S)
    assert status == 200, raw
    assert headers["x-compaction-status"] == "summarized"
    assert [r.status for r in upstream.records("chat")] == [200, 200]
    assert len(upstream.records("summarizer")) >= 1


# -- summarizer faults: the request always goes through ------------------------------------------

SMALL = {"models": {MODEL: {"context_window": 6000}}, "compaction": {"prepare_percent": 0}, "tool_results": {"enabled": False}}
# A window whose summarizer input budget holds the whole span: one summarizer call per compaction,
# so a failure is the summarizer's own, not one of a fold's later calls.
ONE_CALL = {**SMALL, "models": {MODEL: {"context_window": 20000}}}


def _summarizer_fault(upstream: FakeUpstream, name: str) -> None:
    upstream.fault_target = "summarizer"
    if name == "http-500":
        upstream.fail_status = 500
    elif name == "reset-midway":
        upstream.reset_mid_response = True
    elif name == "timeout":
        upstream.stall_before_headers_s = 30
    elif name == "malformed":
        upstream.malformed_json = True
    elif name == "endless":
        upstream.endless_summary = True


@pytest.mark.parametrize("fault", ["http-500", "reset-midway", "timeout", "malformed", "endless"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_failing_history_summarizer_forwards_the_original(upstream, make_proxy, fault, stream):
    timeout = {"summarizer_timeout_s": 0.5} if fault == "timeout" else {}  # a runaway answer takes its time
    proxy = await make_proxy(upstream.base_url, {**ONE_CALL, "compaction": {**ONE_CALL["compaction"], **timeout}})
    _summarizer_fault(upstream, fault)
    msgs = chat_history(40, 150)
    assert proxy_count({"model": MODEL, "messages": msgs}) > 17000  # the threshold
    sent = _body(stream, msgs, MODEL)
    status, headers, raw = await post(proxy, orjson.dumps(sent), AUTH, timeout=BOUND_S)
    assert status == 200
    assert headers["x-compaction-status"] == "failed-open"
    assert headers["x-compaction-tokens-before"] == headers["x-compaction-tokens-after"]
    assert upstream.records("chat")[-1].body == orjson.dumps(sent)  # the client's bytes, untouched
    assert len(upstream.history_summarizer_requests) == 1
    if stream:
        assert _events(raw)[-1] == "[DONE]"


TOOL_SETTINGS = {"tool_results": {"threshold_tokens": 300}, "compaction": {"prepare_percent": 0}}


@pytest.mark.parametrize("fault,reason", [
    ("http-500", "HTTP 500"), ("timeout", "timed out"), ("malformed", "not a chat completion"),
    ("endless", "far over its 2000-token cap"),
])
async def test_a_failing_tool_result_summarizer_forwards_the_raw_output_with_its_notice(upstream, make_proxy, fault, reason):
    timeout = {"timeout_s": 0.5} if fault == "timeout" else {}
    proxy = await make_proxy(upstream.base_url, {**TOOL_SETTINGS, "tool_results": {**TOOL_SETTINGS["tool_results"], **timeout}})
    _summarizer_fault(upstream, fault)
    upstream.endless_summary_chars = 200_000  # an answer that ignores the output cap
    payload = "\n".join(f"row {i}: order ORD-{i:05d} shipped to warehouse W{i % 7}" for i in range(200))
    msgs = [
        {"role": "user", "content": "Which orders shipped?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "list_orders", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": payload},
    ]
    status, headers, _ = await post(proxy, orjson.dumps(_body(False, msgs, MODEL)), AUTH, timeout=BOUND_S)
    assert status == 200
    assert headers["x-compaction-tool-results"] == "0" and headers["x-compaction-status"] == "none"
    notice, rest = upstream.chat_requests[-1]["messages"][2]["content"].split("\n", 1)
    assert rest == payload
    assert "summarization unavailable" in notice and reason in notice
    assert notice.endswith("Do not re-run the tool for a summary.]")


# -- a bug in the proxy's own stages: forwarded unchanged, never a 500 -----------------------------


@pytest.mark.parametrize("stage", [0, 1], ids=["tool_results", "compaction"])
@pytest.mark.parametrize("needed", [True, False], ids=["over-threshold", "under-threshold"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_unexpected_exception_in_a_stage_forwards_the_request_unchanged(
    upstream, make_proxy, caplog, stage, needed, stream
):
    proxy = await make_proxy(upstream.base_url, SMALL)

    class Broken(Stage):
        async def request(self, flow: Flow) -> None:
            raise RuntimeError("a bug in the stage")

    proxy.state.stages[stage] = Broken()  # the proxy's stage list (proxy/flow.py): this one has a bug
    msgs = chat_history(12 if needed else 2, 150)
    sent = _body(stream, msgs, MODEL)
    status, headers, raw = await post(proxy, orjson.dumps(sent), AUTH, timeout=BOUND_S)
    assert status == 200
    assert headers["x-compaction-status"] == ("failed-open" if needed else "none")
    assert headers["x-compaction-tokens-before"] == headers["x-compaction-tokens-after"]
    assert upstream.records("chat")[-1].body == orjson.dumps(sent)
    assert upstream.summarizer_requests == []
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("proxy")]
    assert len(logged) == 1 and "forwarding it unchanged" in logged[0].getMessage()
    assert logged[0].exc_text is not None and "a bug in the stage" in logged[0].exc_text


async def test_an_unexpected_exception_in_the_overflow_retry_passes_the_upstreams_error(upstream, make_proxy, caplog):
    upstream.window = 4000
    proxy = await make_proxy(upstream.base_url, {"models": {MODEL: {"context_window": 8000}},
                                                 "compaction": {"prepare_percent": 0}})
    compaction = proxy.state.stages[1]

    class BrokenRetry(Stage):  # compaction as it is, with a bug in its overflow hook
        async def request(self, flow: Flow) -> None:
            await compaction.request(flow)

        async def overflow(self, flow: Flow) -> bool:
            raise RuntimeError("a bug in the retry")

    proxy.state.stages[1] = BrokenRetry()
    status, headers, raw = await post(proxy, orjson.dumps(_body(False, chat_history(13, 150), MODEL)), AUTH, timeout=BOUND_S)
    assert status == 400 and _openai_error(raw)["code"] == "context_length_exceeded"
    assert headers["x-compaction-status"] == "none"
    assert len(upstream.chat_requests) == 1
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        "compacting for the overflow retry failed unexpectedly"]


# -- the client goes away ----------------------------------------------------------------------


async def _settled(baseline: int, timeout: float = DEADLINE_S) -> int:
    """Wait until the loop's task count is back at (or below) `baseline`; returns the last count."""
    deadline = time.monotonic() + timeout
    while (n := len(asyncio.all_tasks())) > baseline and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return n


@pytest.mark.parametrize("phase", ["mid-stream", "before-first-byte"])
async def test_a_client_leaving_mid_stream_closes_the_upstream_and_leaves_no_task(upstream, make_proxy, phase):
    """The proxy, the fake upstream and this test share one loop: every task any of them started
    for the request must be gone once the client left."""
    proxy = await make_proxy(upstream.base_url)
    upstream.reply = STORY
    if phase == "mid-stream":
        upstream.release_last_chunk = asyncio.Event()
    else:
        upstream.stall_before_headers_s = 60
    baseline = len(asyncio.all_tasks())
    async with aiohttp.ClientSession() as s:

        async def call() -> None:
            async with s.post(proxy.base_url + "/chat/completions", data=orjson.dumps(_body(True))) as resp:
                await resp.content.readuntil(b"\n\n")
                await asyncio.Event().wait()  # read no further

        task = asyncio.create_task(call())
        if phase == "mid-stream":
            await asyncio.wait_for(upstream.last_chunk_waiting.wait(), BOUND_S)
        else:
            await upstream.wait_for_requests(1, "chat")
        task.cancel()  # the client drops the connection
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.wait_for(_wait(lambda: upstream.disconnects == 1), BOUND_S)
    assert await _settled(baseline) <= baseline
    # and the proxy still serves
    upstream.stall_before_headers_s = 0
    status, _, _ = await post(proxy, orjson.dumps(_body(False)), AUTH, timeout=BOUND_S)
    assert status == 200


async def _wait(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.01)
