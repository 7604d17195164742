"""The fake OpenAI upstream must itself behave like OpenAI, or proxy tests prove nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import re

import aiohttp
import openai
import pytest

from proxy.fakes.chat import FakeUpstream
from proxy.fakes.common import FakeError
from proxy.prompts import SUMMARY_HEADINGS
from support.client import http, openai_client, post, sync_openai_client
from support.waiting import until

MODEL = "gpt-4o-mini"
JSON = {"Content-Type": "application/json"}
CALL = {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
CALL_B = {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture
async def fake_upstream():
    """A started FakeUpstream in the test's event loop, stopped after the test."""
    async with FakeUpstream() as fake:
        yield fake


@pytest.fixture
async def fake_client(fake_upstream):
    """An AsyncOpenAI client of the fake itself (conftest's `client` talks to the proxy)."""
    async with openai_client(fake_upstream, "sk-test") as c:  # closed inside the loop: no "Event loop is closed" noise
        yield c


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def tool(call_id: str, text: str = "sunny") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def assistant_calls(*calls: dict) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


# ---- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages",
    [
        [user("weather?"), assistant_calls(CALL), tool("call_a")],
        [user("both?"), assistant_calls(CALL, CALL_B), tool("call_b"), tool("call_a"), user("thanks")],
        [{"role": "system", "content": "s"}, user("x"), assistant_calls(CALL), tool("call_a"),
         {"role": "assistant", "content": "It is sunny."}, user("ok")],
        [{"role": "developer", "content": [{"type": "text", "text": "dev"}]}, user("x"),
         {"role": "assistant", "content": "partial", "tool_calls": [CALL]}, {**tool("call_a"), "name": "get_weather"}],
    ],
)
async def test_valid_tool_pairing_is_accepted(fake_upstream, fake_client, messages):
    r = await fake_client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    assert r.choices[0].finish_reason == "stop"
    assert fake_upstream.chat_requests[-1]["messages"] == messages


@pytest.mark.parametrize(
    "messages, fragment, param",
    [
        ([user("x"), assistant_calls(CALL, CALL_B), tool("call_a"), user("next")],
         "The following tool_call_ids did not have response messages: call_b", "messages.[1].role"),
        ([user("x"), assistant_calls(CALL)],
         "The following tool_call_ids did not have response messages: call_a", "messages.[1].role"),
        ([user("x"), tool("call_a")],
         "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'", "messages.[1].role"),
        ([user("x"), assistant_calls(CALL), user("between"), tool("call_a")],
         "did not have response messages: call_a", "messages.[1].role"),
        ([user("x"), assistant_calls(CALL), tool("call_zzz")],
         "'tool_call_id' of 'call_zzz' not found in 'tool_calls' of previous message", "messages.[2].tool_call_id"),
        ([user("x"), assistant_calls(CALL), tool("call_a"), {"role": "assistant", "content": "done"}, tool("call_a")],
         "must be a response to a preceeding message with 'tool_calls'", "messages.[4].role"),
    ],
)
async def test_broken_tool_pairing_is_rejected_like_openai(fake_upstream, fake_client, messages, fragment, param):
    with pytest.raises(openai.BadRequestError) as ei:
        await fake_client.chat.completions.create(model=MODEL, messages=messages)
    err = ei.value.body
    assert ei.value.status_code == 400
    assert fragment in err["message"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param


@pytest.mark.parametrize(
    "body, code",
    [
        ({"model": MODEL, "messages": []}, "empty_array"),
        ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "user"}]}, "missing_required_parameter"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "invalid_type"),
        ({"model": MODEL, "messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "invalid_value"),
        ({"model": MODEL, "messages": [user("x"), {"role": "assistant", "content": None}]}, None),
        ({"model": MODEL, "messages": [user("x"), {"role": "assistant", "content": None, "tool_calls": [
            {**CALL, "function": {"name": "f", "arguments": {"a": 1}}}]}, tool("call_a")]}, "invalid_type"),
        ({"messages": [user("x")]}, None),
        ({"model": MODEL, "messages": [user("x")], "stream_options": {"include_usage": True}}, None),
    ],
)
async def test_schema_errors(fake_upstream, body, code):
    status, _, raw = await post(fake_upstream, body, JSON)
    data = json.loads(raw)
    assert status == 400
    assert data["error"]["type"] == "invalid_request_error"
    assert data["error"]["code"] == code


