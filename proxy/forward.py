"""Moving bytes between client and upstream: header filtering, pass-through, response relay.

Pass-through routes are relayed without looking inside: an SSE stream chunk by chunk (never
coalesced, never held back), anything else streamed when large. Chat completion answers are
checked on the way (`relay_completion`, `relay_events`): an answer that is not what OpenAI's API
sends becomes an OpenAI-shaped error, so clients raise an APIError instead of a decoding error.
"""

from __future__ import annotations

import asyncio
import functools
import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Any, AsyncIterator

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.config import secret
from proxy import bodycoding, errors, offload
from proxy.credentials import configured_credential, sent_credentials

log = logging.getLogger("proxy.forward")

# RFC 9110 7.6.1 hop-by-hop headers, plus those aiohttp recomputes for the new connection.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
PROXY_HEADER_PREFIX = "x-compaction-"
SMALL_BODY = 1 << 20  # bodies up to this size are read whole; larger ones are streamed


def wants_bypass(headers: Any) -> bool:
    """The client asked that this request go upstream as it came (`x-compaction-bypass`)."""
    return headers.get("x-compaction-bypass", "").strip().lower() in ("1", "true", "yes")


def upstream_request_headers(
    incoming: Any, api_key: str | None, *, identity_encoding: bool = False, key_header: str = "Authorization",
    raw_body: bool = False,
) -> CIMultiDict[str]:
    """Client headers minus hop-by-hop and our own; the configured key (as `key_header`:
    Authorization, or Anthropic's x-api-key) when the client sent no credential of any kind
    (`api-key` and `x-api-key` count). Content-Encoding stays only with `raw_body` (the client's
    bytes forwarded as they came): a route that reads the body forwards it decoded (`read_body`)."""
    connection_listed = {
        t.strip().lower() for v in incoming.getall("connection", []) for t in v.split(",") if t.strip()
    }
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        low = name.lower()
        if low in HOP_BY_HOP or low in connection_listed or low.startswith(PROXY_HEADER_PREFIX):
            continue
        if identity_encoding and low == "accept-encoding":
            continue
        if not raw_body and low == "content-encoding":
            continue
        out.add(name, value)
    if api_key and not sent_credentials(out):
        out.update(configured_credential(api_key, key_header))
    if identity_encoding:
        # We may need to read this response (errors, retries): keep it uncompressed.
        out["Accept-Encoding"] = "identity"
    return out


def client_response_headers(upstream: Any) -> CIMultiDict[str]:
    """The upstream's answer headers minus hop-by-hop ones and those its Connection header lists,
    in their order. Copied whole and then removed from: a copy in C and a dozen deletes cost a
    small answer half (an upstream's twenty-odd headers a quarter) of a Python loop over them."""
    out: CIMultiDict[str] = CIMultiDict(upstream)
    for name in HOP_BY_HOP:
        if name in out:
            del out[name]  # (every header of that name, whatever its case)
    if "connection" in upstream:
        for v in upstream.getall("connection"):
            for t in v.split(","):
                t = t.strip()
                if t and t in out:
                    del out[t]
    return out


def is_event_stream(resp: aiohttp.ClientResponse) -> bool:
    return resp.headers.get("content-type", "").lower().startswith("text/event-stream")


_TIMEOUTS: dict[tuple[bool, float, float], aiohttp.ClientTimeout] = {}
_CACHED = 64  # distinct timeouts kept (a config has a handful; a reloaded one adds its own)


def client_timeout(cfg: Any, *, streaming: bool) -> aiohttp.ClientTimeout:
    """Whole-request limit for plain calls; an idle-read limit for streams (they may run long).
    Made once per distinct value (ClientTimeout is immutable; making one costs every request)."""
    key = (streaming, cfg.connect_timeout_s, cfg.stream_idle_timeout_s if streaming else cfg.timeout_s)
    timeout = _TIMEOUTS.get(key)
    if timeout is None:
        if streaming:
            timeout = aiohttp.ClientTimeout(total=None, connect=key[1], sock_read=key[2])
        else:
            timeout = aiohttp.ClientTimeout(total=key[2], connect=key[1])
        if len(_TIMEOUTS) >= _CACHED:
            _TIMEOUTS.clear()
        _TIMEOUTS[key] = timeout
    return timeout


