"""The SSE check on chat completion streams (proxy/sse.py EventChecker), without sockets: a valid
stream comes out byte for byte however the network splits it; a broken one stops after its last
whole, valid event and says why."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import sse
from proxy.protocols.messages.stream import MessagesEventChecker
from proxy.sse import CR, EventChecker, _check_event, _event_usage, _fields_by_line, event_fields, named_fields
from proxy.protocols.responses.stream import ResponsesEventChecker

CHUNK = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hé \n"}}]}


def feed_all(data: bytes, cuts: list[int]) -> tuple[bytes, str | None]:
    out, why, _ = feed_checker(EventChecker, data, cuts)
    return out, why


def _state(checker: EventChecker) -> dict:
    return {k: v for k, v in vars(checker).items() if k != "_pending"}


def feed_checker(cls: type, data: bytes, cuts: list[int]) -> tuple[bytes, str | None, dict]:
    """`data` fed to a new `cls` in the pieces `cuts` makes: what it let through, why it stopped,
    and its state after."""
    checker = cls()
    out = b""
    for a, b in zip([0, *cuts], [*cuts, len(data)]):
        good, why = checker.feed(data[a:b])
        out += good
        if why is not None:
            return out, why, _state(checker)
    good, why = checker.finish()
    return out + good, why, _state(checker)


def events(n: int, sep: bytes) -> bytes:
    parts = [b": keep-alive", b"event: ping\ndata: {}".replace(b"\n", sep[: len(sep) // 2])]
    parts += [b"data: " + orjson.dumps({**CHUNK, "n": i}) for i in range(n)]
    parts += [b"data: {\"a\":\ndata: 1}", b"data:[DONE]"]  # two data lines are one payload; no space is fine
    return b"".join(p + sep for p in parts)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 12), sep=st.sampled_from([b"\n\n", b"\r\n\r\n"]), data=st.data())
def test_a_valid_stream_passes_unchanged_however_it_is_split(n, sep, data):
    raw = events(n, sep)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(raw) - 1), max_size=20)))
    assert feed_all(raw, cuts) == (raw, None)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 6), data=st.data())
def test_a_broken_event_stops_the_stream_after_the_last_valid_one(n, data):
    good = events(n, b"\n\n")[: -len(b"data:[DONE]\n\n")]
    raw = good + b'data: {"choices": [{"delta":\n\n' + b"data: [DONE]\n\n"
    cuts = sorted(data.draw(st.sets(st.integers(1, len(raw) - 1), max_size=10)))
    out, why = feed_all(raw, cuts)
    assert out == good and why == "an event's data is not valid JSON"


def test_a_stream_cut_mid_event_is_reported_and_a_whole_unterminated_event_passes():
    whole = b"data: " + orjson.dumps(CHUNK)
    assert feed_all(whole + b"\n\n" + b'data: {"choi', []) == (whole + b"\n\n", "the stream ended in the middle of an event")
    assert feed_all(whole + b"\n\ndata: [DONE]\n", []) == (whole + b"\n\ndata: [DONE]\n", None)


def test_the_checker_knows_when_the_answer_is_complete():
    checker = EventChecker()
    checker.feed(b'data: {"choices": []}\n\n')
    assert not checker.done
    checker.feed(b"data: [DO")
    assert not checker.done  # half an event is not the end
    checker.feed(b"NE]\n\n")
    assert checker.done


def feed_record(data: bytes, cuts: list[int]) -> tuple[bytes, str | None, bool, object]:
    checker = EventChecker()
    out, why = b"", None
    for a, b in zip([0, *cuts], [*cuts, len(data)]):
        good, why = checker.feed(data[a:b])
        out += good
        if why is not None:
            return out, why, checker.done, checker.usage
    good, why = checker.finish()
    return out + good, why, checker.done, checker.usage


EVENT_PARTS = st.sampled_from([
    b"data: " + orjson.dumps(CHUNK), b'data: {"usage":{"prompt_tokens":3}}', b'data: {"usage": {"prompt_tokens":4}}',
    b'data: ["usage":{"x"]', b'data: {"usage" : {"total_tokens":5}}', b'data: {"a":{"usage":{"x":1}}}', b'data: {"usage":null}',
    b'data: {"usage":\ndata: {"prompt_tokens":6}}', b"data: [DONE]", b"data:  [DONE]", b"data: [DONE] ", b"data: 1\r: c", b": keep-alive",
    b"event: x\ndata: {}", b"data: {\"a\":\ndata: 1}", b"data: {", b"", b"\n", b"data: {}\r",
])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(EVENT_PARTS, max_size=8), seps=st.data())
def test_whole_event_chunks_are_judged_as_byte_by_byte_feeding_judges_them(parts, seps):
    # Chunks that end with whole events take the fast path (split at blank lines, one parse per
    # data line); fed a byte at a time the same stream always takes the general one.
    chunks = [p + seps.draw(st.sampled_from([b"\n\n", b"\n\n\n", b"\r\n\r\n", b"\n"])) for p in parts]
    raw = b"".join(chunks)
    at = [sum(map(len, chunks[: i + 1])) for i in range(len(chunks) - 1)]
    assert feed_record(raw, at) == feed_record(raw, list(range(1, len(raw))))


@settings(max_examples=300, deadline=None)
@given(event=st.one_of(EVENT_PARTS, st.binary(max_size=40).map(lambda b: b"data: " + b)))
def test_one_parse_per_data_line_judges_an_event_as_the_line_by_line_check_does(event):
    checker = EventChecker()
    why = checker.event(event)
    assert why == _check_event(event)
    assert checker.done == (event.strip() == b"data: [DONE]")
    if why is None:  # the usage is the chunk's own (top-level) usage object, whatever its spacing
        usage = _event_usage(event)
        assert checker.usage == (usage if isinstance(usage, dict) else None)


FIELD_PARTS = st.sampled_from([b"event:", b"event: ", b"data:", b"data: ", b"id: 1", b": c", b"\n", b"\r", b"\r\n", b" ",
                               b"x", b"message_start", b'{"type":"x"}', b"\xff", b"[DONE]", b"\x0b", b"\x0c"])


@settings(max_examples=500, deadline=None)
@given(parts=st.lists(FIELD_PARTS, max_size=10))
def test_the_usual_event_shapes_read_as_the_line_by_line_reading_reads_them(parts):
    # event_fields reads `data: ...` and `event: ...\ndata: ...` without splitting lines.
    event = b"".join(parts)
    assert event_fields(event) == _fields_by_line(event)
    named = b"event: " + b"".join(parts[:3]) + b"\ndata: " + b"".join(parts[3:])
    assert event_fields(named) == _fields_by_line(named)


def test_the_last_usage_a_chunk_carried_stays_when_later_chunks_carry_none():
    checker = EventChecker()
    out, why = checker.feed(b'data: {"choices":[],"usage":{"prompt_tokens":7}}\n\n'
                            b'data: {"choices":[],"usage":null}\n\n'
                            b'data: {"choices":[{"delta":{"tool":{"usage":{"x":1}}}}]}\n\ndata: [DONE]\n\n')
    assert why is None and checker.done
    assert checker.usage == {"prompt_tokens": 7}


# -- the named protocols' usual event, read in place (MessagesEventChecker, ResponsesEventChecker) --
def _named(name: bytes, payload: object) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(payload)


NAMED_PARTS = st.sampled_from([
    _named(b"message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 3, "output_tokens": 1}}}),
    _named(b"content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"text": "hé \n"}}),
    _named(b"message_delta", {"type": "message_delta", "usage": {"output_tokens": 8, "x": None}}),
    _named(b"message_stop", {"type": "message_stop"}), _named(b"ping", {"type": "ping"}),
    _named(b"response.created", {"type": "response.created", "sequence_number": 0, "response": {}}),
    _named(b"response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 1, "delta": "x"}),
    _named(b"response.completed", {"type": "response.completed", "sequence_number": 2,
                                   "response": {"usage": {"input_tokens": 1, "output_tokens": 2}}}),
    _named(b"response.failed", {"type": "response.failed", "response": {"status": "failed",
                                                                        "error": {"code": "context_length_exceeded"}}}),
    _named(b"error", {"type": "error"}), _named(b"ping", {"type": "message_stop"}), _named(b"ping", [1]),
    b"event:ping\ndata: {\"type\":\"ping\"}", b"event:  ping \ndata: {\"type\":\"ping\"}", b"event: ping\ndata:{\"type\":\"ping\"}",
    b"event: ping\ndata: {\"type\":\n\"ping\"}", b"event: ping\ndata: {\"type\":\"ping\"}\ndata: 1", b"event: \xff\ndata: {}",
    b"event: ping\nid: 1\ndata: {\"type\":\"ping\"}", b"id: 1\nevent: ping\ndata: {\"type\":\"ping\"}", b"event: ping\ndata: {",
    b"event: ping\ndata: ", b"event: ping\ndata: [DONE]", b"data: [DONE]", b"data: {\"type\":\"ping\"}", b"\ndata: {}",
    b"event: ping", b": keep-alive", b"data: {}\r", b"", b"\n",
])


@pytest.mark.parametrize("cls", [MessagesEventChecker, ResponsesEventChecker])
@settings(max_examples=300, deadline=None)
@given(parts=st.lists(NAMED_PARTS, max_size=8), seps=st.data())
def test_named_event_chunks_are_judged_as_byte_by_byte_feeding_judges_them(cls, parts, seps):
    # A chunk that is one `event:` + `data:` event is read in place (named_fields); fed a byte at a
    # time the same stream is read by the general path. Same bytes out, same verdict, same state.
    chunks = [p + seps.draw(st.sampled_from([b"\n\n", b"\n\n\n", b"\r\n\r\n", b"\n"])) for p in parts]
    raw = b"".join(chunks)
    at = [sum(map(len, chunks[: i + 1])) for i in range(len(chunks) - 1)]
    assert feed_checker(cls, raw, at) == feed_checker(cls, raw, list(range(1, len(raw))))


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(NAMED_PARTS, min_size=1, max_size=3))
def test_named_fields_reads_an_event_as_event_fields_does(parts):
    chunk = b"\n".join(parts) + b"\n\n"
    fields = named_fields(chunk)
    if fields is not None and CR not in chunk:  # (None: not the usual shape; the general reading takes it)
        name, data = fields
        assert (name, data[:-2]) == event_fields(chunk[:-2])
        assert data.endswith(b"\n\n")


def test_event_names_are_decoded_once_and_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(sse, "_NAMES", {})
    for i in range(sse._MAX_NAMES + 10):
        assert named_fields(b"event: n%d\ndata: {}\n\n" % i) == (f"n{i}", b"{}\n\n")
    assert len(sse._NAMES) == sse._MAX_NAMES  # later names read as before, not kept
    assert named_fields(b"event: n1\ndata: {}\n\n") == ("n1", b"{}\n\n")


def test_the_done_marker_ends_a_chat_stream_without_a_parse_error():
    checker = EventChecker()
    assert checker.feed(b"data: [DONE]\n\n") == (b"data: [DONE]\n\n", None) and checker.done


def test_the_usual_event_is_judged_in_feed_without_the_general_readings(monkeypatch):
    # A chat chunk, and a named event whose name was seen before, cost the check alone: no call of
    # `simple`, `named_fields` or the general path (each a call an event: a stream's events are many).
    chat, named = EventChecker(), ResponsesEventChecker()
    delta = _named(b"response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 1,
                                                   "delta": "x"}) + b"\n\n"
    assert named.feed(delta) == (delta, None)  # (its name now known)
    calls: list[str] = []
    for cls, name in ((EventChecker, "simple"), (EventChecker, "rest"), (sse.NamedEventChecker, "simple")):
        monkeypatch.setattr(cls, name, lambda self, chunk, name=name: calls.append(name))
    monkeypatch.setattr(sse, "named_fields", lambda chunk: calls.append("named_fields"))
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 3}}\n\n'
    assert chat.feed(usage) == (usage, None) and chat.usage == {"prompt_tokens": 3}
    assert named.feed(delta) == (delta, None) and named.sequence == 1
    assert named.feed(b"event: response.output_text.delta\ndata: {\n\n") == (b"", "an event's data is not valid JSON")
    assert calls == []


@pytest.mark.parametrize("cls, start, delta", [
    (ResponsesEventChecker, _named(b"response.output_text.delta", {"type": "response.output_text.delta",
                                                                   "sequence_number": 1, "delta": "x"}),
     _named(b"response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 2,
                                            "delta": "y"})),
    (MessagesEventChecker, _named(b"message_start", {"type": "message_start", "message": {}}),
     _named(b"content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"text": "y"}})),
])
def test_a_delta_past_the_stream_start_is_judged_without_the_protocols_check(monkeypatch, cls, start, delta):
    # Once the stream flows, the usual delta costs its parse alone: no call of `check` (a stream's
    # events are mostly deltas). What it does not pass (here: after the end) is `check`'s to judge.
    checker = cls()
    assert checker.feed(start + b"\n\n") == (start + b"\n\n", None) and checker.flowing
    calls: list[str] = []
    check = cls.check
    monkeypatch.setattr(cls, "check", lambda self, name, data: calls.append(name) or check(self, name, data))
    assert checker.feed(delta + b"\n\n") == (delta + b"\n\n", None)
    assert calls == [] and getattr(checker, "sequence", 2) == 2
    checker.done = True
    assert checker.feed(delta + b"\n\n")[1] is not None and len(calls) == 1
