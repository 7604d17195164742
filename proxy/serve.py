"""Serving the app on a socket: the HTTP server's own limits, and one shutdown grace.

aiohttp's server closes a connection that sits idle for its keep-alive timeout (from the moment
it opens, and after each response), but it has no limit on how long a client may take to send a
request's headers once it starts, no cap on open connections, and on shutdown it waits its
timeout twice: once for handlers to finish, then again after asking them to stop, which a handler
relaying a stream never notices. So:

- `GuardedHandler` (aiohttp's connection protocol, extended) starts a clock at the first byte of a
  request and answers 408 and closes when its headers are not complete within
  `server.header_timeout_s` (a slowloris client drips them); and refuses a connection beyond
  `server.max_connections` with a 503 and `Retry-After`, closing it at once.
- `serve` stops listening on SIGTERM/SIGINT, gives the requests in flight `shutdown_grace_s` in
  all, cancels what is left, then closes the app (the store).

It relies on two internals of aiohttp's RequestHandler (`_messages`, the parsed requests waiting
for their handler, and `_request_in_progress`); tests/reliability/test_server_limits.py pins the behaviour.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import resource
import signal
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from proxy import errors
from proxy.config import Config
from proxy.ops.logs import flush_logs

log = logging.getLogger("proxy")

INFLIGHT = web.AppKey("inflight", set)  # handler tasks of the requests being served (app.serve_request adds them)
LOOP = web.AppKey("loop", asyncio.AbstractEventLoop)  # the loop serving the app
CANCEL_WAIT_S = 2.0  # after the grace: how long cancelled handlers get to unwind
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)  # each drains the proxy (a worker's supervisor forwards them)


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float
    max_connections: int


def _raw_error(status: str, err: errors.ProxyError, extra: str = "") -> bytes:
    body = err.body()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Connection: close\r\n{extra}\r\n").encode() + body


TOO_MANY = _raw_error("503 Service Unavailable", errors.ProxyError(
    503, "The proxy has too many open connections; retry shortly.", type="server_error", code="too_many_connections"
), "Retry-After: 1\r\n")
HEADERS_LATE = _raw_error("408 Request Timeout", errors.ProxyError(
    408, "The request's headers did not arrive in time.", code="request_timeout"
))


class GuardedHandler(RequestHandler):
    __slots__ = ("_limits", "_header_timer")

    def __init__(self, manager: "GuardedServer", **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limits: Limits = manager.limits
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        manager = self._manager
        if manager is not None and len(manager.connections) > self._limits.max_connections:
            # Refused cleanly: an answer the client can act on, and the descriptor freed now.
            transport.write(TOO_MANY)  # type: ignore[attr-defined]
            self.force_close()

    def data_received(self, data: bytes) -> None:
        waiting_for_headers = not self._request_in_progress and not self._messages
        super().data_received(data)
        if self._messages:  # the headers are complete
            self._stop_header_timer()
        elif waiting_for_headers and self._header_timer is None and self.transport is not None:
            # The clock starts with these bytes; a request whose headers came whole needs none.
            self._header_timer = self._loop.call_later(self._limits.header_timeout_s, self._headers_late)

    async def _handle_request(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self._stop_header_timer()  # bytes of this request's body may have started the clock
        return await super()._handle_request(*args, **kwargs)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self._request_in_progress or self._messages or self.transport is None:
            return
        self.transport.write(HEADERS_LATE)
        self.force_close()


class GuardedServer(web.Server):
    """aiohttp's server, making GuardedHandler connections."""

    limits: Limits

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self, loop=self._loop, **self._kwargs)


class ProxyRunner(web.AppRunner):
    def __init__(self, app: web.Application, limits: Limits, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._limits = limits

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = GuardedServer  # the same server, making our connections
        server.limits = self._limits  # type: ignore[attr-defined]
        return server


def raise_fd_limit(cfg: Config) -> None:
    """Room for every connection the config allows, both sides: the soft limit (often 1024) up to
    the hard one."""
    need = cfg.server.max_connections + cfg.upstream.max_connections + cfg.upstream.max_websockets + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return
        if target < need:
            log.warning("open-file limit %d is below what server.max_connections needs (%d)", target, need)


async def listen(app: web.Application, cfg: Config, *, reuse_port: bool = False) -> tuple[ProxyRunner, web.TCPSite]:
    """The app set up and listening on server.host:server.port (port 0: a free one, read back from
    the runner's addresses). The caller cleans the runner up. Raises OSError when the address
    cannot be bound."""
    s = cfg.server
    runner = ProxyRunner(
        app,
        Limits(header_timeout_s=s.header_timeout_s, max_connections=s.max_connections),
        handle_signals=False,
        access_log=None,
        handler_cancellation=True,
        keepalive_timeout=s.keepalive_timeout_s,
        shutdown_timeout=CANCEL_WAIT_S,
    )
    await runner.setup()
    # What startup made (modules, config, tokenizer tables: ~70k objects) lives as long as the
    # process: frozen, a full collection no longer scans it, and a request that triggers one no
    # longer pauses the loop for its sake (~0.1 s on a loaded core, each time).
    gc.collect()
    gc.freeze()
    try:
        site = web.TCPSite(runner, s.host, s.port, backlog=min(s.max_connections, 4096), reuse_port=reuse_port or None)
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, site


async def stop_serving(app: web.Application, runner: ProxyRunner, site: web.TCPSite, grace_s: float) -> None:
    """Stop listening, let the requests in flight finish within `grace_s`, cut the rest; a line
    when the draining is over, so an operator sees the stop completed (or what it cut)."""
    await site.stop()  # new connections are refused from now on
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle keep-alive connections close; busy ones take no next request
    cut = await drain(app[INFLIGHT], grace_s)
    if cut:
        log.info("shutdown grace over: cut %d requests still in flight", cut)
    else:
        log.info("drained: no request in flight, stopping")


def _stop_requested(stop: asyncio.Event, sig: signal.Signals, inflight: set[asyncio.Task[Any]]) -> None:
    if not stop.is_set():
        busy = sum(1 for t in inflight if not t.done())
        log.info("%s received: no new connections; draining %d requests in flight", sig.name, busy)
    stop.set()


async def serve(app: web.Application, cfg: Config, *, reuse_port: bool = False) -> None:
    """Serve until SIGTERM/SIGINT; then stop listening, give requests in flight the grace once,
    cancel the rest and close the app. Raises OSError when the address cannot be bound.
    `reuse_port`: one of several worker processes on the same port (SO_REUSEPORT)."""
    runner, site = await listen(app, cfg, reuse_port=reuse_port)
    try:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, _stop_requested, stop, sig, app[INFLIGHT])
        # a worker is forked with them blocked (proxy/workers.py): one sent while it started is delivered now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        await stop.wait()
        await stop_serving(app, runner, site, cfg.server.shutdown_grace_s)
    finally:
        await runner.cleanup()
        flush_logs()  # the access lines still queued (a worker process ends without exit handlers)


async def drain(inflight: set[asyncio.Task[Any]], grace_s: float) -> int:
    """Wait for the requests in flight, up to `grace_s` in all, counting those whose handler starts
    meanwhile (a request read before the listener closed whose task had not yet run when the wait
    began: looked at once, it would get only the cleanup's CANCEL_WAIT_S); then cancel what is
    left and give it CANCEL_WAIT_S to unwind. How many were cut."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while pending := {t for t in inflight if not t.done()}:
        left = deadline - loop.time()
        if left <= 0:
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
            return len(pending)
        await asyncio.wait(pending, timeout=left)
    return 0
