"""The SSE check on chat completion streams (proxy/forward.py EventChecker), without sockets: a valid
stream comes out byte for byte however the network splits it; a broken one stops after its last
whole, valid event and says why."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.forward import EventChecker

CHUNK = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hé \n"}}]}


def feed_all(data: bytes, cuts: list[int]) -> tuple[bytes, str | None]:
    checker = EventChecker()
    out = b""
    for a, b in zip([0, *cuts], [*cuts, len(data)]):
        good, why = checker.feed(data[a:b])
        out += good
        if why is not None:
            return out, why
    good, why = checker.finish()
    return out + good, why


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
