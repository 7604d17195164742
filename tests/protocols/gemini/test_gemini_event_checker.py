"""Gemini's stream check (proxy/protocols/gemini/stream.py) without sockets: Google ends each
`data:` event with CRLF CRLF, and such an event, one a chunk, is judged in place as the general
reading judges it byte by byte (same bytes out, same verdict, same state), without that reading."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocols.gemini.code_assist import CodeAssistEventChecker
from proxy.protocols.gemini.stream import GeminiEventChecker
from proxy.sse import EventChecker
from test_event_checker import feed_checker  # (fed in the pieces given: bytes out, verdict, state)


def _data(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload)


TEXT = {"candidates": [{"content": {"role": "model", "parts": [{"text": "h\u00e9 \n"}]}}]}
LAST = {"candidates": [{"content": {"role": "model", "parts": [{"text": "."}]}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 2}}
PARTS = st.sampled_from([
    _data(TEXT), _data(LAST), _data({"usageMetadata": {"promptTokenCount": 3}}), _data({"error": {"code": 400}}),
    _data({"response": LAST, "traceId": "t"}), _data({"candidates": 5}), _data({"candidates": [7, {"finishReason": ""}]}),
    _data([1]), _data("x"), b"data: {", b"data: ", b"data:   ", b"data:",
    b"data:  " + orjson.dumps(TEXT), b"data:\t" + orjson.dumps(TEXT), b"data: {}\r", b"data: {\"a\":\r\n1}",
    b": keep-alive", b"event: x\r\ndata: {}", b"data: [DONE]", b"", b"\r\n", b"data: {}\x0c",
])


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(PARTS, max_size=8), seps=st.data(),
       cls=st.sampled_from([GeminiEventChecker, CodeAssistEventChecker]))
def test_whole_crlf_event_chunks_are_judged_as_byte_by_byte_feeding_judges_them(parts, seps, cls):
    chunks = [p + seps.draw(st.sampled_from([b"\r\n\r\n", b"\n\n", b"\r\n\r\n\r\n", b"\r\n"])) for p in parts]
    raw = b"".join(chunks)
    at = [sum(map(len, chunks[: i + 1])) for i in range(len(chunks) - 1)]
    assert feed_checker(cls, raw, at) == feed_checker(cls, raw, list(range(1, len(raw))))
    # several whole events a read (a stream that outpaces the relay), judged in place too
    some = sorted(set(seps.draw(st.lists(st.sampled_from(at), max_size=len(at))))) if at else []
    assert feed_checker(cls, raw, some) == feed_checker(cls, raw, list(range(1, len(raw))))


def test_googles_usual_event_is_judged_without_the_general_reading(monkeypatch):
    """Each event of a Gemini stream (CRLF CRLF after its one data line) costs its parse alone: no
    buffering, searching or copying by the base class's general path, no line splitting."""
    calls: list[str] = []
    for name in ("rest", "simple"):
        monkeypatch.setattr(EventChecker, name, lambda self, chunk, name=name: calls.append(name))
    monkeypatch.setattr(GeminiEventChecker, "event", lambda self, event: calls.append("event"))
    checker = GeminiEventChecker()
    events = [_data(TEXT) + b"\r\n\r\n", _data(LAST) + b"\r\n\r\n"]
    assert [checker.feed(e) for e in events] == [(e, None) for e in events]
    assert checker.done and checker.usage == LAST["usageMetadata"]
    assert calls == []
    assert checker.feed(_data(TEXT) + b"\r\n\r\n") == (b"", "an event came after the end of the answer")
    several = GeminiEventChecker()  # a read of several events (the stream outpaced the relay): the same
    chunk = b"".join(events)
    assert several.feed(chunk) == (chunk, None) and several.done and calls == []


def test_the_gemini_apis_usual_event_is_judged_in_feed_itself(monkeypatch):
    """The Gemini API's usual event costs no call past `feed` (`judged`, the answer's unwrapping,
    a generator over its candidates: as much as the event's parse); Code Assist's wrapped events,
    and anything the usual reading does not pass, still go to `judged`."""
    judged: list[bytes] = []
    real = GeminiEventChecker.judged
    monkeypatch.setattr(GeminiEventChecker, "judged", lambda self, data: judged.append(data) or real(self, data))
    checker = GeminiEventChecker()
    events = [_data(TEXT) + b"\r\n\r\n", _data(LAST) + b"\r\n\r\n"]
    assert [checker.feed(e) for e in events] == [(e, None) for e in events]
    assert checker.done and checker.usage == LAST["usageMetadata"] and judged == []
    assert checker.feed(_data(TEXT) + b"\r\n\r\n") == (b"", "an event came after the end of the answer")
    assert judged  # (after the end: the verdict is judged's)
    judged.clear()
    assert GeminiEventChecker().feed(b"data: {\r\n\r\n")[0] == b"" and judged
    judged.clear()
    wrapped = CodeAssistEventChecker()
    event = _data({"response": LAST}) + b"\r\n\r\n"
    assert wrapped.feed(event) == (event, None) and wrapped.done and judged == [event[6:]]
