"""The Responses routes' entry points: `GET /v1/responses` upgraded to a WebSocket (anything else
on it is passed through, as OpenAI's own GET routes are)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from yarl import URL

from proxy.forward import BodyPace, passthrough, upstream_request_headers
from proxy.responses.websocket import Prepare, WsTurn, handshake_headers, relay_websocket
from proxy.state import STATE


def websocket_url(base_url: str, request: web.Request) -> str:
    """The upstream's /responses as a ws:// or wss:// URL, with the client's query string."""
    url = URL(base_url + "/responses", encoded=True)
    url = url.with_scheme({"http": "ws", "https": "wss"}.get(url.scheme, url.scheme))
    query = request.rel_url.raw_query_string
    return str(url) + (f"?{query}" if query else "")


async def _as_sent(event: dict[str, Any], raw: str) -> WsTurn:
    return WsTurn(raw)


def is_websocket_upgrade(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket" and request.method == "GET"


async def handle_responses_get(request: web.Request, prepare: Prepare | None = None) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    if not is_websocket_upgrade(request):
        return await passthrough(request, state.session, cfg.upstream, state.max_body, BodyPace.of(cfg.server))
    api_key = cfg.upstream.api_key.get_secret_value() if cfg.upstream.api_key else None
    headers = handshake_headers(request.headers, upstream_request_headers(request.headers, api_key))
    return await relay_websocket(request, state.session, websocket_url(cfg.upstream.base_url, request), headers,
                                 prepare or _as_sent, state.max_body)
