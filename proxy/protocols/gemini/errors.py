"""Errors the proxy makes on Gemini routes, in Google's shape (design.md § Gemini API):
`{"error": {"code", "message", "status"}}`, the status named as Google's RPC codes name it, so
the google-genai SDK raises the matching ClientError / ServerError."""

from __future__ import annotations

import orjson

from proxy.errors import ProxyError

STATUS_BY_CODE = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                  405: "UNIMPLEMENTED", 409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
                  499: "CANCELLED", 500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE",
                  503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def rpc_status(code: int) -> str:
    return STATUS_BY_CODE.get(code) or ("FAILED_PRECONDITION" if code < 500 else "INTERNAL")


def error_body(code: int, message: str) -> bytes:
    return orjson.dumps({"error": {"code": code, "message": message, "status": rpc_status(code)}})


class GoogleShape:
    """proxy.errors.ErrorShape for the Gemini routes (a stream's last event is the same object)."""

    def body(self, err: ProxyError) -> bytes:
        return error_body(err.status, err.message)

    def event(self, err: ProxyError) -> bytes:
        return b"data: " + self.body(err) + b"\n\n"


GOOGLE = GoogleShape()


def invalid(message: str) -> ProxyError:
    """A 400 INVALID_ARGUMENT naming the field as the API does (`* GenerateContentRequest.contents: ...`)."""
    return ProxyError(400, message)
