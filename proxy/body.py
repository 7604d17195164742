"""The client's request body: read whole within its size limit and its pace (a client dripping
bytes is cut), or streamed upstream under the same rules; and the form a large body goes upstream
in (`upstream_body`).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any, AsyncIterator

import aiohttp
from aiohttp import web

from proxy import bodycoding, errors, offload


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
    return await decoded(raw, header, limit)


async def decoded(raw: bytes, header: str | None, limit: int) -> bytes:
    """`raw` decoded (bodycoding): on the loop while its output stays small, else in a worker
    thread. What a body decodes to is not known from its compressed size (6.5 KB decoded to
    megabytes on the loop for 25 s), so a small one is tried here within offload's size and, past
    it, decoded again off the loop: the work thrown away is bounded by that size a layer."""
    if len(raw) <= offload.OFFLOAD_BYTES:
        try:
            return bodycoding.decode(raw, header, limit, budget=offload.OFFLOAD_BYTES)
        except bodycoding.OverBudget:
            pass
    return await offload.elsewhere(bodycoding.decode, raw, header, limit)


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
