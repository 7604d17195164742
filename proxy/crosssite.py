"""No web page borrows the proxy's key: the guard on the /v1 routes when the proxy holds one.

With `upstream.api_key` (or `anthropic.api_key`) set, the proxy puts its key on a request that
carries no credential of its own. Any page the operator's browser opens can reach a loopback port,
so when the proxy holds a key, a request without a credential is refused when:

- it carries an `Origin` not in `server.allowed_origins` (browsers send one on every WebSocket
  handshake, CORS request and preflight, and on POSTs; CLI agents and the SDKs send none): 403;
- it is a POST to a compaction route whose `Content-Type` is one a browser sends cross-site
  without a preflight (`text/plain`, `application/x-www-form-urlencoded`, `multipart/form-data`:
  a form, or a fetch from a browser old enough to send no Origin with it): 415. The body of those
  routes is JSON; any other type (or none, as some HTTP libraries send) needs a preflight from a
  browser, which carries an Origin.

A request carrying its own credential, or any request to a proxy that holds no key, is forwarded
as before: a page cannot put a credential on a request without a preflight, so it borrows nothing.
"""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable

from aiohttp import web

from proxy import errors
from proxy.protocols.messages.errors import ANTHROPIC
from proxy.protocols.messages.route import is_anthropic
from proxy.config import Config
from proxy.credentials import sent_credentials

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

COMPACTION_PATHS = frozenset({"/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens",
                              "/v1/responses", "/v1/responses/compact"})


def origin_key(origin: str) -> str:
    """An origin as compared: lower case, without a trailing slash."""
    return origin.strip().rstrip("/").lower()


# The Content-Types a browser may send cross-site without asking first (the Fetch standard's
# CORS-safelisted request header values), compared by media type, whatever their parameters.
SIMPLE_TYPES = frozenset({"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"})


def is_simple(content_type: str) -> bool:
    return content_type.split(";", 1)[0].strip().lower() in SIMPLE_TYPES


def refusal(method: str, path: str, headers: Any, origins: frozenset[str]) -> errors.ProxyError | None:
    """Why a request that the proxy would send with its own key is refused, or None (pure)."""
    if sent_credentials(headers):
        return None
    origin = headers.get("origin")
    if origin is not None and origin_key(origin) not in origins:
        return errors.ProxyError(
            403, "This proxy adds its own API key to requests without one, so it refuses a browser's request from an "
            "origin not in server.allowed_origins. Send your own credential, or configure the origin.",
            type="permission_error", code="origin_not_allowed")
    content_type = headers.get("content-type")
    if method == "POST" and path in COMPACTION_PATHS and content_type is not None and is_simple(content_type):
        return errors.ProxyError(
            415, "This proxy adds its own API key to requests without one, so their body must be sent as "
            "Content-Type: application/json.", param="Content-Type", code="unsupported_content_type")
    return None


def guarded(handler: Handler, cfg: Config) -> Handler:
    """`handler` behind the guard when the proxy holds a key for its protocol; else itself (a proxy
    that holds none pays nothing for it)."""
    openai_key, anthropic_key = cfg.upstream.api_key is not None, cfg.anthropic.api_key is not None
    if not (openai_key or anthropic_key):
        return handler
    origins = frozenset(origin_key(o) for o in cfg.server.allowed_origins)

    @functools.wraps(handler)
    async def guard(request: web.Request) -> web.StreamResponse:
        anthropic = is_anthropic(request)
        if anthropic_key if anthropic else openai_key:
            refused = refusal(request.method, request.path, request.headers, origins)
            if refused is not None:
                if anthropic:
                    errors.SHAPE.set(ANTHROPIC)
                raise refused
        return await handler(request)

    return guard
