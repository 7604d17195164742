"""Errors the proxy itself makes, in the shape of the protocol being served: OpenAI's
{"error": {message, type, param, code}} unless a protocol route set its own (`SHAPE`)."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

import orjson
from aiohttp import web

if TYPE_CHECKING:
    from proxy import jsonbody


class ErrorShape(Protocol):
    """How a protocol writes an error: as a response body, and as the event that ends a stream."""

    def body(self, err: "ProxyError") -> bytes: ...

    def event(self, err: "ProxyError") -> bytes: ...


class OpenAIShape:
    def body(self, err: "ProxyError") -> bytes:
        return error_body(err.message, type=err.type, param=err.param, code=err.code)

    def event(self, err: "ProxyError") -> bytes:
        return b"data: " + self.body(err) + b"\n\n"


# The shape of the request being handled: a protocol's route sets it for its own task, so every
# error made on the way (the middleware's, a relay's, a stream's last event) speaks its protocol.
SHAPE: ContextVar[ErrorShape] = ContextVar("error_shape", default=OpenAIShape())


class ProxyError(Exception):
    """An error answered to the client with an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> bytes:
        return SHAPE.get().body(self)

    def event(self) -> bytes:
        """The event that ends a stream with this error."""
        return SHAPE.get().event(self)

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(
            status=self.status, body=self.body(), content_type="application/json", headers=headers
        )


class Uncompactable(ProxyError):
    """A body the proxy cannot compact that the upstream may still accept (no `model`: a Responses
    `prompt` may carry it, a local server picks its own). A route forwards it as it came; where
    nothing is forwarded (inspect) it is the 400 it says."""


def missing_model() -> Uncompactable:
    return Uncompactable(400, "Missing required parameter: 'model'.", param="model", code="missing_required_parameter")


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ProxyError:
    return ProxyError(400, message, param=param, code=code)


def unreadable(e: jsonbody.Unreadable) -> ProxyError:
    """The 400 for a body that is not a readable JSON value (OpenAI's wording and shape)."""
    return bad_request(f"Request body cannot be read: {e.reason}.", code=e.code)


def body_too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"Request body exceeds the {limit} byte limit.", code="request_too_large")


def upstream_unreachable(detail: str) -> ProxyError:
    return ProxyError(502, f"Upstream unreachable: {detail}", type="upstream_error", code="upstream_unreachable")


def upstream_timeout(detail: str) -> ProxyError:
    return ProxyError(504, f"Upstream timed out: {detail}", type="upstream_error", code="upstream_timeout")


def upstream_bad_response(detail: str) -> ProxyError:
    return ProxyError(502, f"Upstream sent an invalid response: {detail}", type="upstream_error", code="bad_upstream_response")
