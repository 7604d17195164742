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

NOT_JSON = "an event's data is not valid JSON"
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


def _ends(answer: dict[str, Any]) -> bool:
    """Whether an answer ends the stream: an error, or a candidate's finishReason. (A loop, not
    any() over a generator: every event asks.)"""
    if "error" in answer:
        return True
    candidates = answer.get("candidates")
    if type(candidates) is list:
        for c in candidates:
            if type(c) is dict and c.get("finishReason"):
                return True
    return False


class GeminiEventChecker(EventChecker):
    """Whole `data:` events of JSON objects; the end is a finishReason or an error."""

    def feed(self, chunk: bytes) -> tuple[bytes, str | None]:
        # Google ends each event with CRLF CRLF: a chunk of whole events, each one `data: ` line,
        # is judged in place, as the base class judges its own usual shape (a CR sends any chunk
        # to its general path, which buffers, regex-searches and copies it). A read carries
        # several events whenever the stream outpaces the relay.
        n = len(chunk) - 4
        if self._pending or not chunk.endswith(b"\r\n\r\n") or not chunk.startswith(b"data: "):
            return super().feed(chunk)
        if chunk.find(b"\r") == n and chunk.find(b"\n") == n + 1:  # one event, the usual read
            why = self._line(chunk)
            return (chunk, None) if why is None else (b"", why)
        lines = chunk.split(b"\r\n\r\n")
        if lines.pop():  # (not ended by the last split: a blank line more, read generally)
            return super().feed(chunk)
        for line in lines:
            if not line.startswith(b"data: ") or b"\r" in line or b"\n" in line:
                return super().feed(chunk)
        pos = 0
        for line in lines:
            if (why := self._line(line)) is not None:
                return chunk[:pos], why
            pos += len(line) + 4
        return chunk, None

    def _line(self, line: bytes) -> str | None:
        """One `data: ` line (its CRLF CRLF end, if given, is JSON whitespace): why it is broken, or
        None. The Gemini API's usual answer (not wrapped) is judged here, `judged` written out."""
        if type(self) is GeminiEventChecker and not self.done:
            try:
                obj = orjson.loads(line[6:])
            except orjson.JSONDecodeError:
                obj = None
            if type(obj) is dict:
                if type(meta := obj.get("usageMetadata")) is dict:
                    self.usage = meta
                if _ends(obj):
                    self.done = True
                return None
        why = self.judged(line[6:])
        if why is NOT_JSON:
            why = self.event(line.rstrip(b"\r\n"))  # (spaces alone are a keep-alive: as event() reads them)
        return why

    def simple(self, chunk: bytes) -> Any:
        n = len(chunk) - 2
        if chunk.find(b"\n") != n or not chunk.startswith(b"data: "):
            return super().simple(chunk)
        return self.event(chunk[:n])

    def event(self, event: bytes) -> str | None:
        data = b"".join(line[5:].lstrip(b" ") for line in event.splitlines() if line.startswith(b"data:"))
        if not data:
            return None  # a comment or a keep-alive
        return self.judged(data)

    def judged(self, data: bytes) -> str | None:
        """An event's data (not empty): why it is broken, or None; the usage and the end noted."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return NOT_JSON
        if type(obj) is not dict:
            return "an event's data is not a JSON object"
        if self.done:
            return "an event came after the end of the answer"
        obj = self.answer(obj)
        if isinstance(obj.get("usageMetadata"), dict):
            self.usage = obj["usageMetadata"]
        if _ends(obj):
            self.done = True
        return None

    @staticmethod
    def answer(obj: dict[str, Any]) -> dict[str, Any]:
        """The GenerateContentResponse an event carries (Code Assist wraps it)."""
        return obj

    def ended(self) -> str | None:
        return None if self.done else "the stream ended before a finishReason"
