"""The proxy's own calls to the upstream (summaries): non-streaming chat completions.

Used by the history summarizer and the tool-result summarizer alike. Upstreams disagree on the
output-cap parameter: OpenAI wants `max_completion_tokens` (its newer models reject `max_tokens`,
and it rejects both at once), while several compatible servers (llama.cpp's among them) silently
ignore `max_completion_tokens` and honour only `max_tokens`. So OpenAI's own hosts get the former,
other servers the latter, either falls back to the other when rejected, and the choice is
remembered per model.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

_OVERFLOW_RE = re.compile(
    r"context[ _-]?length|maximum context|context window|too many tokens|prompt is too long|"
    r"exceeds? the (?:model'?s? )?(?:context|maximum)|reduce the length",
    re.IGNORECASE,
)
_CAP_PARAMS = ("max_completion_tokens", "max_tokens")
MAX_ANSWER_BYTES = 8 << 20  # of one summarizer answer


class SummarizerError(Exception):
    """A summarizer call that produced no usable text. `kind` tells the callers how to react."""

    def __init__(self, kind: str, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.kind = kind  # overflow | http | timeout | network | invalid
        self.reason = reason  # for an answer that is not a summary: acceptance.Verdict.reason


def is_context_overflow(status: int, body: bytes) -> bool:
    """True for an upstream's 'your prompt is longer than my window' rejection."""
    if status not in (400, 413, 422):
        return False
    try:
        err = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        err = None
    if isinstance(err, dict):
        if err.get("code") == "context_length_exceeded" or err.get("type") == "context_length_exceeded":
            return True
        return bool(_OVERFLOW_RE.search(str(err.get("message", ""))))
    return bool(_OVERFLOW_RE.search(body[:2000].decode("utf-8", "replace")))


def _rejects_param(body: bytes, param: str) -> bool:
    text = body[:4000].decode("utf-8", "replace")
    return param in text and re.search(r"unsupported|not supported|unrecognized|unknown|extra|invalid", text, re.I) is not None


@dataclass
class UpstreamCaller:
    session: aiohttp.ClientSession
    base_url: str
    connect_timeout_s: float

    def __post_init__(self) -> None:
        self._cap_param: dict[str, str] = {}
        host = self.base_url.split("://", 1)[-1].split("/", 1)[0].lower()
        openai_hosted = host.endswith("openai.com") or host.endswith("openai.azure.com")
        self._default_param = _CAP_PARAMS[0] if openai_hosted else _CAP_PARAMS[1]

    async def complete(
        self,
        *,
        headers: dict[str, str],
        model: str,
        messages: list[dict[str, Any]],
        max_output_tokens: int,
        timeout_s: float,
        usage: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """One non-streaming completion; returns the assistant's text or raises SummarizerError.
        `usage`, when given, receives the answer's `usage` object (for the bill); `extra` adds
        fields to the body (the conversation's own tools, for a call that rides its cache)."""
        param = self._cap_param.get(model, self._default_param)
        for attempt in range(2):
            body = {"model": model, "messages": messages, **(extra or {}), "stream": False, param: max_output_tokens}
            status, raw = await self._post(headers, body, timeout_s)
            if status == 200:
                self._cap_param[model] = param
                return _extract_text(raw, usage)
            if status == 400 and attempt == 0 and _rejects_param(raw, param):
                param = _CAP_PARAMS[1] if param == _CAP_PARAMS[0] else _CAP_PARAMS[0]
                continue
            if is_context_overflow(status, raw):
                raise SummarizerError("overflow", "the summarizer's input exceeded the upstream context window")
            raise SummarizerError("http", f"upstream answered HTTP {status}")
        raise SummarizerError("http", "upstream rejected both max_completion_tokens and max_tokens")

    async def _post(self, headers: dict[str, str], body: dict[str, Any], timeout_s: float) -> tuple[int, bytes]:
        return await post_json(self.session, self.base_url + "/chat/completions", headers, body, timeout_s,
                               self.connect_timeout_s)


async def post_json(session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: dict[str, Any],
                    timeout_s: float, connect_timeout_s: float) -> tuple[int, bytes]:
    """One of the proxy's own calls: (status, bounded body), or SummarizerError."""
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
    data = orjson.dumps(body)
    for attempt in range(2):
        try:
            async with session.post(
                url,
                data=data,
                headers={**headers, "Content-Type": "application/json", "Accept-Encoding": "identity"},
                timeout=timeout,
            ) as resp:
                return resp.status, await _read_bounded(resp.content, MAX_ANSWER_BYTES)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            # Closed or reset before any answer: most likely a pooled connection the upstream had
            # closed (servers drop idle ones; llama.cpp's drops one right after an empty stream).
            # A summary is safe to ask for again, and the retry gets a new connection.
            if attempt == 1 or isinstance(e, aiohttp.ClientConnectorError):
                raise SummarizerError("network", f"cannot reach the upstream ({e.__class__.__name__})") from None
        except asyncio.TimeoutError:
            raise SummarizerError("timeout", f"no answer within {timeout_s:g} s") from None
        except (aiohttp.ClientError, OSError) as e:
            raise SummarizerError("network", f"cannot reach the upstream ({e.__class__.__name__})") from None
    raise AssertionError("unreachable")


async def _read_bounded(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The whole body, or its first `limit` bytes: a runaway answer must not exhaust memory (and
    a truncated one fails to parse, as it should). `read(n)` alone returns whatever one network
    read brought, which cuts any answer longer than that."""
    raw = bytearray()
    while len(raw) < limit and (chunk := await content.read(limit - len(raw))):
        raw += chunk
    return bytes(raw)


def _extract_text(raw: bytes, usage: dict[str, Any] | None = None) -> str:
    try:
        data = orjson.loads(raw)
        if usage is not None and isinstance(data.get("usage"), dict):
            usage.update(data["usage"])
        message = data["choices"][0]["message"]
        content = message.get("content")
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
        raise SummarizerError("invalid", "the upstream's answer is not a chat completion") from None
    if message.get("tool_calls"):
        # The model carried the conversation on instead of summarizing it.
        raise SummarizerError("invalid", "the answer is a tool call, not a summary", reason="tool_call")
    if isinstance(content, list):  # some servers answer with content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if not isinstance(content, str):
        raise SummarizerError("invalid", "the upstream's answer has no text content")
    return content
