"""The Anthropic routes (design.md § Messages API): /v1/messages, /v1/messages/count_tokens, and every other
Anthropic request passed through to `anthropic.base_url`, beside the OpenAI routes of the same
proxy. An Anthropic request is one on an Anthropic-only path (/v1/messages..., /v1/complete) or
one that carries `anthropic-version` (the anthropic SDKs and Claude Code send it on every call,
so /v1/models or /v1/files from them reach Anthropic, not OpenAI). Errors the proxy makes on
these routes are in Anthropic's shape."""

from __future__ import annotations

from aiohttp import web

from proxy.body import BodyPace
from proxy.forward import passthrough
from proxy.protocols import pipeline
from proxy.protocols.messages.errors import ANTHROPIC
from proxy.protocols.base import Passthrough, Route, shaped
from proxy.protocols.messages.protocol import PROTOCOL
from proxy.state import STATE

ANTHROPIC_PATHS = ("/v1/messages", "/v1/complete")


def is_anthropic(request: web.Request) -> bool:
    path = request.path
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS) or "anthropic-version" in request.headers


anthropic_route = shaped(ANTHROPIC)


@anthropic_route
async def handle_anthropic_passthrough(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return await passthrough(request, state.session, state.cfg.anthropic, state.max_body, BodyPace.of(state.cfg.server),
                             base_path="", key_header="x-api-key")


handle_messages = anthropic_route(pipeline.route_handler(PROTOCOL))


@anthropic_route
async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    """Claude Code decides its own compaction from this count: it is the count of what the proxy
    would forward now (docs/design.md § Messages API), asked of the upstream."""
    return await pipeline.handle(request, PROTOCOL, path="/v1/messages/count_tokens", count_only=True)


ROUTES = (Route("POST", "/v1/messages", handle_messages, "messages"),
          Route("POST", "/v1/messages/count_tokens", handle_count_tokens, "messages"))
PASSTHROUGH = Passthrough(is_anthropic, handle_anthropic_passthrough)