async def test_invalid_json_body(fake_upstream):
    status, _, raw = await post(fake_upstream, b"{not json", JSON)
    data = json.loads(raw)
    assert status == 400 and "could not parse the JSON body" in data["error"]["message"]
    assert fake_upstream.requests[-1].json is None and fake_upstream.chat_requests == []


async def test_reject_consecutive_user_is_opt_in(fake_upstream):
    body = {"model": MODEL, "messages": [user("summary"), user("question")]}
    assert (await post(fake_upstream, body, JSON)).status == 200
    fake_upstream.reject_consecutive_user = True
    status, _, raw = await post(fake_upstream, body, JSON)
    data = json.loads(raw)
    assert status == 400 and "must alternate" in data["error"]["message"]


# ---- context window ----------------------------------------------------------------------


async def test_context_length_exceeded_above_the_window():
    async with FakeUpstream(window=200) as fake, openai_client(fake, "sk-test") as client:
        small = await client.chat.completions.create(model=MODEL, messages=[user("hi")])
        assert small.usage.prompt_tokens == fake.count_prompt_tokens(fake.chat_requests[-1]) < 200

        with pytest.raises(openai.BadRequestError) as ei:
            await client.chat.completions.create(model=MODEL, messages=[user("word " * 300)])
        err = ei.value.body
        n = fake.count_prompt_tokens(fake.chat_requests[-1])
        assert n > 200
        assert err == {
            "message": f"This model's maximum context length is 200 tokens. However, your messages resulted in {n} "
                       "tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
        fake.model_windows = {"big-model": 100000}
        ok = await client.chat.completions.create(model="big-model", messages=[user("word " * 300)])
        assert ok.choices[0].message.content.startswith("ok: word")


async def test_tools_and_tool_calls_count(fake_upstream):
    base = {"model": MODEL, "messages": [user("x")]}
    with_tools = {**base, "tools": TOOLS}
    with_calls = {**base, "messages": [user("x"), assistant_calls(CALL), tool("call_a")]}
    n = fake_upstream.count_prompt_tokens
    assert n(with_tools) > n(base) + 10
    assert n(with_calls) > n(base) + 10


# ---- responses and streams ----------------------------------------------------------------


async def test_non_streaming_shape(fake_upstream):
    status, headers, raw = await post(fake_upstream, {"model": MODEL, "messages": [user("x" * 80)]}, JSON)
    data = json.loads(raw)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert re.fullmatch(r"chatcmpl-[A-Za-z0-9]+", data["id"])
    assert data["object"] == "chat.completion" and isinstance(data["created"], int) and data["model"] == MODEL
    choice = data["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "ok: " + "x" * 50, "refusal": None, "annotations": []}
    assert choice["finish_reason"] == "stop"
    u = data["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


async def test_raw_sse_format(fake_upstream):
    body = {"model": MODEL, "messages": [user("one two three four five")], "stream": True,
            "stream_options": {"include_usage": True}}
    answer = await post(fake_upstream, body)
    assert answer.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    raw = answer.body.decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "ok: one two three four five"
    assert len([c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]) >= 3
    assert chunks[-2]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_async_client_streams_text_and_usage(fake_upstream, fake_client):
    fake_upstream.reply = "The quick brown fox jumps over the lazy dog."
    stream = await fake_client.chat.completions.create(
        model=MODEL, messages=[user("x")], stream=True, stream_options={"include_usage": True})
    parts, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        usage = chunk.usage or usage
    assert "".join(parts) == fake_upstream.reply
    assert usage.completion_tokens > 0


async def test_async_client_streams_tool_calls(fake_upstream, fake_client):
    fake_upstream.reply = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}},
                                          {"id": "call_fixed", "type": "function",
                                           "function": {"name": "get_time", "arguments": "{}"}}]}
    async with fake_client.chat.completions.stream(model=MODEL, messages=[user("x")], tools=TOOLS) as stream:
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert calls[1].id == "call_fixed" and calls[0].id.startswith("call_")

    # The answer can go straight back as history: the fake accepts its own tool calls.
    history = [user("x"), final.choices[0].message.model_dump(exclude_none=True),
               tool(calls[0].id), tool(calls[1].id)]
    fake_upstream.reply = None
    r = await fake_client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS)
    assert r.choices[0].finish_reason == "stop"


