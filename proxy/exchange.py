"""What one HTTP request did, filled in as it goes and reported once at its end. Low in the layers:
every stage, listener and route writes to it, and it imports nothing of the proxy."""

from __future__ import annotations

import itertools
import os
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# Routes served by a protocol adapter -> the protocol's label in metrics and logs. Adapters add
# theirs when their route is registered (app.py); every other route is labelled "none".
PROTOCOLS: dict[str, str] = {}

_PREFIX = os.urandom(4).hex()
_SEQ = itertools.count(1)
# An id is the prefix and the request's number in (at least) 8 hex digits: all but the last two
# are the same for 256 requests in a row, made once for them (a padded hex format costs ~3k
# instructions, as much as the rest of the Exchange).
_LOW = [f"{n:02x}" for n in range(256)]
_block, _head = -1, ""


def _new_process() -> None:
    global _PREFIX, _SEQ, _block
    _PREFIX, _SEQ, _block = os.urandom(4).hex(), itertools.count(1), -1


os.register_at_fork(after_in_child=_new_process)  # a forked worker (server.workers) gets ids of its own


def new_request_id() -> str:
    """Unique per process start and request, cheap (no randomness per request):
    f"{_PREFIX}{n:08x}" for the process's n-th request."""
    global _block, _head
    n = next(_SEQ)
    if n >> 8 != _block:
        _block = n >> 8
        _head = f"{_PREFIX}{_block:06x}"
    return _head + _LOW[n & 255]


@dataclass(slots=True)
class Usage:
    """The upstream's `usage` of one answer, the fields the bill needs."""

    prompt: int
    cached: int
    completion: int

    @classmethod
    def from_openai(cls, usage: Any) -> "Usage | None":
        if not isinstance(usage, dict):
            return None
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(prompt, int) or not isinstance(completion, int):
            return None
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(prompt, cached if isinstance(cached, int) and 0 <= cached <= prompt else 0, completion)


@dataclass(slots=True)
class Prefix:
    """The client's messages as the bill sees them: in-process keys and token counts, in order."""

    keys: list[int]
    tokens: list[int]
    tools_tokens: int


@dataclass(slots=True)
class Exchange:
    request_id: str
    method: str
    path: str
    route: str
    protocol: str
    started: float = field(default_factory=time.perf_counter)
    wall: float = field(default_factory=time.time)  # when it started, wall clock (records' `created`)
    # when it ended (perf_counter; 0.0 until then): its bookkeeping runs a moment later (ops/hooks.py
    # Fanout), so durations are measured to here, not to when they are written down
    ended: float = 0.0
    answered: bool = False  # its answer began (headers out, or the handler done): no longer waiting
    code: int = 0
    # Filled by a protocol adapter; the x-compaction-* figures are read from the response headers.
    model: str = ""
    compaction: str = ""
    why: str = ""  # x-compaction-reason: why the history was not (or only partly) compacted
    observed: bool = False  # observe mode: forwarded as sent, the stages run beside it (proxy/watch.py)
    span: Any = None  # its OpenTelemetry span when traced (proxy/ops/tracing.py), with the Tracing that made it
    tracing: Any = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    tool_notes: int = 0
    wait_ms: float = 0.0
    conversation: str = ""  # digest naming the conversation (scope + its first message)
    upstream_ttfb_s: float | None = None  # request sent -> first byte of the answer
    upstream_s: float | None = None  # request sent -> answer relayed
    upstream_request_id: str = ""
    usage: Usage | None = None
    summarizer_calls: int = 0  # made on this request's path
    stream: bool = False  # the client asked for a stream
    stream_open: bool = False  # an event stream is being relayed (counted in the streams gauge)
    stream_headers: Any = None  # that stream's headers: its x-compaction-* figures, read at its end
    # Messages before and after the shrinking stages, for the bill's direct-cost estimate.
    prefix: Prefix | None = None

    def seconds(self) -> float:
        """How long it took: to its end, or to now while it runs (its bookkeeping reads this a
        moment after the end)."""
        return (self.ended or time.perf_counter()) - self.started


# The request's Exchange, under this key of the aiohttp request (a typed key where aiohttp has them).
EXCHANGE: Any = web.RequestKey("exchange", Exchange) if hasattr(web, "RequestKey") else "compaction_proxy.exchange"


# The request being served (unset in background work): summarizer calls attribute themselves here.
CURRENT: ContextVar[Exchange | None] = ContextVar("compaction_proxy_exchange", default=None)
# The summarizer calls made for the summary being made (on a request or ahead of it, by a
# preparation worker): its record keeps the count, so the event that applies it can tell.
RECORD_CALLS: ContextVar[list[int] | None] = ContextVar("compaction_proxy_record_calls", default=None)
# The conversation a summarizer call works for (set on request paths and by preparation workers).
CONVERSATION: ContextVar[str] = ContextVar("compaction_proxy_conversation", default="")