def map_client_error(e: BaseException) -> errors.ProxyError:
    """An aiohttp/asyncio failure talking to the upstream, as the 502/504 the client gets."""
    if isinstance(e, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return errors.upstream_timeout("no response within the configured timeout")
    if isinstance(e, aiohttp.ClientConnectorError):
        return errors.upstream_unreachable(f"cannot connect ({e.os_error.__class__.__name__})")
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return errors.upstream_unreachable("the upstream closed the connection")
    if isinstance(e, aiohttp.ClientPayloadError):
        return errors.upstream_bad_response("the response body was cut off")
    if isinstance(e, aiohttp.ClientResponseError):
        return errors.upstream_bad_response(e.message)
    return errors.upstream_unreachable(e.__class__.__name__)


UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
CLIENT_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)  # writing to a departed client


_URLS: dict[tuple[str, str], URL] = {}


def upstream_url(base_url: str, request: web.Request, raw_tail: str) -> URL:
    """base_url + the path tail, with the client's query string, both exactly as the client encoded
    them: decoding and re-encoding would change `%2F`, `%20` or `+` (and thus the request). A
    route's URL without a query is made once (URL is immutable; parsing one costs every request)."""
    query = request.rel_url.raw_query_string
    if query:
        return URL(f"{base_url}{raw_tail}?{query}", encoded=True)
    url = _URLS.get((base_url, raw_tail))
    if url is None:
        url = URL(base_url + raw_tail, encoded=True)
        if len(_URLS) >= _CACHED:  # (pass-through tails are the client's: bounded)
            _URLS.clear()
        _URLS[(base_url, raw_tail)] = url
    return url


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    extra_headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Send the upstream's response to the client: status, headers, body as it arrives."""
    headers = client_response_headers(upstream.headers)
    if extra_headers:
        headers.update(extra_headers)
    length = upstream.content_length
    streaming = is_event_stream(upstream) or length is None or length > SMALL_BODY
    if not streaming:
        try:
            body = await upstream.read()
        except UPSTREAM_ERRORS as e:
            return map_client_error(e).response(extra_headers)
        return web.Response(status=upstream.status, body=body, headers=headers)

    resp = web.StreamResponse(status=upstream.status, headers=headers)
    if length is not None and not upstream.headers.get("content-encoding"):
        resp.content_length = length
    await resp.prepare(request)
    sse = is_event_stream(upstream)
    try:
        async for chunk in upstream.content.iter_any():
            await resp.write(chunk)
    except CLIENT_GONE:
        # The client went away: stop reading; leaving the context closes the upstream request.
        upstream.close()
        return resp
    except UPSTREAM_ERRORS as e:
        upstream.close()
        err = map_client_error(e)
        log.warning("upstream stream ended abnormally: %s", err.message)
        if sse:
            if not await _write_error_event(resp, err):
                return resp
        else:
            # A cut body must look cut to the client, not complete: drop the connection.
            if request.transport is not None:
                request.transport.abort()
            return resp
    try:
        await resp.write_eof()
    except CLIENT_GONE:
        pass
    return resp


async def _write_error_event(resp: web.StreamResponse, err: errors.ProxyError, checker: "EventChecker | None" = None) -> bool:
    """End a stream with an `error` event in the protocol's shape (the SDKs raise an APIError on
    it, so the client learns why), as the stream's checker writes it when known. False when the
    client is gone already."""
    try:
        await resp.write(checker.error_event(err) if checker is not None else err.event())
    except CLIENT_GONE:
        return False
    return True


NOT_PARSED: Any = object()  # relay_completion did not look inside the answer