async def test_content_and_tool_calls_non_streaming(fake_upstream, fake_client):
    fake_upstream.reply = {"content": "Let me check.", "tool_calls": [CALL]}
    r = await fake_client.chat.completions.create(model=MODEL, messages=[user("x")], tools=TOOLS)
    m = r.choices[0].message
    assert m.content == "Let me check." and m.tool_calls[0].id == "call_a"
    assert r.choices[0].finish_reason == "tool_calls"


async def test_sync_client_in_a_thread(fake_upstream):
    fake_upstream.reply = {"tool_calls": [CALL]}

    def run():
        with sync_openai_client(fake_upstream, "sk-test") as client:
            r = client.chat.completions.create(model=MODEL, messages=[user("x")], tools=TOOLS)
            with client.chat.completions.stream(model=MODEL, messages=[user("x")], tools=TOOLS) as s:
                final = s.get_final_completion()
        return r, final

    r, final = await asyncio.to_thread(run)
    assert r.choices[0].message.tool_calls[0].function.arguments == '{"city":"Paris"}'
    assert final.choices[0].message.tool_calls[0].id == "call_a"


def test_thread_mode_for_sync_tests():
    with FakeUpstream(reply="hello") as fake, sync_openai_client(fake, "sk-test") as client:
        chunks = client.chat.completions.create(model=MODEL, messages=[user("x")], stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "hello"


async def test_max_tokens_truncates_with_finish_reason_length(fake_upstream, fake_client):
    fake_upstream.reply = "word " * 100
    r = await fake_client.chat.completions.create(model=MODEL, messages=[user("x")], max_tokens=5)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5


async def test_scripted_callables_and_errors(fake_upstream, fake_client):
    async def answer(body):
        await asyncio.sleep(0)
        if body["messages"][-1]["content"] == "fail":
            return FakeError.openai(503, "overloaded", code="overloaded", headers={"x-why": "test"})
        return "echo " + body["messages"][-1]["content"]

    fake_upstream.reply = answer
    assert (await fake_client.chat.completions.create(model=MODEL, messages=[user("a")])).choices[0].message.content == "echo a"
    with pytest.raises(openai.InternalServerError) as ei:
        await fake_client.chat.completions.create(model=MODEL, messages=[user("fail")])
    assert ei.value.status_code == 503 and ei.value.response.headers["x-why"] == "test"

    fake_upstream.reply = lambda body: 1 / 0
    with pytest.raises(openai.InternalServerError):
        await fake_client.chat.completions.create(model=MODEL, messages=[user("a")])
    assert isinstance(fake_upstream.errors[-1], ZeroDivisionError)


@pytest.mark.parametrize("param, other", [("max_tokens", "max_completion_tokens"), ("max_completion_tokens", "max_tokens")])
async def test_reject_param(fake_upstream, fake_client, param, other):
    fake_upstream.reject_param = param
    with pytest.raises(openai.BadRequestError) as ei:
        await fake_client.chat.completions.create(model=MODEL, messages=[user("x")], **{param: 10})
    assert ei.value.body == {
        "message": f"Unsupported parameter: '{param}' is not supported with this model. Use '{other}' instead.",
        "type": "invalid_request_error",
        "param": param,
        "code": "unsupported_parameter",
    }
    r = await fake_client.chat.completions.create(model=MODEL, messages=[user("x")], **{other: 10})
    assert r.choices[0].finish_reason == "stop"


# ---- summarizer recognition ----------------------------------------------------------------


async def test_summarizer_recognized_by_marker(fake_upstream, fake_client):
    fake_upstream.prompts_dir = "/nonexistent"  # don't depend on the real prompts being written yet
    fake_upstream.summarizer_marker = "You are a summarizer"

    convo = "<conversation>\n[User]: Fix the bug in src/app.py\n[Assistant]: Looking.\n</conversation>"
    r = await fake_client.chat.completions.create(model=MODEL, messages=[
        {"role": "system", "content": "You are a summarizer. Output only the summary."}, user(convo)])
    text = r.choices[0].message.content
    assert all(h in text for h in SUMMARY_HEADINGS)
    assert "Fix the bug in src/app.py" in text

    payload = "\n".join(f"row {i}: ORDER-{1000 + i}" for i in range(50))
    r = await fake_client.chat.completions.create(model=MODEL, messages=[
        {"role": "system", "content": "You are a summarizer of tool output."},
        user(f"Tool: search_orders\nTask: find it\n--- BEGIN TOOL OUTPUT ---\n{payload}\n--- END TOOL OUTPUT ---")])
    text = r.choices[0].message.content
    assert text.startswith("[Summary of search_orders output]")
    assert "## Key facts" in text and "## Original size" in text and len(text) < len(payload)

    await fake_client.chat.completions.create(model=MODEL, messages=[user("You are a summarizer")])
    assert [r.summarizer_kind for r in fake_upstream.records("summarizer")] == ["history", "tool"]
    assert len(fake_upstream.summarizer_requests) == 2 and len(fake_upstream.chat_requests) == 1
    assert len(fake_upstream.history_summarizer_requests) == len(fake_upstream.tool_summarizer_requests) == 1


async def test_summarizer_recognized_by_prompt_files(tmp_path):
    (tmp_path / "summarization-system.md").write_text("You condense agent conversations into a structured summary.\n"
                                                      "More rules follow here.\n")
    (tmp_path / "tool-result-summarizer.md").write_text("<!-- notes for maintainers -->\nYou shrink oversized tool "
                                                        "results while keeping every identifier intact. Rules:\n")
    calls = []

    async def summarize(body):
        calls.append(body)
        return None if len(calls) == 1 else FakeError.openai(500, "summarizer down")

    async with FakeUpstream(prompts_dir=tmp_path, summarizer=summarize, summarizer_delay_s=0.01) as fake:
        hist = {"model": MODEL, "messages": [
            {"role": "system", "content": "You condense agent conversations into a structured summary.\nMore rules "
                                          "follow here, rendered."}, user("<conversation>[User]: hi</conversation>")]}
        toolreq = {"model": MODEL, "messages": [
            {"role": "system", "content": "You shrink oversized tool results while keeping every identifier intact. "
                                          "Rules: ..."}, user("x")]}
        assert fake.summarizer_kind(hist) == "history" and fake.summarizer_kind(toolreq) == "tool"
        assert not fake.is_summarizer_request({"model": MODEL, "messages": [user("hi")]})
        status, _, raw = await post(fake, hist, JSON)
        data = json.loads(raw)
        assert status == 200 and "## Critical Context" in data["choices"][0]["message"]["content"]
        status, _, raw = await post(fake, toolreq, JSON)
        data = json.loads(raw)
        assert status == 500 and data["error"]["message"] == "summarizer down"
        assert fake.chat_requests == [] and len(fake.summarizer_requests) == 2


async def test_endless_summary(fake_upstream, fake_client):
    fake_upstream.summarizer_marker = "SUMMARIZE"
    fake_upstream.endless_summary = True
    fake_upstream.endless_summary_chars = 200_000
    r = await fake_client.chat.completions.create(
        model=MODEL, max_completion_tokens=100,
        messages=[{"role": "system", "content": "SUMMARIZE"}, user("x")])
    assert len(r.choices[0].message.content) == 200_000


# ---- streaming control and faults ----------------------------------------------------------


async def test_release_last_chunk_holds_the_end_of_the_stream(fake_upstream, fake_client):
    fake_upstream.reply = "a b c d e f"
    fake_upstream.chunk_delay_s = 0.01
    fake_upstream.release_last_chunk = asyncio.Event()
    stream = await fake_client.chat.completions.create(model=MODEL, messages=[user("x")], stream=True)
    seen = []
    async for chunk in stream:
        seen.append(chunk)
        if chunk.choices[0].delta.content == " f":
            await asyncio.wait_for(fake_upstream.last_chunk_waiting.wait(), 5)
            assert all(c.choices[0].finish_reason is None for c in seen)
            fake_upstream.release_last_chunk.set()
    assert seen[-1].choices[0].finish_reason == "stop"


async def test_fail_status_with_retry_after_and_fault_times(fake_upstream, fake_client):
    fake_upstream.fail_status = 429
    fake_upstream.retry_after = 2
    fake_upstream.fault_times = 1
    with pytest.raises(openai.RateLimitError) as ei:
        await fake_client.chat.completions.create(model=MODEL, messages=[user("x")])
    assert ei.value.response.headers["retry-after"] == "2" and ei.value.code == "rate_limit_exceeded"
    await fake_client.chat.completions.create(model=MODEL, messages=[user("x")])  # fault used up
    assert [r.faulted for r in fake_upstream.requests] == [True, False]


async def test_fault_target_summarizer_spares_chat(fake_upstream):
    fake_upstream.summarizer_marker = "SUMMARIZE"
    fake_upstream.fail_status = 500
    fake_upstream.fault_target = "summarizer"
    assert (await post(fake_upstream, {"model": MODEL, "messages": [user("x")]}, JSON)).status == 200
    body = {"model": MODEL, "messages": [{"role": "system", "content": "SUMMARIZE"}, user("x")]}
    assert (await post(fake_upstream, body, JSON)).status == 500


async def test_malformed_json(fake_upstream):
    fake_upstream.malformed_json = True
    answer = await post(fake_upstream, {"model": MODEL, "messages": [user("x")]})
    assert answer.status == 200
    with pytest.raises(json.JSONDecodeError):
        answer.json()


@pytest.mark.parametrize("stream", [False, True])
async def test_reset_mid_response(fake_upstream, stream):
    fake_upstream.reset_mid_response = True
    fake_upstream.reply = "one two three four five six"
    with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        async with aiohttp.ClientSession() as s:
            async with s.post(fake_upstream.base_url + "/chat/completions",
                              json={"model": MODEL, "messages": [user("x")], "stream": stream}) as r:
                await r.read()
    assert fake_upstream.disconnects == 0  # the fake's own reset is not a client disconnect


async def test_broken_sse(fake_upstream, fake_client):
    fake_upstream.broken_sse = True
    fake_upstream.reply = "one two three four five six"
    stream = await fake_client.chat.completions.create(model=MODEL, messages=[user("x")], stream=True)
    with pytest.raises(Exception):
        async for _ in stream:
            pass


async def test_stalls(fake_upstream, fake_client):
    fake_upstream.stall_before_headers_s = 5
    with pytest.raises(openai.APITimeoutError):
        await fake_client.chat.completions.create(model=MODEL, messages=[user("x")], timeout=0.3)

    fake_upstream.stall_before_headers_s = 0
    fake_upstream.stall_mid_stream_s = 0.3
    fake_upstream.reply = "one two three four"
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    stream = await fake_client.chat.completions.create(model=MODEL, messages=[user("x")], stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == "one two three four" and loop.time() - t0 >= 0.3


async def test_client_disconnect_is_recorded(fake_upstream):
    fake_upstream.summarizer_marker = "SUMMARIZE"
    fake_upstream.summarizer_delay_s = 5
    body = {"model": MODEL, "messages": [{"role": "system", "content": "SUMMARIZE"}, user("x")]}
    async with aiohttp.ClientSession() as s:
        with pytest.raises(asyncio.TimeoutError):
            await s.post(fake_upstream.base_url + "/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=0.2))
    await until(lambda: fake_upstream.disconnects, "the fake to see the client leave")
    assert fake_upstream.records("summarizer")[0].disconnected and fake_upstream.disconnects == 1


async def test_require_api_key(fake_upstream, fake_client):
    fake_upstream.require_api_key = "sk-right"
    with pytest.raises(openai.AuthenticationError) as ei:
        await fake_client.chat.completions.create(model=MODEL, messages=[user("x")])
    assert ei.value.code == "invalid_api_key"
    async with openai_client(fake_upstream, "sk-right") as ok:
        await ok.chat.completions.create(model=MODEL, messages=[user("x")])


async def test_simulated_prompt_cache(fake_upstream, fake_client):
    history = [{"role": "system", "content": "sys " * 1200}, user("first question " * 20)]
    r1 = await fake_client.chat.completions.create(model=MODEL, messages=history)
    assert r1.usage.prompt_tokens_details.cached_tokens == 0
    history += [{"role": "assistant", "content": r1.choices[0].message.content}, user("second")]
    r2 = await fake_client.chat.completions.create(model=MODEL, messages=history)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert 1024 <= cached < r2.usage.prompt_tokens
    assert (cached - 1024) % 128 == 0  # OpenAI's granularity
    assert r1.usage.prompt_tokens - cached < 128  # the whole first request, rounded down to a step
    assert cached == fake_upstream.requests[-1].cached_tokens


async def test_simulated_prompt_cache_ignores_short_prefixes(fake_upstream, fake_client):
    history = [{"role": "system", "content": "sys " * 50}, user("first question " * 20)]
    await fake_client.chat.completions.create(model=MODEL, messages=history)
    r2 = await fake_client.chat.completions.create(model=MODEL, messages=[*history, {"role": "assistant", "content": "a"}, user("b")])
    assert r2.usage.prompt_tokens_details.cached_tokens == 0  # under 1024 tokens: never cached


# ---- passthrough endpoints -----------------------------------------------------------------


async def test_models_and_embeddings_with_the_sdk(fake_upstream, fake_client):
    models = [m.id async for m in fake_client.models.list()]
    assert models == fake_upstream.models
    assert (await fake_client.models.retrieve("gpt-4o")).id == "gpt-4o"

    e1 = await fake_client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])  # base64 by default
    e2 = await fake_client.embeddings.create(model="text-embedding-3-small", input="a", encoding_format="float",
                                        dimensions=4)
    assert len(e1.data) == 2 and len(e1.data[0].embedding) == 8
    assert len(e2.data[0].embedding) == 4
    again = await fake_client.embeddings.create(model="text-embedding-3-small", input=["a"])
    assert again.data[0].embedding == e1.data[0].embedding
    assert e1.usage.prompt_tokens == 2


async def test_catch_all_echo(fake_upstream):
    raw = b"\x00\xffbinary"
    answer = await http("PUT", fake_upstream.base_url + "/files/abc?purpose=x&a=1", raw,
                        {"X-Custom": "Yes", "Content-Type": "application/octet-stream"})
    assert answer.status == 200 and answer.headers["x-upstream-echo"] == "1"
    echo = answer.json()
    assert echo["method"] == "PUT" and echo["path"] == "/v1/files/abc" and echo["query"] == "purpose=x&a=1"
    assert echo["raw_path"] == "/v1/files/abc?purpose=x&a=1"
    assert echo["headers"]["x-custom"] == "Yes"
    assert base64.b64decode(echo["body_b64"]) == raw and echo["body_text"] is None
    rec = fake_upstream.requests[-1]
    assert rec.body == raw and rec.query == {"purpose": "x", "a": "1"} and rec.kind == "other"


async def test_summarizer_recognized_from_the_real_prompts(fake_upstream):
    """What the proxy really sends (its prompt files, rendered) is recognized without a marker."""
    prompts_mod = pytest.importorskip("proxy.prompts")
    try:
        prompts = prompts_mod.Prompts(fake_upstream.prompts_dir)
    except prompts_mod.PromptError as e:
        pytest.skip(f"prompt files not ready: {e}")
    history = {"model": MODEL, "messages": [{"role": "system", "content": prompts.text("summarization-system")},
                                            user("<conversation>\n[User]: hi\n</conversation>")]}
    toolres = {"model": MODEL, "messages": [
        {"role": "system", "content": prompts["tool-result-summarizer"].render(tool_name="search_orders")},
        user("Tool: search_orders\n--- BEGIN TOOL OUTPUT ---\n" + "row\n" * 500 + "--- END TOOL OUTPUT ---")]}
    assert fake_upstream.summarizer_kind(history) == "history"
    assert fake_upstream.summarizer_kind(toolres) == "tool"
    assert fake_upstream.summarizer_kind({"model": MODEL, "messages": [
        {"role": "system", "content": "You are a helpful assistant."}, user("hi")]}) is None


async def test_api_key_checked_when_required_as_openai_answers(fake_upstream):
    fake_upstream.require_api_key = "sk-right"
    body = {"model": MODEL, "messages": [user("x")]}
    none = await post(fake_upstream, body, JSON)
    wrong = await post(fake_upstream, body, {**JSON, "Authorization": "Bearer sk-wrong"})
    right = await post(fake_upstream, body, {**JSON, "Authorization": "Bearer sk-right"})
    assert (none.status, wrong.status, right.status) == (401, 401, 200)
    assert json.loads(none.body)["error"]["message"].startswith("You didn't provide an API key.")
    assert json.loads(wrong.body)["error"]["code"] == "invalid_api_key"
