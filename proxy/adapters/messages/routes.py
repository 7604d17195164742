"""The Anthropic routes (spec 12.1): /v1/messages, /v1/messages/count_tokens, and every other
Anthropic request passed through to `anthropic.base_url`, beside the OpenAI routes of the same
proxy. An Anthropic request is one on an Anthropic-only path (/v1/messages..., /v1/complete) or
one that carries `anthropic-version` (the anthropic SDKs and Claude Code send it on every call,
so /v1/models or /v1/files from them reach Anthropic, not OpenAI). Errors the proxy makes on
these routes are in Anthropic's shape."""

from __future__ import annotations

import functools
import re
from typing import Any, Awaitable, Callable

from aiohttp import web

from proxy import errors, offload
from proxy.adapters.messages.body import parse_messages_body
from proxy.adapters.messages.count import count_message, count_system
from proxy.adapters.messages.errors import ANTHROPIC
from proxy.adapters.messages.forward import forward_messages, upstream_headers
from proxy.forward import BodyPace, passthrough, read_body
from proxy.hashing import message_keys
from proxy.ops.exchange import EXCHANGE
from proxy.state import STATE
from proxy.tokens import REPLY_OVERHEAD, encoding_name_for

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ANTHROPIC_PATHS = ("/v1/messages", "/v1/complete")
BYPASS = ("1", "true", "yes")
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


def is_anthropic(request: web.Request) -> bool:
    path = request.path
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS) or "anthropic-version" in request.headers


def anthropic_route(handler: Handler) -> Handler:
    """Every error made while handling this request (the middleware's, a relay's, a stream's last
    event) takes Anthropic's shape."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        errors.SHAPE.set(ANTHROPIC)  # this request's task only
        return await handler(request)

    return wrapped


@anthropic_route
async def handle_anthropic_passthrough(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return await passthrough(request, state.session, state.cfg.anthropic, state.max_body, BodyPace.of(state.cfg.server),
                             base_path="", key_header="x-api-key")


def _headers(status: str, before: int, after: int, tool_results: int = 0, wait_ms: float = 0) -> dict[str, str]:
    return {"x-compaction-status": status, "x-compaction-tokens-before": str(before),
            "x-compaction-tokens-after": str(after), "x-compaction-tool-results": str(tool_results),
            "x-compaction-wait-ms": str(int(round(wait_ms)))}


def count_request(body: dict[str, Any], counter: Any, cfg: Any) -> int:
    """The proxy's count of a Messages request: system, messages, tool schemas (pure)."""
    settings = cfg.model_settings(body["model"])
    enc = settings.encoding or encoding_name_for(body["model"])
    keys, _ = message_keys(body["messages"])
    n = count_system(counter, body, enc) + counter.count_tools(body.get("tools"), enc) + REPLY_OVERHEAD
    n += sum(count_message(counter, m, enc, k) for m, k in zip(body["messages"], keys))
    return n if settings.token_ratio == 1.0 else int(n * settings.token_ratio)


def _read(raw: bytes, counter: Any, cfg: Any) -> tuple[dict[str, Any], int]:
    body = parse_messages_body(raw)
    return body, count_request(body, counter, cfg)


@anthropic_route
async def handle_messages(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    ex = request[EXCHANGE]
    raw = await read_body(request, state.max_body, BodyPace.of(cfg.server))
    headers = upstream_headers(request, cfg)
    if request.headers.get("x-compaction-bypass", "").strip().lower() in BYPASS:
        return await forward_messages(request, state.session, cfg, "/v1/messages", raw, headers,
                                      _STREAM_TRUE.search(raw) is not None, _headers("bypassed", 0, 0))
    body, tokens = await offload.sized(len(raw), _read, raw, state.counter, cfg)
    ex.model, ex.stream = body["model"], bool(body.get("stream"))
    return await forward_messages(request, state.session, cfg, "/v1/messages", raw, headers, ex.stream,
                                  _headers("none", tokens, tokens))


@anthropic_route
async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    raw = await read_body(request, state.max_body, BodyPace.of(cfg.server))
    body, tokens = await offload.sized(len(raw), _read, raw, state.counter, cfg)
    request[EXCHANGE].model = body["model"]
    return await forward_messages(request, state.session, cfg, "/v1/messages/count_tokens", raw,
                                  upstream_headers(request, cfg), False, _headers("none", tokens, tokens))
