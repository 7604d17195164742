"""Gemini's answers on their way to the client (design.md § Gemini API): `streamGenerateContent?alt=sse`
sends `data: <GenerateContentResponse>` events, the last with a candidate's `finishReason`, or a
`data: {"error": ...}` event; no end marker. A stream that ends before a finishReason or an error
is incomplete: the relay ends it with an error event in Google's shape. Also the usage the bill
and the ratio learning read (`usageMetadata`), and the overflow error."""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.exchange import Usage
from proxy.sse import EventChecker
from proxy.upstream import is_context_overflow

_OVERFLOW = re.compile(r"input token count.*exceeds the maximum number of tokens allowed", re.IGNORECASE | re.DOTALL)


def is_overflow(status: int, body: bytes) -> bool:
    """Gemini's 400 INVALID_ARGUMENT "The input token count (N) exceeds the maximum number of
    tokens allowed (M)."; a Gemini-compatible server worded otherwise by the general rule."""
    if status == 400:
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            payload = None
        err = payload.get("error") if isinstance(payload, dict) else None
        if isinstance(err, dict) and _OVERFLOW.search(str(err.get("message", ""))):
            return True
    return is_context_overflow(status, body)


def gemini_usage(meta: Any) -> Usage | None:
    """usageMetadata as the bill counts it: the prompt (cached part included), the cached part,
    and the output (thinking included: it is billed as output)."""
    if not isinstance(meta, dict) or not isinstance(meta.get("promptTokenCount"), int):
        return None
    cached = meta.get("cachedContentTokenCount")
    out = (meta.get("candidatesTokenCount") or 0) + (meta.get("thoughtsTokenCount") or 0)
    return Usage(meta["promptTokenCount"], cached if isinstance(cached, int) else 0, out)


class GeminiEventChecker(EventChecker):
    """Whole `data:` events of JSON objects; the end is a finishReason or an error."""

    def simple(self, chunk: bytes) -> Any:
        n = len(chunk) - 2
        if chunk.find(b"\n") != n or not chunk.startswith(b"data: "):
            return super().simple(chunk)
        return self.event(chunk[:n])

    def event(self, event: bytes) -> str | None:
        data = b"".join(line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:"))
        if not data:
            return None  # a comment or a keep-alive
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return "an event's data is not valid JSON"
        if type(obj) is not dict:
            return "an event's data is not a JSON object"
        if self.done:
            return "an event came after the end of the answer"
        obj = self.answer(obj)
        if isinstance(obj.get("usageMetadata"), dict):
            self.usage = obj["usageMetadata"]
        if "error" in obj or any(isinstance(c, dict) and c.get("finishReason") for c in obj.get("candidates") or ()):
            self.done = True
        return None

    @staticmethod
    def answer(obj: dict[str, Any]) -> dict[str, Any]:
        """The GenerateContentResponse an event carries (Code Assist wraps it)."""
        return obj

    def ended(self) -> str | None:
        return None if self.done else "the stream ended before a finishReason"
