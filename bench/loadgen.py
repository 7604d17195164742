"""A low-overhead HTTP/1.1 load generator on raw asyncio (uvloop when the caller installs it).

Loopback only, bounded in request count and in time. Each client holds one keep-alive connection
and sends its next request as soon as the previous answer ended (or after a think time, when one is
given); every request records its latency
(request written -> last byte), its time to first body byte (for SSE: the first event), how many
SSE events arrived, in how many socket reads, and the response headers the benchmark checks.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from bench.fake_upstream import ChunkedDecoder

LOOPBACK = "127.0.0.1"
KEPT_HEADERS = ("x-compaction-status", "x-compaction-tokens-before", "x-compaction-tokens-after",
                "x-compaction-wait-ms", "x-bench-events")
DEFAULT_HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}


class LoadError(Exception):
    """The benchmark itself broke: a refused connection, a timeout, a malformed answer."""


@dataclass
class Request:
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    path: str = "/v1/chat/completions"


@dataclass
class Result:
    status: int
    latency: float  # seconds
    ttfb: float  # seconds to the first body byte
    events: int  # `data:` lines in the body (SSE)
    reads: int  # socket reads that carried body bytes
    body_bytes: int
    headers: dict[str, str]


def request_head(req: Request, port: int) -> bytes:
    headers = {**DEFAULT_HEADERS, **req.headers, "Host": f"{LOOPBACK}:{port}", "Content-Length": str(len(req.body))}
    lines = [f"POST {req.path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class ClientProtocol(asyncio.Protocol):
    """One keep-alive connection, one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.closed = asyncio.get_running_loop().create_future()
        self._reset()

    def _reset(self) -> None:
        self.done: asyncio.Future[Result] | None = None
        self.first_byte: asyncio.Future[float] | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.length: int | None = None
        self.chunked: ChunkedDecoder | None = None
        self.body = bytearray()
        self.received = 0
        self.reads = 0
        self.t0 = 0.0
        self.t_first = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.closed.done():
            self.closed.set_result(None)
        for fut in (self.first_byte, self.done):
            if fut is not None and not fut.done():
                fut.set_exception(LoadError(f"connection closed mid-response ({exc or 'by the server'})"))

    def send(self, head: bytes, body: bytes) -> asyncio.Future[Result]:
        if self.transport is None:
            raise LoadError("connection is closed")
        loop = asyncio.get_running_loop()
        self._reset()
        self.done = loop.create_future()
        self.first_byte = loop.create_future()
        self.t0 = time.perf_counter()
        self.transport.writelines((head, body))
        return self.done

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.done is None:
            return  # nothing outstanding: ignore stray bytes
        self.buf += data
        if not self.head_done and not self._parse_head():
            return
        before = self.received
        finished = self._take_body()
        if self.received > before:
            self.reads += 1
            if not self.t_first:
                self.t_first = now
                assert self.first_byte is not None
                if not self.first_byte.done():
                    self.first_byte.set_result(now - self.t0)
        if finished:
            self._finish(now)

    def _parse_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[: end + 4]
        try:
            self.status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self._fail(f"malformed status line {lines[0][:80]!r}")
            return False
        all_headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            all_headers[name.strip().lower()] = value.strip()
        self.headers = {k: all_headers[k] for k in KEPT_HEADERS if k in all_headers}
        if "chunked" in all_headers.get("transfer-encoding", "").lower():
            self.chunked = ChunkedDecoder()
        elif "content-length" in all_headers:
            self.length = int(all_headers["content-length"])
        else:
            self._fail("response has neither Content-Length nor chunked encoding")
            return False
        self.head_done = True
        return True

    def _take_body(self) -> bool:
        """Move body bytes out of the buffer; True once the response is complete."""
        if self.chunked is not None:
            whole = self.chunked.feed(self.buf)
            self.received = len(self.chunked.body)
            if whole is not None:
                self.body = bytearray(whole)
                return True
            return False
        assert self.length is not None
        take = min(len(self.buf), self.length - self.received)
        self.body += self.buf[:take]
        del self.buf[:take]
        self.received += take
        return self.received >= self.length

    def _finish(self, now: float) -> None:
        assert self.done is not None
        result = Result(
            status=self.status,
            latency=now - self.t0,
            ttfb=(self.t_first or now) - self.t0,
            events=self.body.count(b"data:"),
            reads=self.reads,
            body_bytes=len(self.body),
            headers=self.headers,
        )
        if not self.first_byte.done():  # type: ignore[union-attr]
            self.first_byte.set_result(result.ttfb)  # type: ignore[union-attr]
        self.done.set_result(result)

    def _fail(self, why: str) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(LoadError(why))
        self.close()


