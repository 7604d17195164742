"""Pieces every fake upstream shares: scripted errors, the request recording, token counting and
small text helpers. The fakes themselves live beside this module (chat: proxy/fakes/chat/server.py,
Responses: proxy/fakes/responses, Messages: proxy/fakes/messages)."""

from __future__ import annotations

import functools
import inspect
import logging
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

from proxy.encodings import get_encoding

log = logging.getLogger(__name__)

_ALNUM = string.ascii_letters + string.digits


# --------------------------------------------------------------------------------------------
# Scripted errors


@dataclass
class FakeError:
    """An error answer a scripted `reply`/`summarizer` returns: status, JSON body, extra headers.

    `body` may also be str/bytes to send a non-JSON error body verbatim.
    """

    status: int
    body: dict[str, Any] | str | bytes
    headers: dict[str, str] | None = None

    @classmethod
    def openai(
        cls,
        status: int,
        message: str,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> "FakeError":
        """An error in OpenAI's shape; `type` defaults to what OpenAI uses for that status."""
        if type is None:
            type = openai_error_type(status)
        return cls(status, {"error": {"message": message, "type": type, "param": param, "code": code}}, headers)

    @classmethod
    def anthropic(cls, status: int, message: str, type: str | None = None,
                  headers: dict[str, str] | None = None) -> "FakeError":
        """An error in Anthropic's shape: {"type": "error", "error": {"type", "message"}, "request_id"}."""
        if type is None:
            type = anthropic_error_type(status)
        body = {"type": "error", "error": {"type": type, "message": message}, "request_id": "req_" + rand(24)}
        return cls(status, body, headers)


def openai_error_type(status: int) -> str:
    if status == 429:
        return "requests"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


# https://docs.anthropic.com/en/api/errors: one error type per status.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 504: "timeout_error", 529: "overloaded_error"}


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


class Invalid(Exception):
    """A validation failure; each fake turns it into its protocol's 400."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


def missing(param: str) -> Invalid:
    """OpenAI's failure for a required parameter that is absent (or null)."""
    return Invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


def bad_type(param: str, expected: str, got: Any) -> Invalid:
    """OpenAI's failure for a parameter of the wrong JSON type (`expected`: "a string", ...)."""
    return Invalid(f"Invalid type for '{param}': expected {expected}, but got {type_phrase(got)} instead.",
                   param, "invalid_type")


# --------------------------------------------------------------------------------------------
# Recording


@dataclass
class RecordedRequest:
    """One request as the fake received it (filled in further while it is answered)."""

    method: str
    path: str  # decoded path, without the query string
    raw_path: str  # path and query exactly as sent
    query: dict[str, str]  # parsed query (last value wins); raw form in `query_string`
    query_string: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    json: Any  # parsed body, or None when empty / not JSON
    kind: str = "other"  # what the fake took it for: "chat" | "responses" | "messages" | "summarizer" | ...
    summarizer_kind: str | None = None  # "history" | "tool" for summarizer requests
    status: int | None = None  # HTTP status sent (None: nothing sent yet)
    prompt_tokens: int | None = None  # the fake's count, for model calls that got that far
    cached_tokens: int | None = None  # simulated prompt-cache hit (see each fake's docstring)
    completion_tokens: int | None = None  # usage of the answer (output tokens)
    faulted: bool = False  # a fault flag applied to this request
    disconnected: bool = False  # the client went away before the answer was complete
    transport: str = "http"  # "http" | "websocket" (one record per `response.create` message)
    wrapper: Any = None  # a wrapped body as sent (Code Assist's), `json` then being the request it wraps


# --------------------------------------------------------------------------------------------
# Token counting (tiktoken; cl100k_base by default)


@functools.lru_cache(maxsize=None)
def _encoding(name: str) -> Any:
    try:
        return get_encoding(name)
    except Exception as exc:  # a broken install: fall back to bytes/4 rather than crash
        log.warning("fake upstream: tiktoken encoding %s unavailable (%s); using bytes/4", name, exc)
        return None


@functools.lru_cache(maxsize=4096)  # histories are resent every turn; don't re-encode them
def count_text_tokens(text: str, encoding: str = "cl100k_base") -> int:
    enc = _encoding(encoding)
    if enc is None:
        return (len(text.encode("utf-8")) + 3) // 4
    # disallowed_special=(): conversations may contain "<|im_start|>" etc. as plain text.
    return len(enc.encode(text, disallowed_special=()))


def truncate_to_tokens(text: str, limit: int, encoding: str) -> str:
    enc = _encoding(encoding)
    if enc is None:
        return text[: limit * 4]
    return enc.decode(enc.encode(text, disallowed_special=())[:limit])


# --------------------------------------------------------------------------------------------
# Small helpers


def type_phrase(v: Any) -> str:
    """How OpenAI's validation names a JSON value's type ("a string", "an array" ...)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int):
        return "an integer"
    if isinstance(v, float):
        return "a decimal"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


def rand(n: int) -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(n))


def collapse_ws(s: str) -> str:
    return " ".join(s.split())


def split_text(text: str, max_piece: int = 4096) -> list[str]:
    """Split a reply into several stream deltas (words, at most ~48 pieces, none over max_piece)."""
    words = re.findall(r"\s*\S+|\s+$", text)
    if not words:
        return []
    per = max(1, -(-len(words) // 48))
    pieces = ["".join(words[i : i + per]) for i in range(0, len(words), per)]
    out: list[str] = []
    for p in pieces:
        out.extend(p[i : i + max_piece] for i in range(0, len(p), max_piece))
    return out


def split_args(args: str) -> list[str]:
    """A tool call's arguments in three stream fragments (fewer when shorter)."""
    if len(args) < 3:
        return [args] if args else []
    k = -(-len(args) // 3)
    return [args[i : i + k] for i in range(0, len(args), k)]


def utf8_or_none(b: bytes) -> str | None:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return None


async def resolve(spec: Any, body: Any) -> Any:
    """A scripted value, or the result of calling it (awaited when it is async)."""
    if callable(spec) and not isinstance(spec, FakeError):
        spec = spec(body)
        if inspect.isawaitable(spec):
            spec = await spec
    return spec
