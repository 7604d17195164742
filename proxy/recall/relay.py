"""Recall inside an event stream, whatever the protocol (design.md § Recall): the client gets one stream;
round after round, the upstream's events go through the protocol's filter (`Rounds`: chat_stream,
responses_stream, messages_stream), which relays what the client may see at once (text stays),
holds a recall call's events back, and keeps the round's end for the end of the last round. A
round of recall calls only is answered here and its continuation streams into the same response.

The response headers go out with the first event the client gets, so `x-compaction-recalls`
counts the lookups made before it (usually all of them: a model looks up before it writes). When
lookups come after that, the final count goes in an SSE comment before the stream's last events
(`: x-compaction-recalls: N`; every SSE client skips comments), in the log line and in the
`recall_calls_after_headers_total` metric: a header cannot change once sent, and a trailer has no
place in an event stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

import aiohttp
import orjson
from aiohttp import web

from proxy import errors
from proxy.forward import CLIENT_GONE, UPSTREAM_ERRORS, client_response_headers, is_event_stream, map_client_error
from proxy.sse import EventChecker
from proxy.recall.answers import Call, Sent, sent_body
from proxy.recall.session import RecallSession

log = logging.getLogger("proxy.recall")

_EVENT_END = re.compile(rb"\r?\n\r?\n")
RECALLS = "x-compaction-recalls"


class Rounds(Protocol):
    """One protocol's filter over one client request's upstream streams, round after round."""

    usage: Any  # the sum of every round's usage (None when the upstream sent none)

    def start(self) -> None:
        """A round begins (its upstream stream follows)."""

    def feed(self, event: bytes) -> list[bytes]:
        """Events for the client now (possibly none) for one whole upstream event."""

    dropped: bool  # a recall call was left out of a round that goes to the client

    def recall_calls(self) -> list[Any]:
        """This round's recall calls (each with `.id` and `.arguments`)."""

    def has_client_calls(self) -> bool:
        """Whether this round also calls one of the client's own tools."""

    def continuation(self, body: dict[str, Any], results: list[str], *, last: bool) -> dict[str, Any]: ...

    def close(self) -> list[bytes]:
        """The last events of the client's stream (the round's end, summed usage)."""

    def error_event(self, err: errors.ProxyError) -> bytes: ...


def answered_here(rounds: Rounds, over: bool) -> bool:
    """Whether this round is answered inside the proxy: recall calls only (`over`: no rounds left).
    A round that goes to the client with recall calls in it has them dropped."""
    recall, client = bool(rounds.recall_calls()), rounds.has_client_calls()
    if recall and (client or over):
        rounds.dropped = True
    return recall and not client and not over


def comment(text: str) -> bytes:
    """An SSE comment (clients skip it): what the headers could not say any more."""
    return b": " + text.encode() + b"\n\n"


Post = Callable[[dict[str, Any]], Awaitable[aiohttp.ClientResponse]]


@dataclass
class StreamResult:
    response: web.StreamResponse
    usage: Any  # the sum of every round's usage (None when the upstream sent none)


class _ClientStream:
    """The one response the client gets: its headers go out with the first events, counting the
    recall calls made by then."""

    def __init__(self, request: web.Request, headers: Any, extra: dict[str, str], session: RecallSession) -> None:
        self.request, self.headers, self.extra, self.session = request, headers, extra, session
        self.resp: web.StreamResponse | None = None
        self.headed = 0  # the recall calls the headers counted

    async def write(self, events: list[bytes]) -> None:
        if not events:
            return
        if self.resp is None:
            headers = self.headers.copy()
            headers.update(self.extra)
            self.headed = self.session.calls
            headers[RECALLS] = str(self.headed)
            self.resp = web.StreamResponse(status=200, headers=headers)
            await self.resp.prepare(self.request)
        await self.resp.write(b"".join(events))

    async def fail(self, err: errors.ProxyError, rounds: Rounds) -> StreamResult:
        """The protocol's error event ends the stream (the headers may have gone out already)."""
        log.warning("upstream stream ended abnormally: %s", err.message)
        with contextlib.suppress(*CLIENT_GONE):
            await self.write([rounds.error_event(err)])
            assert self.resp is not None
            await self.resp.write_eof()
        return StreamResult(_done(self.resp), rounds.usage)

    async def finish(self, rounds: Rounds, hooks: Any) -> None:
        """The last round's end; the final recall count in a comment when the headers undercount."""
        end = rounds.close()
        calls, headed = self.session.calls, self.headed
        if self.resp is not None and calls != headed:
            # the headers went out before these lookups: the final count where a stream can carry it
            end = [comment(f"{RECALLS}: {calls}"), *end]
            log.info("recall: %d of %d lookup(s) came after the stream's headers (%s: %d there)", calls - headed,
                     calls, RECALLS, headed)
            if hooks is not None:
                hooks.recall_after_headers(calls - headed, self.session.protocol)
        await self.write(end or [b""])
        assert self.resp is not None
        await self.resp.write_eof()


