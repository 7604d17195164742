"""One Exchange per request, reported to the hooks when it ends (the app's one middleware,
proxy/app.py, calls `begin`, then `answered` or `failed`, then `end`).

The x-compaction-* figures are read from the answer's headers as it is prepared, so every protocol
adapter that sets them (the external contract) is observed without code of its own; the same
moment gives the answer our request id (the upstream's own id moves to x-upstream-request-id).
"""

from __future__ import annotations

import asyncio
import time
from contextvars import Token
from typing import Any

from aiohttp import web
from aiohttp.http import SERVER_SOFTWARE

from proxy.flow import STATUSES
from proxy.ops import reasons
from proxy.exchange import CURRENT, EXCHANGE, PROTOCOLS, Exchange, new_request_id

CLIENT_CLOSED = 499  # nginx's code for a client that left before the answer


def begin(request: web.Request, hooks: Any, tracing: Any = None) -> tuple[Exchange, Token[Exchange | None]]:
    """The request's Exchange, made current and reported started (to the app's `hooks`); a
    protocol route's traced when `tracing` is on (proxy/ops/tracing.py)."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else "unmatched"
    ex = Exchange(new_request_id(), request.method, request.path, route, PROTOCOLS.get(route, "none"))
    request[EXCHANGE] = ex
    if tracing is not None and ex.protocol != "none":
        tracing.begin(request.headers, ex)
    token = CURRENT.set(ex)
    hooks.waiting += 1
    hooks.request_started(ex)
    return ex, token


def answered(ex: Exchange, resp: web.StreamResponse) -> None:
    ex.code = resp.status
    if not resp.prepared:  # a plain Response: aiohttp sends it after the middleware returns
        _note(ex, resp.headers)


def failed(ex: Exchange, e: BaseException) -> None:
    """No answer: an exception (a redirect, the client gone, a bug) leaves the handler."""
    ex.code = e.status if isinstance(e, web.HTTPException) else CLIENT_CLOSED if isinstance(e, asyncio.CancelledError) else 500


def end(hooks: Any, ex: Exchange, token: Token[Exchange | None]) -> None:
    ex.ended = time.perf_counter()
    CURRENT.reset(token)
    _answered(hooks, ex)  # (a whole answer: aiohttp sends it once the handler returns)
    if ex.stream_open:
        if ex.stream_headers is not None:
            _figures(ex, ex.stream_headers)
        hooks.stream_closed()
    if ex.span is not None:
        ex.tracing.end(ex)
    hooks.request_done(ex)


def on_prepare(request: web.Request, response: web.StreamResponse, hooks: Any) -> None:
    """On app.on_response_prepare (the app's handler gives its hooks): our id on the answer, its x-compaction-* figures;
    no `Server` header but the upstream's (aiohttp's default is its own constant object; an
    upstream's value, parsed from its answer, never is)."""
    if response.headers.get("Server") is SERVER_SOFTWARE:
        del response.headers["Server"]
    ex = request.get(EXCHANGE)
    if ex is None:
        return
    _answered(hooks, ex)
    h = response.headers
    if not isinstance(response, web.Response) and h.get("content-type", "").startswith("text/event-stream"):
        # A stream's first events follow: only the ids now; its figures are read at its end
        # (`end`), from these headers as they went out.
        if _ids(ex, h):
            ex.stream_headers = h
        ex.stream_open = True
        hooks.stream_opened()
    else:
        _note(ex, h)


def _answered(hooks: Any, ex: Exchange) -> None:
    """Its answer began: the request no longer counts as waiting (once, whichever comes first)."""
    if not ex.answered:
        ex.answered = True
        hooks.waiting -= 1


def _ids(ex: Exchange, h: Any) -> bool:
    """Our id on the answer, the upstream's moved to x-upstream-request-id; False when it was done."""
    upstream_id = h.get("x-request-id")
    if upstream_id == ex.request_id:
        return False
    if upstream_id is not None:
        ex.upstream_request_id = upstream_id
        h["x-upstream-request-id"] = upstream_id
    h["x-request-id"] = ex.request_id
    return True


def _note(ex: Exchange, h: Any) -> None:
    """Our id on the answer; its x-compaction-* figures into the exchange (idempotent)."""
    if _ids(ex, h):
        _figures(ex, h)


def _figures(ex: Exchange, h: Any) -> None:
    status = h.get("x-compaction-status")
    # Only a protocol route's answer carries figures of ours; another's x-compaction-* are the
    # upstream's own, and a label takes none of its values (they would grow the series unbounded).
    if status is not None and status in STATUSES and ex.protocol != "none":
        # (each parsed where it is read, and "0", the usual tool-results and wait figure,
        # without int(): a helper call and an int() each cost as much as the rest of this)
        ex.compaction = status
        v = h.get("x-compaction-reason")
        if v is not None:
            ex.why = reasons.word(v)
        v = h.get("x-compaction-tokens-before")
        try:
            ex.tokens_before = None if v is None else int(v)
        except ValueError:
            ex.tokens_before = None
        v = h.get("x-compaction-tokens-after")
        try:
            ex.tokens_after = None if v is None else int(v)
        except ValueError:
            ex.tokens_after = None
        v = h.get("x-compaction-tool-results")
        try:
            ex.tool_notes = 0 if v is None or v == "0" else int(v)
        except ValueError:
            ex.tool_notes = 0
        v = h.get("x-compaction-wait-ms")
        try:
            ex.wait_ms = 0.0 if v is None or v == "0" else float(int(v))
        except ValueError:
            ex.wait_ms = 0.0