async def relay_completion(
    request: web.Request, upstream: aiohttp.ClientResponse, extra_headers: dict[str, str]
) -> tuple[web.StreamResponse, Any]:
    """A chat completion answer that is not an event stream, read whole (such answers are small),
    and its JSON as the check parsed it (NOT_PARSED when it did not: not a JSON 200), so that its
    usage is read without a second parse.

    A 200 whose JSON does not parse is not the upstream's error but a broken answer: the client
    gets a 502 it can retry, not a body its SDK fails to decode.
    """
    if upstream.headers.get("content-encoding"):
        # we asked for identity; cannot look inside
        return await relay(request, upstream, extra_headers), NOT_PARSED
    try:
        body = await upstream.read()
    except UPSTREAM_ERRORS as e:
        return map_client_error(e).response(extra_headers), NOT_PARSED
    answer = NOT_PARSED
    if upstream.status == 200 and _is_json(upstream):
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            log.warning("upstream answered 200 with malformed JSON (%d bytes)", len(body))
            return errors.upstream_bad_response("the JSON body is malformed").response(extra_headers), NOT_PARSED
    headers = client_response_headers(upstream.headers)
    headers.update(extra_headers)
    return web.Response(status=upstream.status, body=body, headers=headers), answer


def _is_json(resp: aiohttp.ClientResponse) -> bool:
    return resp.headers.get("content-type", "").lower().startswith("application/json")


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
DRAIN_S = 1.0  # after [DONE], how long we wait for the upstream's end of stream
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
            why = self.simple(chunk)
            if why is not NOT_SIMPLE:
                return (chunk, None) if why is None else (b"", why)
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
        stream that numbers its events overrides it (proxy/responses/stream.py)."""
        return err.event()


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


class _BrokenStream(Exception):
    """The upstream's event stream is not what OpenAI sends."""


async def relay_events(
    request: web.Request, upstream: aiohttp.ClientResponse, extra_headers: dict[str, str], first: bytes,
    checker: EventChecker | None = None,
) -> web.StreamResponse:
    """A chat completion event stream whose first bytes (`first`) were read already. A broken event
    or a cut stream ends the client's stream with an `error` event instead of garbage. `checker`
    (a new one by default) is left with what it saw (the usage)."""
    headers = client_response_headers(upstream.headers)
    headers.update(extra_headers)
    resp = web.StreamResponse(status=upstream.status, headers=headers)
    checker = checker or EventChecker()
    chunk = first
    good, why = checker.feed(chunk) if chunk else (b"", None)
    if good:
        # The first events are in hand: the headers go out in the same write as they do, one send
        # instead of two (aiohttp's switch, as its web.Response sets it; unknown to a later aiohttp,
        # it would only send them first again).
        resp._send_headers_immediately = False
    await resp.prepare(request)
    try:
        while chunk:
            if good:
                await resp.write(good)
            if why is not None:
                raise _BrokenStream(why)
            chunk = await upstream.content.readany()
            if chunk:
                good, why = checker.feed(chunk)
        good, why = checker.finish()
        if good:
            await resp.write(good)
        if why is not None:
            raise _BrokenStream(why)
        await resp.write_eof()
    except CLIENT_GONE:
        if checker.done:
            # The openai SDKs hang up right after [DONE]: a normal end. Read the upstream's last
            # bytes so its connection goes back to the pool instead of being cut.
            with contextlib.suppress(*UPSTREAM_ERRORS):
                await asyncio.wait_for(upstream.content.read(), DRAIN_S)
        if not upstream.content.at_eof():
            upstream.close()  # stop reading; leaving the caller's context closes the upstream request
    except (_BrokenStream, *UPSTREAM_ERRORS) as e:
        upstream.close()
        err = errors.upstream_bad_response(str(e)) if isinstance(e, _BrokenStream) else map_client_error(e)
        log.warning("upstream stream ended abnormally: %s", err.message)
        if await _write_error_event(resp, err, checker):
            try:
                await resp.write_eof()
            except CLIENT_GONE:
                pass
    return resp


def _has_dot_segment(path: str) -> bool:
    """On the decoded path, so that percent-encoded dots and slashes count too."""
    return any(seg in (".", "..") for seg in path.split("/"))


@dataclass(frozen=True)
class BodyPace:
    """How slowly a request body may arrive: all of it within `timeout_s`, or, for a large one,
    no slower than `min_bytes_s` on average after that (a rate floor rather than a total, so a big
    upload on a slow link passes while a client dripping bytes is cut)."""

    timeout_s: float
    min_bytes_s: float

    @classmethod
    def of(cls, server: Any) -> "BodyPace":
        return _pace(server.body_timeout_s, server.body_min_kb_s)

    def timed_out(self) -> errors.ProxyError:
        return errors.ProxyError(
            408,
            f"The request body did not arrive in time (within {self.timeout_s:g} s, then at least "
            f"{self.min_bytes_s / 1024:g} KiB/s).",
            code="request_timeout",
        )


