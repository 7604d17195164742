"""The part every fake upstream shares: a real aiohttp server on 127.0.0.1 (random port), its
lifecycle (async, or its own loop in a thread for synchronous tests), typed settings, and the
recording of every request with client disconnects noticed.

A fake subclasses FakeServer, sets its settings as attributes in __init__ *before* calling
`super().__init__(**settings)` (which applies the keyword arguments, refusing unknown names), and
implements `_route(request, rec)`; `_classify(rec)` may set `rec.kind` as the request arrives.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import orjson
from aiohttp import web

from proxy.fakes.common import RecordedRequest

# Per-request state of the fake's handlers (typed keys, as aiohttp recommends; plain strings on
# aiohttp versions before RequestKey existed).
_RequestKey = getattr(web, "RequestKey", None)
RESP_KEY: Any = _RequestKey("fake_resp", web.StreamResponse) if _RequestKey else "fake_resp"
ABORTED_KEY: Any = _RequestKey("fake_aborted", bool) if _RequestKey else "fake_aborted"


class FakeServer:
    """Lifecycle and recording. Public state: `port`, `loop`, `requests` (every RecordedRequest in
    arrival order), `disconnects` (requests the client abandoned), `errors` (exceptions raised by
    scripted callables)."""

    base_path = "/v1"  # what `base_url` ends with
    thread_name = "fake-upstream"

    def __init__(self, **settings: Any) -> None:
        self.requests: list[RecordedRequest] = []
        self.disconnects: int = 0
        self.errors: list[BaseException] = []
        for name, value in settings.items():
            if name.startswith("_") or not hasattr(self, name):
                raise TypeError(f"{type(self).__name__} has no setting {name!r}")
            setattr(self, name, value)
        self.port: int | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"http://127.0.0.1:{self.port}{self.base_path}"

    @property
    def origin(self) -> str:
        """http://127.0.0.1:PORT, without any path."""
        if self.port is None:
            raise RuntimeError(f"{type(self).__name__} is not started")
        return f"http://127.0.0.1:{self.port}"

    async def start(self, port: int = 0) -> "FakeServer":
        """Listen on 127.0.0.1:`port` (0: a free one, the tests' way; `compaction-proxy
        fake-upstream --port N` asks for its own)."""
        # Big client_max_size: the proxy forwards whole long histories and huge tool outputs.
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        # handler_cancellation: a client that goes away cancels its handler, so tests can see it
        # (RecordedRequest.disconnected); short shutdown_timeout: parked streams must not hold stop().
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.loop = asyncio.get_running_loop()
        self._stopping = False
        return self

    async def stop(self) -> None:
        if self._runner is None:
            return
        self._stopping = True
        for t in list(self._tasks):  # parked/stalled handlers would otherwise delay cleanup
            t.cancel()
        await self._runner.cleanup()
        self._runner = None

    async def __aenter__(self):
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # Thread mode, for synchronous tests: the server runs its own loop in a daemon thread. Set
    # events from the test thread with `fake.loop.call_soon_threadsafe(event.set)`.
    def start_in_thread(self):
        loop = asyncio.new_event_loop()
        started: list[BaseException | None] = []
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
                started.append(None)
            except BaseException as exc:  # report to the starting thread
                started.append(exc)
                return
            finally:
                ready.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name=self.thread_name, daemon=True)
        self._thread.start()
        ready.wait(60)  # a loaded machine can take seconds to schedule the thread
        if not started or started[0] is not None:
            raise RuntimeError(f"{type(self).__name__} failed to start: {started[0] if started else 'timeout'}")
        return self

    def stop_in_thread(self) -> None:
        if self._thread is None or self.loop is None:
            return
        loop = self.loop
        asyncio.run_coroutine_threadsafe(self.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(10)
        loop.close()
        self._thread = None

    def __enter__(self):
        return self.start_in_thread()

    def __exit__(self, *exc: Any) -> None:
        self.stop_in_thread()

    # ---- recordings --------------------------------------------------------------------------

    def records(self, kind: str | None = None) -> list[RecordedRequest]:
        """RecordedRequests, optionally only of one kind."""
        return [r for r in self.requests if kind is None or r.kind == kind]

    def clear_requests(self) -> None:
        """Forget the recordings (and, in subclasses, the simulated prompt cache); settings stay."""
        self.requests.clear()
        self.errors.clear()
        self.disconnects = 0

    async def wait_for_requests(self, n: int, kind: str | None = None, timeout: float = 30.0) -> list[RecordedRequest]:
        """Wait until at least n requests (of `kind`) were received; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        while len(self.records(kind)) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {n} {kind or ''} requests, got {len(self.records(kind))}")
            await asyncio.sleep(0.01)
        return self.records(kind)

    # ---- request handling --------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        rec = await self._record(request)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            return await self._route(request, rec)
        except asyncio.CancelledError:
            if not self._stopping and not request.get(ABORTED_KEY):
                rec.disconnected = True
                self.disconnects += 1
            raise
        except ConnectionResetError:  # client went away while we wrote
            rec.disconnected = True
            self.disconnects += 1
            return request.get(RESP_KEY) or web.Response(status=499)
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def _record(self, request: web.Request) -> RecordedRequest:
        body = await request.read()
        headers: dict[str, str] = {}
        for k, v in request.headers.items():
            k = k.lower()
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        try:
            parsed = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
        rec = RecordedRequest(
            method=request.method,
            path=request.path,
            raw_path=request.raw_path,
            query=dict(request.query),
            query_string=request.query_string,
            headers=headers,
            body=body,
            json=parsed,
        )
        self._classify(rec)
        self.requests.append(rec)
        return rec

    def _classify(self, rec: RecordedRequest) -> None:
        """Set rec.kind (and rec.summarizer_kind) for a request that just arrived."""

    async def _route(self, request: web.Request, rec: RecordedRequest) -> web.StreamResponse:
        raise NotImplementedError

    async def _abort(self, request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        """Cut the connection after what was written so far (a reset mid-response)."""
        request[ABORTED_KEY] = True
        await asyncio.sleep(0.05)  # let the partial body reach the client first
        if request.transport is not None:
            request.transport.abort()
        return resp
