"""The aiohttp application: routes, error handling, lifecycle."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from aiohttp import web

from proxy import errors, logsafe
from proxy.adapters.messages import routes as messages
from proxy.chat import handle_chat
from proxy.config import Config
from proxy.forward import BodyPace, passthrough
from proxy.ops import admin
from proxy.ops.exchange import PROTOCOLS
from proxy.ops.observe import observe, on_prepare
from proxy.responses.handlers import handle_compact, handle_responses_get
from proxy.responses.route import handle_responses
from proxy.responses.runtime import RESPONSES, ResponsesRuntime
from proxy.serve import INFLIGHT, track_inflight
from proxy.state import STATE, ProxyState

log = logging.getLogger("proxy")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error the proxy makes is in the shape of the protocol served (errors.SHAPE); none carries a traceback."""
    try:
        return await handler(request)
    except errors.ProxyError as e:
        return e.response()
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status)
        return errors.ProxyError(e.status, e.reason or "error", code=code).response()
    except Exception:
        log.exception("unexpected error handling %s %s", request.method, request.path)
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
    if messages.is_anthropic(request):
        return await messages.handle_anthropic_passthrough(request)
    state = request.app[STATE]
    return await passthrough(request, state.session, state.cfg.upstream, state.max_body, BodyPace.of(state.cfg.server))


def add_protocol_route(app: web.Application, path: str, handler: Handler, protocol: str) -> None:
    """A route served by a protocol adapter; `protocol` labels its metrics and log lines."""
    PROTOCOLS[path] = protocol
    app.router.add_post(path, handler)


def create_app(cfg: Config, *, state_factory: Callable[[Config], Awaitable[ProxyState]] | None = None) -> web.Application:
    logsafe.install()  # before anything can log a request: no credential or forged line in any log
    max_body = int(cfg.server.max_body_mb * 1024 * 1024)
    app = web.Application(
        middlewares=[track_inflight, observe, error_middleware],
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
        app[STATE] = await (state_factory or ProxyState.create)(cfg)
        yield
        await app[STATE].close()

    app[INFLIGHT] = set()
    app.cleanup_ctx.append(lifecycle)
    app[RESPONSES] = ResponsesRuntime()
    app.on_response_prepare.append(on_prepare)
    app.router.add_get("/healthz", healthz)
    add_protocol_route(app, "/v1/chat/completions", handle_chat, "chat_completions")
    add_protocol_route(app, "/v1/messages", messages.handle_messages, "messages")
    add_protocol_route(app, "/v1/messages/count_tokens", messages.handle_count_tokens, "messages")
    add_protocol_route(app, "/v1/responses", handle_responses, "responses")
    app.router.add_get("/v1/responses", handle_responses_get)  # WebSocket mode (spec 11.3)
    app.router.add_post("/v1/responses/compact", handle_compact)
    admin.add_routes(app)
    app.router.add_route("*", "/v1/{tail:.*}", handle_passthrough)
    return app
