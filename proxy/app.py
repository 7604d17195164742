"""The aiohttp application: routes, error handling, lifecycle."""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Awaitable, Callable

from aiohttp import web

from proxy import errors, logsafe
from proxy.config import Config
from proxy.crosssite import guarded
from proxy.body import BodyPace
from proxy.forward import passthrough
from proxy.operator import admin
from proxy.exchange import PROTOCOLS
from proxy.ops import observe
from proxy.protocols.registry import PASSTHROUGHS, ROUTES
from proxy.protocols.responses.runtime import RESPONSES, ResponsesRuntime
from proxy.serve import INFLIGHT, LOOP
from proxy.state import STATE, ProxyState

log = logging.getLogger("proxy")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def serve_request(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The app's one middleware, doing what every request needs (each middleware layer costs every
    request a coroutine, and aiohttp adds a layer of its own when there is any): the handler's
    task counted in flight for the shutdown (proxy/serve.py), the request observed (ops/observe),
    and its errors answered in the protocol's shape."""
    app = request.app
    inflight, state = app[INFLIGHT], app[STATE]
    hooks = state.hooks
    task = asyncio.current_task(app[LOOP])  # (the loop given: no lookup of the running one, a getpid each)
    assert task is not None
    inflight.add(task)
    ex, token = observe.begin(request, hooks, state.tracing)
    try:
        try:
            resp = await handler(request)
        except Exception as e:
            resp = error_response(request, e)
        observe.answered(ex, resp)
        return resp
    except BaseException as e:
        observe.failed(ex, e)
        raise
    finally:
        observe.end(hooks, ex, token)
        inflight.discard(task)


async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
    observe.on_prepare(request, response, request.app[STATE].hooks)


def error_response(request: web.Request, e: Exception) -> web.StreamResponse:
    """Every error the proxy makes is in the shape of the protocol served (errors.SHAPE); none
    carries a traceback. A redirect is raised on."""
    if isinstance(e, errors.ProxyError):
        return e.response()
    if isinstance(e, web.HTTPException):
        if e.status < 400:
            raise e
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status)
        return errors.ProxyError(e.status, e.reason or "error", code=code).response()
    log.exception("unexpected error handling %s %s", request.method, request.path, exc_info=e)
    return errors.ProxyError(500, "The proxy failed to handle this request.", type="server_error", code="proxy_error").response()


async def healthz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({
        "status": "ok",
        "store": "ok" if getattr(state.store, "healthy", True) else "down",
        # Asyncio tasks alive in the process (this request's included): a count that keeps growing is a leak.
        "tasks": len(asyncio.all_tasks()),
    })


async def handle_passthrough(request: web.Request) -> web.StreamResponse:
    for claimed in PASSTHROUGHS:  # a protocol's own requests on the shared paths (Anthropic's)
        if claimed.claims(request):
            return await claimed.handler(request)
    state = request.app[STATE]
    return await passthrough(request, state.session, state.cfg.upstream, state.max_body, BodyPace.of(state.cfg.server))


def add_routes(app: web.Application, guard: Callable[[Handler], Handler]) -> None:
    """Every protocol's routes (proxy/protocols/registry.py); a labelled one names its protocol in
    metrics and log lines."""
    for route in ROUTES:
        added = app.router.add_route(route.method, route.path, guard(route.handler) if route.guarded else route.handler)
        if route.label is not None:
            PROTOCOLS[added.resource.canonical] = route.label  # (a pattern's canonical form is what a request reports)


def create_app(cfg: Config, *, state_factory: Callable[[Config], Awaitable[ProxyState]] | None = None) -> web.Application:
    logsafe.install()  # before anything can log a request: no credential or forged line in any log
    max_body = int(cfg.server.max_body_mb * 1024 * 1024)
    app = web.Application(
        middlewares=[serve_request],
        client_max_size=max_body,
        handler_args={
            "max_field_size": cfg.server.max_header_kb * 1024,
            "max_line_size": cfg.server.max_header_kb * 1024,
            # A client that goes away must cancel its handler, whatever runner serves the app: that
            # is what closes the upstream request of a stream waiting on a silent upstream.
            "handler_cancellation": True,
            # Bodies stay as the client encoded them: pass-through routes forward them with their
            # Content-Encoding, routes that read them decode them with a bound (proxy/bodycoding.py).
            # aiohttp's own decoding forwarded a decoded body under its gzip header, knew no zstd,
            # and held a whole decoded chunk before any limit applied.
            "auto_decompress": False,
        },
    )
    async def lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        app[LOOP] = asyncio.get_running_loop()
        app[STATE] = await (state_factory or ProxyState.create)(cfg)
        yield
        await app[STATE].close()

    app[INFLIGHT] = set()
    app.cleanup_ctx.append(lifecycle)
    app[RESPONSES] = ResponsesRuntime()
    app.on_response_prepare.append(on_prepare)
    app.router.add_get("/healthz", healthz)
    v1 = functools.partial(guarded, cfg=cfg)  # every route that may carry the proxy's own key
    add_routes(app, v1)
    admin.add_routes(app)
    # (after every protocol's routes: a Gemini `models/...:method` path under /v1 is Gemini's)
    app.router.add_route("*", "/v1/{tail:.*}", v1(handle_passthrough))
    return app
