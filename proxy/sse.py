"""Server-sent event streams as the proxy relays them: cut into whole events, each checked.

An upstream's stream goes to the client event by event, never held back past its end; every
`data:` payload must be JSON (or chat's `[DONE]`), and a protocol whose events are named reads
each as its name and data (`NamedEventChecker`; proxy/protocols/responses/stream.py and
proxy/protocols/messages/stream.py judge their own). What a check finds broken ends the client's
stream with an error event in the protocol's shape (proxy/forward.py `relay_events`).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import orjson

from proxy import errors


def _parses(body: bytes) -> bool:
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


_EVENT_END = re.compile(rb"\r?\n\r?\n")
# One byte looked for by its value: `b"\n" in data` first tries the needle as an integer and
# raises (and clears) a TypeError before it searches, several times the cost of the search itself
# on an event-sized chunk, which every relayed event pays.
CR, LF = ord("\r"), ord("\n")
# One SSE event, at most. A chat completion chunk is a few KiB (a tool call's arguments arrive in
# many small deltas); an event this large, or one that never ends, is not a chat completion, and
# holding more of it per stream lets a few such streams take the process's memory.
MAX_EVENT_BYTES = 1 << 20



class EventChecker:
    """Cuts an SSE byte stream into whole events and checks that every `data:` payload is JSON or
    `[DONE]`. Whole events go on at once; only an unfinished last event waits for its end (a client
    cannot use half an event anyway), and at most `max_event_bytes` of it: the only bytes a stream
    holds besides the chunk being written."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._pending = bytearray()
        self._max = max_event_bytes
        self.done = False  # `data: [DONE]` went by: the answer is complete
        # the last `usage` object a chunk carried at its top level (stream_options.include_usage)
        self.usage: Any = None

    def feed(self, chunk: bytes) -> tuple[bytes, str | None]:
        """(bytes of the whole, valid events so far; why the stream is broken, or None)."""
        if not self._pending and CR not in chunk:
            # One whole event of the protocol's usual shape (as upstreams send them): judged in
            # place by the protocol's own reading of that shape, without splitting or copying.
            # (`simple` written out for chat's one `data:` line: a call an event costs as much as
            # the reading; tests/protocols/chat/test_event_checker.py checks the two agree)
            n = len(chunk) - 2
            if type(self) is EventChecker and chunk.find(LF) == n and chunk[-1] == LF and chunk.startswith(b"data: ") \
                    and chunk != DONE_EVENT:
                try:
                    obj = orjson.loads(chunk[6:])  # (the blank line's two newlines are JSON whitespace)
                except orjson.JSONDecodeError:
                    why = self.event(chunk[:n])  # the other [DONE] spellings, and the error, as event() has them
                    return (chunk, None) if why is None else (b"", why)
                if type(obj) is dict and type(usage := obj.get("usage")) is dict:
                    self.usage = usage
                return chunk, None
            why = self.simple(chunk)
            if why is not NOT_SIMPLE:
                return (chunk, None) if why is None else (b"", why)
        return self.rest(chunk)

    def rest(self, chunk: bytes) -> tuple[bytes, str | None]:
        """`feed` for a chunk that is not one event of the usual shape: any number of events, or a
        part of one."""
        if not self._pending and chunk.endswith(b"\n\n") and not chunk.endswith(b"\n\n\n") and CR not in chunk:
            # Whole events and nothing after them. Splitting at every blank line finds the events
            # the general path below finds (the same leftmost, non-overlapping ends), without
            # copying the chunk.
            events = chunk.split(b"\n\n")
            events.pop()  # the empty rest after the last event's end
            if len(events) == 1:  # one event per chunk, as upstreams send them
                why = self.event(events[0])
                return (chunk, None) if why is None else (b"", why)
            pos = 0
            for event in events:
                why = self.event(event)
                if why is not None:
                    return chunk[:pos], why
                pos += len(event) + 2
            return chunk, None
        buf = self._pending
        # An event's end can straddle chunks, but the pending part holds none: search only its last bytes.
        at = max(0, len(buf) - 3)
        buf += chunk  # in place: an event arriving in many small chunks is not copied again each time
        pos = 0
        while (m := _EVENT_END.search(buf, at)) is not None:
            why = self.event(bytes(buf[pos : m.start()]))
            if why is not None:
                good = bytes(buf[:pos])
                self._pending = bytearray()
                return good, why
            pos = at = m.end()
        good = bytes(buf[:pos])
        del buf[:pos]
        if len(buf) > self._max:
            self._pending = bytearray()
            return good, f"an event is larger than {self._max} bytes, far more than any chat completion chunk"
        return good, None

    def simple(self, chunk: bytes) -> Any:
        """A chunk with no CR (and nothing pending) that is one `data: ` line and its blank line,
        as every chat completion chunk comes: judged as `event` judges it (None, or why it is
        broken); NOT_SIMPLE for any other chunk (the general reading takes it)."""
        n = len(chunk) - 2
        if chunk.find(LF) != n or chunk[-1] != LF or not chunk.startswith(b"data: "):
            return NOT_SIMPLE
        if chunk == DONE_EVENT:
            self.done = True
            return None
        try:
            obj = orjson.loads(chunk[6:])  # (the blank line's two newlines are JSON whitespace)
        except orjson.JSONDecodeError:
            return self.event(chunk[:n])  # the other [DONE] spellings, and the error, as event() has them
        if type(obj) is dict and type(usage := obj.get("usage")) is dict:
            self.usage = usage
        return None

    def event(self, event: bytes) -> str | None:
        """Check one whole event and note what it tells (the end, the usage); why it is broken, or None."""
        if event.startswith(b"data: ") and LF not in event and CR not in event:
            # One data line, as every chat completion chunk is: parsed once, for the check and
            # for the usage (read from the parsed chunk: no scan of its bytes).
            payload = event[6:]
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                if payload.strip() != b"[DONE]":
                    return "an event's data is not valid JSON"
                self.done = self.done or event.rstrip() == b"data: [DONE]"
                return None
            if type(obj) is dict and type(usage := obj.get("usage")) is dict:
                self.usage = usage
            return None
        why = _check_event(event)
        self.done = self.done or event.strip() == b"data: [DONE]"
        if why is None and b"usage" in event and type(usage := _event_usage(event)) is dict:
            self.usage = usage
        return why

    def ended(self) -> str | None:
        """At the end of the stream: why it is incomplete, or None (a chat stream may end without [DONE])."""
        return None

    def finish(self) -> tuple[bytes, str | None]:
        """At the end of the stream: an unterminated last event goes on as it came when it is whole."""
        rest, self._pending = bytes(self._pending), bytearray()
        if rest.strip() and self.event(rest) is not None:
            return b"", "the stream ended in the middle of an event"
        return rest, self.ended()

    def error_event(self, err: errors.ProxyError) -> bytes:
        """The event that ends this stream with an error: the protocol's shape by default; a
        stream that numbers its events overrides it (proxy/protocols/responses/stream.py)."""
        return err.event()