@functools.lru_cache(maxsize=16)  # every request asks; the config's two numbers make it (immutable, shared)
def _pace(timeout_s: float, min_kb_s: float) -> BodyPace:
    return BodyPace(timeout_s, min_kb_s * 1024)


class _Arrival:
    """A body's limits as it arrives: 413 past `limit` bytes; `due`, when its next byte is due at
    the latest (`pace`: all within timeout_s, then no slower than min_bytes_s on average)."""

    __slots__ = ("due", "seen", "limit", "per_byte_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int, pace: BodyPace) -> None:
        self.due = loop.time() + pace.timeout_s
        self.seen = 0
        self.limit = limit
        self.per_byte_s = 1 / pace.min_bytes_s

    def took(self, n: int) -> None:
        self.seen += n
        if self.seen > self.limit:
            raise errors.body_too_large(self.limit)
        self.due += n * self.per_byte_s


async def body_chunks(request: web.Request, limit: int, pace: BodyPace) -> AsyncIterator[bytes]:
    """The body as it arrives: 413 past `limit`, 408 when it falls behind `pace`."""
    loop = asyncio.get_running_loop()
    arrival = _Arrival(loop, limit, pace)
    while True:
        try:
            chunk = await asyncio.wait_for(request.content.readany(), max(0.0, arrival.due - loop.time()))
        except asyncio.TimeoutError:
            raise pace.timed_out() from None
        if not chunk:
            return
        arrival.took(len(chunk))
        yield chunk


_timeout_at = getattr(asyncio, "timeout_at", None)  # Python 3.11+


async def read_raw_body(request: web.Request, limit: int, pace: BodyPace) -> bytes:
    """The whole body as it came, within its pace: a client dripping a body byte by byte must not
    hold a connection (and its memory) open for ever."""
    body = _arrived(request, limit)
    return body if body is not None else await _arriving(request, limit, pace)


async def _arriving(request: web.Request, limit: int, pace: BodyPace) -> bytes:
    """The whole of a body still arriving (`_arrived` said None), within its limit and pace."""
    if _timeout_at is None:
        return b"".join([chunk async for chunk in body_chunks(request, limit, pace)])
    # body_chunks' rules with one timer for the whole body instead of a wait_for (a task, a timer
    # and a loop step more) per chunk, ~4 chunks a 580 KB body. The timer is set at the deadline
    # as it stands; the deadline only moves later as bytes come, so when the timer goes off the
    # body is either late (408) or was given more time meanwhile: then it is set again (a
    # readany cancelled while waiting has taken nothing from the stream).
    loop = asyncio.get_running_loop()
    arrival = _Arrival(loop, limit, pace)
    content = request.content
    parts: list[bytes] = []
    while True:
        try:
            async with _timeout_at(arrival.due):
                while chunk := await content.readany():
                    arrival.took(len(chunk))
                    parts.append(chunk)
                return b"".join(parts)
        except TimeoutError:
            if loop.time() >= arrival.due:
                raise pace.timed_out() from None


def _arrived(request: web.Request, limit: int) -> bytes | None:
    """The whole body when it came with the headers (nearly every small request): nothing to wait
    for, so no timer and no task; None when more is to come. 413 past `limit`."""
    content = request.content
    if not content.is_eof():
        # (Content-Length checked only here: a body that came whole is its own length, checked
        # below; parsing the header cost every small request ~2k instructions)
        length = request.content_length
        if length is not None and length > limit:
            raise errors.body_too_large(limit)
        return None
    body = content.read_nowait()
    if len(body) > limit:
        raise errors.body_too_large(limit)
    return body


# What a compressed body is guessed to inflate to, to decide whether decoding leaves the loop.
_INFLATION_GUESS = 8


async def read_body(request: web.Request, limit: int, pace: BodyPace) -> bytes:
    """The whole body, decoded when it came compressed (bodycoding: the limit applies to the
    decoded size too; an unknown coding is refused before a byte is read)."""
    header = request.headers.get("Content-Encoding")
    found = bodycoding.check_codings(header) if header is not None else None
    raw = _arrived(request, limit)  # (read_raw_body's two steps here: one coroutine fewer)
    if raw is None:
        raw = await _arriving(request, limit, pace)
    if not found:
        return raw
    return await offload.sized(len(raw) * _INFLATION_GUESS, bodycoding.decode, raw, header, limit)


# A body larger than this goes upstream in two writes rather than one copy (`upstream_body`).
PIECES_FROM = 64 << 10
FIRST_PIECE = 16 << 10


class _Pieces(aiohttp.BytesPayload):
    """A large body written as its first FIRST_PIECE bytes, then the rest as a view of the same
    bytes. aiohttp sends a request's headers in one write with the first piece of its body, and
    on Python before 3.12.9 it joins the two into new bytes to do so (it avoids the transport's
    writelines there): for the body as one piece, a copy of all of it on every request (580 KB
    for a 100k-token history). Written so, only the first piece is copied; the bytes on the wire
    are the same, in one more write."""

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        view = memoryview(self._value)
        if content_length is not None:
            view = view[:content_length]
        await writer.write(view[:FIRST_PIECE])
        if len(view) > FIRST_PIECE:
            await writer.write(view[FIRST_PIECE:])


def upstream_body(data: bytes) -> bytes | aiohttp.BytesPayload:
    """What the upstream request is given as its body: `data`, or a large one in pieces (_Pieces)."""
    return _Pieces(data) if len(data) > PIECES_FROM else data


class LimitedBody:
    """A request body streamed upstream that stops at the size limit or when it falls behind its
    pace, and remembers why.

    Both happen inside aiohttp's body writer, which reports them as a broken upstream connection;
    `error` lets the caller answer 413 or 408 instead of 502.
    """

    def __init__(self, request: web.Request, limit: int, pace: BodyPace) -> None:
        self._request = request
        self._limit = limit
        self._pace = pace
        self.error: errors.ProxyError | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in body_chunks(self._request, self._limit, self._pace):
                yield chunk
        except errors.ProxyError as e:
            self.error = e
            raise


async def passthrough(
    request: web.Request, session: aiohttp.ClientSession, cfg: Any, max_body: int, pace: BodyPace,
    *, base_path: str = "/v1", key_header: str = "Authorization",
) -> web.StreamResponse:
    """Any other /v1/ route: same method, path, query and body, streamed both ways. `base_path`:
    the part of the client's path that `cfg.base_url` already ends with (Anthropic's has none);
    `key_header` carries `cfg.api_key`."""
    if _has_dot_segment(request.path):
        # Forwarded raw, `/v1/../x` (or `%2e%2e`, `..%2f`) would reach upstream paths outside the
        # configured base URL once the upstream normalizes it; no OpenAI route has such segments.
        raise errors.bad_request("The request path must not contain '.' or '..' segments.", code="invalid_path")
    length = request.content_length
    if length is not None and length > max_body:
        raise errors.body_too_large(max_body)
    streamed: LimitedBody | None = None
    data: Any
    if not request.body_exists:
        data = None
    elif length is not None and length <= SMALL_BODY:
        data = await read_raw_body(request, max_body, pace)
    else:
        streamed = LimitedBody(request, max_body, pace)
        data = streamed.chunks()
    url = upstream_url(cfg.base_url, request, request.rel_url.raw_path[len(base_path):])
    headers = upstream_request_headers(
        request.headers, secret(cfg.api_key), key_header=key_header,
        raw_body=True,
    )
    if streamed is not None and length is not None:
        # A streamed body of known size keeps its Content-Length: some upstreams refuse chunked uploads.
        headers["Content-Length"] = str(length)
    try:
        async with session.request(
            request.method,
            url,
            data=data,
            headers=headers,
            timeout=client_timeout(cfg, streaming=True),
            allow_redirects=False,
        ) as upstream:
            return await relay(request, upstream)
    except UPSTREAM_ERRORS as e:
        if streamed is not None and streamed.error is not None:
            raise streamed.error from None
        raise map_client_error(e) from None