async def _round(current: aiohttp.ClientResponse, chunk: bytes | None, check: EventChecker, rounds: Rounds,
                 write: Callable[[list[bytes]], Awaitable[None]]) -> str | None:
    """One upstream stream through the protocol's checker and filter to the client; None when it
    ended whole, else why it broke (the upstream's read errors propagate)."""
    while True:
        if chunk is None:
            chunk = await current.content.readany()
        if not chunk:
            good, broken = check.finish()
            await _pass(good, rounds, write)
            return broken
        good, broken = check.feed(chunk)
        chunk = None
        await _pass(good, rounds, write)
        if broken is not None:
            return broken


async def _continuation(body: Sent, session: RecallSession, rounds: Rounds) -> dict[str, Any]:
    """The request that continues with the round's recall calls answered."""
    last = session.exhausted
    results = await session.answer_calls([c.arguments for c in rounds.recall_calls()])
    return rounds.continuation(await sent_body(body), results, last=last)


async def _rounds(out: _ClientStream, upstream: aiohttp.ClientResponse, first: bytes, body: Sent,
                  post: Post, rounds: Rounds, checker: Callable[[], EventChecker], hooks: Any) -> StreamResult:
    """Round after round until one goes to the client whole; the upstream's streams are closed."""
    session = out.session
    current, chunk = upstream, first
    try:
        while True:
            rounds.start()
            try:
                broken = await _round(current, chunk, checker(), rounds, out.write)
            except UPSTREAM_ERRORS as e:
                if isinstance(e, CLIENT_GONE):
                    raise
                current.close()
                return await out.fail(map_client_error(e), rounds)
            if broken is not None:
                current.close()
                return await out.fail(errors.upstream_bad_response(broken), rounds)
            if not answered_here(rounds, over=session.rounds > session.max_rounds):
                break
            body = await _continuation(body, session, rounds)
            if current is not upstream:
                current.release()
            try:
                current = await post(body)
            except UPSTREAM_ERRORS as e:
                return await out.fail(map_client_error(e), rounds)
            if current.status != 200 or not is_event_stream(current):
                why = await _error_text(current)
                return await out.fail(errors.upstream_bad_response(f"the upstream refused the request after a recall ({why})"), rounds)
            chunk = None
        await out.finish(rounds, hooks)
    except CLIENT_GONE:
        pass
    finally:
        if current is not upstream:
            current.close()
    return StreamResult(_done(out.resp), rounds.usage)


async def relay(request: web.Request, upstream: aiohttp.ClientResponse, first: bytes, extra: dict[str, str],
                body: Sent, post: Post, session: RecallSession, rounds: Rounds,
                checker: Callable[[], EventChecker] = EventChecker, hooks: Any = None) -> StreamResult:
    """Relay an event stream whose first bytes were read, answering recall rounds inside it
    (`post` sends a continuation upstream; `checker` makes the protocol's event checker)."""
    out = _ClientStream(request, client_response_headers(upstream.headers), extra, session)
    return await _rounds(out, upstream, first, body, post, rounds, checker, hooks)


def events_of(good: bytes) -> list[bytes]:
    """Whole events of checked bytes (an unterminated last one too: what finish() gave)."""
    out: list[bytes] = []
    pos = 0
    for m in _EVENT_END.finditer(good):
        out.append(good[pos:m.end()])
        pos = m.end()
    if pos < len(good):
        out.append(good[pos:])
    return out


async def _pass(good: bytes, rounds: Rounds, write: Callable[[list[bytes]], Awaitable[None]]) -> None:
    if not good:
        return
    out: list[bytes] = []
    for event in events_of(good):
        out += rounds.feed(event)
    await write(out)


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    try:
        raw = await asyncio.wait_for(resp.read(), 5)
    except UPSTREAM_ERRORS:
        return f"status {resp.status}"
    try:
        return f"status {resp.status}: {str(orjson.loads(raw)['error']['message'])[:300]}"
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"status {resp.status}"


def _done(resp: web.StreamResponse | None) -> web.StreamResponse:
    # None only when the client left before anything was written: nothing more goes to it.
    return resp if resp is not None else web.Response(status=499)


__all__ = ["Call", "Rounds", "StreamResult", "events_of", "relay"]
