"""The Responses event stream (design.md § Responses API): what a relayed event must look like, how it ends, how
an overflow shows before any output, and how the proxy writes an error event.

OpenAI's stream: `event: <type>` and `data: <JSON object whose "type" is that name>`, each with a
`sequence_number`; no `[DONE]`; the end is `response.completed`, `response.failed` or
`response.incomplete`; an `error` event reports a failure mid-stream. Servers that reuse chat's
framing (LiteLLM) send data-only events and end with `data: [DONE]`: accepted, and relayed (the
SDKs stop at it). A model server that cannot
fit the prompt may still answer 200 and fail the response (`response.failed` whose error code is
`context_length_exceeded`) before any output item: that is an overflow, retried compacted like an
HTTP 400, as long as nothing has gone to the client.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from proxy import errors
from proxy.sse import NamedEventChecker, Read
from proxy.exchange import Usage
from proxy.upstream import is_context_overflow

END_EVENTS = frozenset({"response.completed", "response.failed", "response.incomplete"})
# Events that come before the model's output: held back until the stream shows it is no overflow.
PREAMBLE = frozenset({"response.created", "response.in_progress", "response.queued"})
OVERFLOW_CODE = "context_length_exceeded"


def is_overflow_failure(response: Any) -> bool:
    """A failed response object whose error is the context window (the code, or its message)."""
    if not isinstance(response, dict) or response.get("status") != "failed":
        return False
    err = response.get("error")
    if not isinstance(err, dict):
        return False
    if err.get("code") == OVERFLOW_CODE:
        return True
    return is_context_overflow(400, orjson.dumps({"error": err}))  # the message patterns chat knows


class ResponsesEventChecker(NamedEventChecker):
    """EventChecker for the Responses format. Besides the base's bookkeeping it knows the last
    sequence number (the proxy's error event follows it), whether output began, and whether the
    stream failed for the context window before that."""

    MARKED = END_EVENTS | PREAMBLE | {"error"}  # (what `check` does more for than read the type)
    SEQUENCED = True

    def __init__(self, max_event_bytes: int | None = None) -> None:
        super().__init__(*(() if max_event_bytes is None else (max_event_bytes,)))
        self.sequence = -1
        self.output_started = False
        self.overflow = False
        self.end: str | None = None  # the end event's type
        self.response: Any = None  # the end event's response object

    def check(self, name: str | None, data: bytes) -> str | None:
        """An event's name (None: none given) and data: why it is broken, or None."""
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            if name is None and data.strip() == b"[DONE]":
                return None  # chat's end marker; whether the response ended is the end event's to say
            return "an event's data is not valid JSON"
        etype = payload.get("type") if type(payload) is dict else None
        if type(etype) is not str:
            return "an event's data is not an object with a type"
        if name is not None and name != etype:
            return f"an event named {name!r} carries a {etype!r} payload"
        if self.done:
            return f"a {etype!r} event after the end of the response"
        if isinstance(sequence := payload.get("sequence_number"), int):
            self.sequence = sequence
        if etype in END_EVENTS:
            self.done = True
            self.end = etype
            self.response = payload.get("response")
            if isinstance(self.response, dict) and isinstance(self.response.get("usage"), dict):
                self.usage = self.response["usage"]
            if etype == "response.failed" and not self.output_started and is_overflow_failure(self.response):
                self.overflow = True
        elif etype == "error":
            self.done = True  # nothing follows an error event
            self.end = etype
        elif etype not in PREAMBLE:
            self.output_started = self.flowing = True
        return None

    def ended(self) -> str | None:
        return None if self.done else "the stream ended before the response did (no response.completed)"

    def error_event(self, err: errors.ProxyError) -> bytes:
        """OpenAI's `error` event (ResponseErrorEvent), numbered after the last event relayed."""
        self.sequence += 1
        return error_event(err, self.sequence)


def error_event(err: errors.ProxyError, sequence: int) -> bytes:
    payload = {"type": "error", "sequence_number": sequence, "code": err.code, "message": err.message,
               "param": err.param}
    return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


async def read_preamble(upstream: aiohttp.ClientResponse) -> tuple[bytes, Read]:
    """The stream's first bytes up to (and with) its first event past the preamble, or all of it
    when it ends sooner; with the checker that read them and what it said (the relay goes on from
    there). `checker.overflow` tells the caller to retry compacted (nothing of this stream has
    gone to the client). A broken event stops the read: the relay reports it."""
    checker = ResponsesEventChecker()
    held, good = bytearray(), bytearray()
    while True:
        chunk = await upstream.content.readany()
        if not chunk:
            return bytes(held), Read(checker, bytes(good), None)
        held += chunk
        ok, why = checker.feed(chunk)
        good += ok
        if why is not None or checker.output_started or checker.done:
            return bytes(held), Read(checker, bytes(good), why)


def responses_usage(usage: Any) -> Usage | None:
    """A Responses `usage` object as the bill's Usage (input, cached input, output tokens)."""
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(prompt, cached if isinstance(cached, int) and 0 <= cached <= prompt else 0, completion)
