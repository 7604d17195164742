"""The Responses event stream checks (issue 14 items 2 and 4, design.md § Responses API): OpenAI's events pass,
a broken or unfinished stream is named, an overflow (`response.failed` with
context_length_exceeded before any output) is recognized while nothing has gone to the client, and
the proxy's error event is one the openai package reads as OpenAI's own."""

from __future__ import annotations

import aiohttp
import orjson
from openai.types.responses import ResponseErrorEvent

from proxy import errors
from proxy.fakes.responses import FakeResponses
from proxy.fakes.responses import events as ev
from proxy.protocols.responses.stream import ResponsesEventChecker, is_overflow_failure, read_preamble
from proxy.upstream import is_context_overflow

BODY = {"model": "gpt-5", "input": "hello"}


def stream_bytes(final: dict, events=ev.stream_events) -> bytes:
    return b"".join(ev.sse(e) for e in ev.numbered(events(final)))


def completed(text: str = "hi there") -> dict:
    reply = ev.Reply(text=text, reasoning="thinking", function_calls=[{"name": "ls", "arguments": "{}", "call_id": "c1"}])
    output = ev.output_items(reply, lambda rid, nxt: "enc")
    return ev.response_object("resp_1", BODY, "completed", output, ev.usage(120, 100, 9))


def test_a_whole_stream_passes_in_any_chunking() -> None:
    data = stream_bytes(completed())
    for size in (1, 7, 100, len(data)):
        checker = ResponsesEventChecker()
        out = bytearray()
        for i in range(0, len(data), size):
            good, why = checker.feed(data[i:i + size])
            assert why is None
            out += good
        rest, why = checker.finish()
        assert why is None
        assert bytes(out + rest) == data
        assert checker.done and checker.end == "response.completed" and checker.output_started
        assert checker.usage["input_tokens"] == 120 and not checker.overflow


def test_a_data_only_stream_ending_with_done_passes_as_litellm_sends_it() -> None:
    # LiteLLM's /v1/responses stream: no `event:` lines, then chat's `data: [DONE]` after the end.
    data = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in ev.numbered(ev.stream_events(completed())))
    data += b"data: [DONE]\n\n"
    checker = ResponsesEventChecker()
    good, why = checker.feed(data)
    rest, why_end = checker.finish()
    assert why is None and why_end is None and bytes(good + rest) == data
    assert checker.end == "response.completed"
    # [DONE] is no end by itself: a stream that stops there without its end event is broken
    early = ResponsesEventChecker()
    early.feed(ev.sse({"type": "response.created", "sequence_number": 0, "response": {}}) + b"data: [DONE]\n\n")
    assert early.finish()[1] == "the stream ended before the response did (no response.completed)"


def test_broken_streams_are_named() -> None:
    good = ev.sse({"type": "response.created", "sequence_number": 0, "response": {}})
    cases = {
        b"event: response.created\ndata: {not json\n\n": "not valid JSON",
        b"event: response.created\ndata: [1,2]\n\n": "not an object with a type",
        b'event: response.completed\ndata: {"type":"response.output_text.delta"}\n\n': "carries a",
    }
    for data, why_part in cases.items():
        _, why = ResponsesEventChecker().feed(good + data)
        assert why is not None and why_part in why, data
    checker = ResponsesEventChecker()
    checker.feed(good)
    assert checker.finish()[1] == "the stream ended before the response did (no response.completed)"
    after_end = stream_bytes(completed()) + good
    assert "after the end" in ResponsesEventChecker().feed(after_end)[1]


def test_overflow_before_output_is_recognized_and_after_output_is_not() -> None:
    final = ev.response_object("resp_2", BODY, "failed", [], None,
                               error={"code": "context_length_exceeded", "message": "Your input exceeds the context window"})
    checker = ResponsesEventChecker()
    checker.feed(stream_bytes(final, ev.failed_events))
    assert checker.overflow and checker.done and not checker.output_started
    # A failure after output started is not an overflow to retry: the client has seen output.
    late = [{"type": "response.created", "response": {}}, {"type": "response.output_item.added", "item": {}},
            {"type": "response.failed", "response": final}]
    checker = ResponsesEventChecker()
    checker.feed(b"".join(ev.sse(e) for e in ev.numbered(late)))
    assert checker.done and not checker.overflow
    other = {**final, "error": {"code": "server_error", "message": "boom"}}
    assert not is_overflow_failure(other)
    assert is_overflow_failure({**final, "error": {"code": None, "message": "maximum context length is 4096 tokens"}})


def test_http_400_context_length_exceeded_is_an_overflow() -> None:
    body = orjson.dumps({"error": {"message": "Your input exceeds the context window of this model.",
                                   "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}})
    assert is_context_overflow(400, body)
    assert not is_context_overflow(400, orjson.dumps({"error": {"message": "Unknown parameter: 'x'.", "code": "unknown_parameter"}}))


def test_the_proxys_error_event_is_openais_shape_numbered_after_the_last() -> None:
    checker = ResponsesEventChecker()
    checker.feed(ev.sse({"type": "response.created", "sequence_number": 0, "response": {}})
                 + ev.sse({"type": "response.in_progress", "sequence_number": 1, "response": {}}))
    data = checker.error_event(errors.upstream_bad_response("the stream was cut"))
    assert data.startswith(b"event: error\ndata: ")
    event = ResponseErrorEvent.model_validate(orjson.loads(data.split(b"data: ", 1)[1]))
    assert event.sequence_number == 2 and event.code == "bad_upstream_response"
    assert "the stream was cut" in event.message


async def test_read_preamble_holds_the_start_until_output_or_overflow() -> None:
    async with FakeResponses(window=50, overflow_as_failed_event=True) as fake:
        async with aiohttp.ClientSession() as s:
            async with s.post(fake.base_url + "/responses", json={**BODY, "input": "word " * 200, "stream": True},
                              headers={"Authorization": "Bearer sk-test"}) as resp:
                held, (checker, good, why) = await read_preamble(resp)
            assert checker.overflow and why is None and good == held and b"response.created" in held and b"response.failed" in held
            async with s.post(fake.base_url + "/responses", json={**BODY, "stream": True},
                              headers={"Authorization": "Bearer sk-test"}) as resp:
                held, (checker, good, why) = await read_preamble(resp)
                assert not checker.overflow and checker.output_started and why is None
                assert b"response.output_item.added" in held
                rest = await resp.content.read()
    whole = ResponsesEventChecker()
    _, why = whole.feed(held + rest)
    assert why is None and whole.finish()[1] is None and whole.end == "response.completed"
