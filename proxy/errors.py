"""Errors the proxy itself makes, in OpenAI's shape: {"error": {message, type, param, code}}."""

from __future__ import annotations

import orjson
from aiohttp import web


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
        return error_body(self.message, type=self.type, param=self.param, code=self.code)

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(
            status=self.status, body=self.body(), content_type="application/json", headers=headers
        )


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ProxyError:
    return ProxyError(400, message, param=param, code=code)


def body_too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"Request body exceeds the {limit} byte limit.", code="request_too_large")


def upstream_unreachable(detail: str) -> ProxyError:
    return ProxyError(502, f"Upstream unreachable: {detail}", type="upstream_error", code="upstream_unreachable")


def upstream_timeout(detail: str) -> ProxyError:
    return ProxyError(504, f"Upstream timed out: {detail}", type="upstream_error", code="upstream_timeout")


def upstream_bad_response(detail: str) -> ProxyError:
    return ProxyError(502, f"Upstream sent an invalid response: {detail}", type="upstream_error", code="bad_upstream_response")