class Read(NamedTuple):
    """A stream's first bytes as a checker read them while they were held back (`feed`'s answers
    joined): the relay goes on with this checker instead of checking them a second time."""

    checker: "EventChecker"
    good: bytes
    why: str | None


NOT_SIMPLE: Any = object()  # EventChecker.simple: not the usual shape of one event
DONE_EVENT = b"data: [DONE]\n\n"
_DATA_LINE = b"\ndata: "
# The `event:` lines seen, with the name each gives (as event_fields reads it): a stream repeats a
# handful of names, so each is decoded once. Bounded: an upstream inventing names is read as before.
_NAMES: dict[bytes, str] = {}
_MAX_NAMES = 256


def named_fields(chunk: bytes) -> tuple[str, bytes] | None:
    """A chunk with no CR that is exactly `event: <name>`, `data: <payload>` and the blank line
    (the named protocols' usual event): the name and the payload (its blank line's newlines still
    after it: JSON whitespace), as event_fields reads the event; None for any other chunk. (One
    partition and `in` tests: a find or startswith given a start position costs ~1k instructions
    in argument parsing alone, more than the search.)"""
    line, sep, data = chunk.partition(_DATA_LINE)
    if not sep or LF in line or data.find(LF) != len(data) - 2 or data[-1] != LF:
        return None
    name = _NAMES.get(line)
    if name is None:
        if not line.startswith(b"event:"):
            return None
        name = line[6:].strip().decode("utf-8", "replace")
        if len(_NAMES) < _MAX_NAMES:
            _NAMES[line] = name
    return name, data