async def connect(port: int) -> ClientProtocol:
    loop = asyncio.get_running_loop()
    try:
        _, proto = await loop.create_connection(ClientProtocol, LOOPBACK, port)
    except OSError as e:
        raise LoadError(f"cannot connect to {LOOPBACK}:{port}: {e}") from None
    return proto


@dataclass
class LoadResult:
    results: list[Result]
    wall_s: float
    clients: int

    @property
    def latencies(self) -> list[float]:
        return [r.latency for r in self.results]

    @property
    def throughput(self) -> float:
        return len(self.results) / self.wall_s if self.wall_s > 0 else 0.0

    def statuses(self) -> Counter[str]:
        """x-compaction-status values seen (absent for targets that are not the proxy)."""
        return Counter(r.headers.get("x-compaction-status", "-") for r in self.results)


async def run_load(
    port: int,
    requests: Sequence[Request] | Callable[[int], Request],
    *,
    count: int,
    clients: int = 1,
    timeout_s: float = 60.0,
    deadline_s: float = 300.0,
    think_s: float = 0.0,
) -> LoadResult:
    """Send `count` requests with `clients` concurrent connections; raises LoadError on any failure.

    `requests` is a list (request i is requests[i % len]) or a function of the request index.
    Stops issuing new requests after `deadline_s`; each request may take at most `timeout_s`.
    `think_s`: after each answer a client waits a time drawn evenly from [0, think_s] before its
    next request, so clients that started together drift out of step (each client draws from its
    own seeded sequence: every target sees the same waits).
    """
    pick = requests if callable(requests) else (lambda i: requests[i % len(requests)])
    counter = itertools.count()
    results: list[Result] = []
    stop_at = time.perf_counter() + deadline_s

    async def client(k: int) -> None:
        think = random.Random(k).uniform if think_s > 0 else None
        conn = await connect(port)
        try:
            while (i := next(counter)) < count and time.perf_counter() < stop_at:
                req = pick(i)
                try:
                    result = await asyncio.wait_for(conn.send(request_head(req, port), req.body), timeout_s)
                except asyncio.TimeoutError:
                    raise LoadError(f"no complete answer within {timeout_s:g} s (request {i})") from None
                if result.status != 200:
                    raise LoadError(f"HTTP {result.status} for request {i}")
                results.append(result)
                if think is not None:
                    await asyncio.sleep(think(0.0, think_s))
        finally:
            conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(max(1, min(clients, count)))))
    return LoadResult(results, time.perf_counter() - t0, clients)


@dataclass
class HeldStreams:
    """Streams opened and left idle by `hold_streams`; `close()` drops every connection."""

    conns: list[ClientProtocol]
    ttfb: list[float]
    open_s: float

    async def close(self) -> None:
        for c in self.conns:
            c.close()
        await asyncio.gather(*(c.closed for c in self.conns), return_exceptions=True)


async def hold_streams(port: int, n: int, req: Request, *, timeout_s: float = 60.0, connect_batch: int = 100) -> HeldStreams:
    """Open `n` concurrent streams and wait until each got its first event (the server holds them)."""
    t0 = time.perf_counter()
    conns: list[ClientProtocol] = []
    sem = asyncio.Semaphore(connect_batch)  # a burst of connects beyond the listen backlog stalls

    async def one() -> float:
        async with sem:
            conn = await connect(port)
            conns.append(conn)
            conn.send(request_head(req, port), req.body).add_done_callback(_quiet)
            assert conn.first_byte is not None
            return await conn.first_byte

    try:
        ttfb = await asyncio.wait_for(asyncio.gather(*(one() for _ in range(n))), timeout_s)
    except (asyncio.TimeoutError, LoadError) as e:
        held = HeldStreams(conns, [], 0.0)
        await held.close()
        raise LoadError(f"could not hold {n} streams open: {e or 'timed out'}") from None
    return HeldStreams(conns, list(ttfb), time.perf_counter() - t0)


def _quiet(fut: asyncio.Future[Result]) -> None:
    if not fut.cancelled():
        fut.exception()


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (pct in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = math.ceil(pct / 100 * len(ordered))
    return ordered[max(0, min(len(ordered), rank) - 1)]
