"""The proxy's own calls to the upstream (summaries, tool-result notes), in whatever protocol the
conversation speaks: one caller for every route. The adapters make the requests and read the
answers (proxy/adapter.py: `summary_request`, `summary_retry`, `summary_text`).
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any, Mapping

import aiohttp
import orjson
from multidict import CIMultiDict

if TYPE_CHECKING:  # the adapters import this module
    from proxy.adapter import Adapter, SummaryCall

_OVERFLOW_RE = re.compile(
    r"context[ _-]?length|maximum context|context window|too many tokens|prompt is too long|"
    r"exceeds? the (?:model'?s? )?(?:context|maximum)|reduce the length",
    re.IGNORECASE,
)
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


class SummaryCaller:
    """Sends an adapter's summarizer request to that protocol's upstream (or to
    `compaction.summarizer.base_url` for a call that asks the configured summarizer: `separate`)
    and reads its answer with the same adapter."""

    def __init__(self, session: aiohttp.ClientSession, cfg: Any) -> None:
        self.session = session
        self.cfg = cfg

    async def complete(self, adapter: "Adapter", call: "SummaryCall", *, headers: dict[str, str], timeout_s: float,
                       usage: dict[str, Any] | None = None, separate: bool = False) -> str:
        """One non-streaming call: the answer's text, or SummarizerError. `usage`, when given,
        receives the answer's usage (for the bill)."""
        upstream = adapter.upstream(self.cfg)
        base_url = (self.cfg.compaction.summarizer.base_url if separate else None) or upstream.base_url
        req = adapter.summary_request(call, base_url)
        for attempt in range(2):
            send = CIMultiDict(req.headers)
            send.update(headers)  # the client's (anthropic-version too) win over the protocol's defaults
            status, raw = await post_json(self.session, base_url + req.path, send, req.body, timeout_s,
                                          upstream.connect_timeout_s)
            if status == 200:
                return adapter.summary_text(status, raw, usage)
            again = adapter.summary_retry(req, status, raw) if attempt == 0 else None
            if again is None:
                raise adapter.summary_failure(status, raw)
            req = again
        raise AssertionError("unreachable")


async def post_json(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str], body: bytes,
                    timeout_s: float, connect_timeout_s: float) -> tuple[int, bytes]:
    """One of the proxy's own calls: (status, bounded body), or SummarizerError."""
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
    for attempt in range(2):
        try:
            async with session.post(
                url,
                data=body,
                headers={**dict(headers.items()), "Content-Type": "application/json", "Accept-Encoding": "identity"},
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