def event_fields(event: bytes) -> tuple[str | None, bytes | None]:
    """An SSE event's name and its data lines joined (None when it has no data: a comment or a
    field without data), for the protocols whose events are named (Responses, Messages)."""
    if CR not in event:
        # The usual shapes (one `data: ` line, after an `event:` line or alone), read without
        # splitting the event into lines; what they give is what the loop below gives.
        if event.startswith(b"event:"):
            nl = event.find(LF)
            if nl > 0 and event.startswith(b"data: ", nl + 1) and event.find(LF, nl + 1) < 0:
                return event[6:nl].strip().decode("utf-8", "replace"), event[nl + 7:]
        elif event.startswith(b"data: ") and LF not in event:
            return None, event[6:]
    return _fields_by_line(event)


class NamedEventChecker(EventChecker):
    """An EventChecker for the protocols whose events are named (Responses, Messages): each event
    read as its name and data (`event_fields`; the usual `event:` + `data:` chunk in place,
    `named_fields`), judged by the protocol's `check`."""

    # Set by the protocol's `check` once the stream is past its start: from then on an event whose
    # name is not MARKED asks of `check` only that its data be a JSON object of that type, before
    # the end (and, SEQUENCED, its sequence number kept).
    flowing = False
    MARKED: frozenset[str] = frozenset()
    SEQUENCED = False

    def feed(self, chunk: bytes) -> tuple[bytes, str | None]:
        if not self._pending and CR not in chunk:
            # (named_fields and `simple` written out for an event whose name was seen before, as
            # every event of a stream but its first few is: two calls an event cost as much as
            # the reading; tests/protocols/chat/test_event_checker.py checks they agree)
            line, sep, data = chunk.partition(_DATA_LINE)
            if sep and LF not in line and data.find(LF) == len(data) - 2 and data[-1] == LF \
                    and (name := _NAMES.get(line)) is not None:
                if self.flowing and name not in self.MARKED:
                    # The usual event (a delta) judged here: `check`'s verdict without its call and
                    # its tests of the names it marks; anything else it does not pass goes to it.
                    try:
                        payload = orjson.loads(data)
                    except orjson.JSONDecodeError:
                        payload = None
                    if type(payload) is dict and payload.get("type") == name and not self.done:
                        if self.SEQUENCED and isinstance(sequence := payload.get("sequence_number"), int):
                            self.sequence = sequence
                        return chunk, None
                why = self.check(name, data)
                return (chunk, None) if why is None else (b"", why)
        return EventChecker.feed(self, chunk)

    def simple(self, chunk: bytes) -> Any:
        fields = named_fields(chunk)
        # (the two fields passed by index: a `*fields` call packs a new tuple every event)
        return NOT_SIMPLE if fields is None else self.check(fields[0], fields[1])

    def event(self, event: bytes) -> str | None:
        name, data = event_fields(event)
        if data is None:
            return None  # a comment (a keep-alive) or a field without data
        return self.check(name, data)

    def check(self, name: str | None, data: bytes) -> str | None:
        """An event's name (None: none given) and data: why it is broken, or None."""
        raise NotImplementedError


def _fields_by_line(event: bytes) -> tuple[str | None, bytes | None]:
    """event_fields read line by line: any event, however its lines are framed."""
    name: str | None = None
    data: list[bytes] = []
    for line in event.splitlines():
        if line.startswith(b"event:"):
            name = line[6:].strip().decode("utf-8", "replace")
        elif line.startswith(b"data:"):
            d = line[5:]
            data.append(d[1:] if d.startswith(b" ") else d)
    return name, (b"\n".join(data) if data else None)


def _event_usage(event: bytes) -> Any:
    data = b"\n".join(line[5:].strip() for line in event.splitlines() if line.startswith(b"data:"))
    try:
        return orjson.loads(data).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return None


def _check_event(event: bytes) -> str | None:
    data = [line[5:] for line in event.splitlines() if line.startswith(b"data:")]
    if not data:
        return None  # comments (keep-alives) and event/id/retry fields
    payload = b"\n".join(d[1:] if d.startswith(b" ") else d for d in data)
    if payload.strip() == b"[DONE]" or _parses(payload):
        return None
    return "an event's data is not valid JSON"
