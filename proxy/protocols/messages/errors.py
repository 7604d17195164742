"""Errors the proxy makes on Anthropic routes, in Anthropic's shape (design.md § Messages API):
`{"type": "error", "error": {"type", "message"}}`, the type named by the status as the API names
it (docs.claude.com/en/api/errors), so the anthropic SDKs raise the matching exception class."""

from __future__ import annotations

import orjson

from proxy.errors import ProxyError

TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                  404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                  502: "api_error", 503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def error_type(status: int) -> str:
    """The API uses invalid_request_error for the 4xx it does not list, api_error for 5xx."""
    return TYPE_BY_STATUS.get(status) or ("invalid_request_error" if status < 500 else "api_error")


def error_body(status: int, message: str) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": error_type(status), "message": message}})


class AnthropicShape:
    """proxy.errors.ErrorShape for the Messages routes."""

    def body(self, err: ProxyError) -> bytes:
        return error_body(err.status, err.message)

    def event(self, err: ProxyError) -> bytes:
        return b"event: error\ndata: " + self.body(err) + b"\n\n"


ANTHROPIC = AnthropicShape()


def invalid(message: str) -> ProxyError:
    """A 400 for the client's request; its message names the field as the API's do."""
    return ProxyError(400, message)
