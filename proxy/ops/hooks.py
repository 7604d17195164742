"""The named events the core reports, and the fan-out to the listeners (metrics, logs, journal, bill).

The core calls `state.hooks.<event>(...)` at a handful of places; it never touches a counter or a
logger for the operator's view itself. A listener overrides the events it wants; `Fanout` calls
only the overridden ones, so an event nobody listens to costs one method call.

A finished request's bookkeeping (`request_done`: its metrics, bill and access line) is the one
event `Fanout` does not pass on at once: it runs a moment later, in a batch, once no request is
waiting for its answer to begin (at most MAX_DEFER_S later). Agents' requests come in bursts (a
stream ends, the next request follows at once), and the bookkeeping of the streams that just
ended stood between those requests and their upstream calls. Whoever reads what it adds up (the
/metrics and admin routes, the dashboard, the shutdown) calls `settle` first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from proxy.exchange import CONVERSATION, CURRENT, RECORD_CALLS, Exchange, Usage
from proxy.upstream import SummarizerError

log = logging.getLogger("proxy.hooks")

EVENTS = ("request_started", "request_done", "stream_opened", "stream_closed", "summarizer_done", "compaction",
          "prepared", "recall", "recall_rounds", "recall_after_headers", "stale_reasoning", "observed", "prefix_break")


@dataclass(slots=True)
class SummarizerCall:
    kind: str  # history | tool_result | prepared
    model: str
    conversation: str
    seconds: float = 0.0
    # Why it failed: a rejected answer's reason (acceptance.Verdict.reason), else SummarizerError.kind
    # (overflow, http, timeout, network, invalid), or "cancelled".
    error: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)  # the answer's `usage`, filled by SummaryCaller (chat names)

    @property
    def tokens(self) -> Usage | None:
        return Usage.from_openai(self.usage)


@dataclass(slots=True)
class CompactionEvent:
    """One request whose history the proxy compacted (or failed to): a journal entry."""

    time: float
    request_id: str
    scope: str  # the credential scope's digest (an HMAC, never the credential)
    conversation: str
    model: str
    tier: str  # the request's x-compaction-status: summarized, masked, degraded, failed-open, ...
    covered: int  # non-system messages the summary stands for
    messages: int  # messages the client sent
    tokens_before: int
    tokens_after: int
    calls: int  # summarizer calls made on the request's path
    wait_ms: float
    summary: str = ""
    cut: list[str] = field(default_factory=list)  # what the covered messages were, one short line each
    reason: str = ""  # what fell short, in words (a summarizer's error, ...)
    why: str = ""  # the reason's word (proxy/ops/reasons.py), as on the answer's x-compaction-reason
    observed: bool = False  # observe mode: what would have been done; the request went as sent


class Hooks:
    """Every event, doing nothing. Listeners subclass and override."""

    # Requests begun whose answer has not (proxy/ops/observe.py keeps the count): the deferred
    # bookkeeping waits for them.
    waiting = 0

    def settle(self) -> None:
        """The bookkeeping of the requests that ended so far, done now (Fanout defers it)."""

    def request_started(self, ex: Exchange) -> None: ...
    def request_done(self, ex: Exchange) -> None: ...
    def stream_opened(self) -> None: ...
    def stream_closed(self) -> None: ...
    def summarizer_done(self, call: SummarizerCall) -> None: ...
    def compaction(self, event: CompactionEvent) -> None: ...
    def prepared(self, outcome: str) -> None:
        """A summary prepared ahead: `made`, `used` (carried by the request that crossed the
        threshold) or `wasted` (that request had to call the summarizer anyway)."""

    def recall(self, outcome: str, protocol: str) -> None:
        """One recall call answered on a `protocol` route (chat, responses, messages): `hit`, `miss`,
        `error` (bad arguments), `unavailable` (the store is down) or `exhausted` (past
        recall.max_rounds)."""

    def recall_rounds(self, rounds: int, protocol: str) -> None:
        """A client request whose answer took `rounds` extra upstream rounds for recall (> 0)."""

    def recall_after_headers(self, calls: int, protocol: str) -> None:
        """A stream's recall calls made after its headers went out (its x-compaction-recalls
        header did not count them; an SSE comment at its end carries the final count)."""

    def stale_reasoning(self, protocol: str) -> None:
        """The upstream refused a compacted request for reasoning the compaction made stale (a
        model that binds thinking to its prefix, not known to the proxy as one); it was sent again
        asking the upstream to leave the stale reasoning out."""

    def observed(self, ex: Exchange, report: Any) -> None:
        """Observe mode: what the stages would have forwarded for `ex`'s request, which went as
        sent (`report`: the flow's report, status and tokens as they would have been)."""

    def prefix_break(self, ex: Exchange, at: int, tokens: int) -> None:
        """`ex`'s forwarded request (`tokens`: the client's, counted) differs from its
        conversation's previous forwarded request from message `at` (0-based) on, though no
        compaction happened in between: the provider's prompt cache cannot serve it from there on
        (proxy/ops/prefix_alarm.py)."""

    def summarizer_call(self, kind: str, model: str) -> "_CallTimer":
        """`async with hooks.summarizer_call(kind, model) as call:` around one summarizer call and
        the checks of its answer; a SummarizerError leaving the block is counted by its kind."""
        ex = CURRENT.get()
        return _CallTimer(self, SummarizerCall(kind, model, ex.conversation if ex is not None else CONVERSATION.get()))


DEFER_S = 0.002  # a finished request's bookkeeping waits at least this long (a burst's requests arrive)
MAX_DEFER_S = 0.05  # and at most this long, however busy the proxy is
MAX_DEFERRED = 1024  # ended requests held at most: past that their bookkeeping is done at once


class Fanout(Hooks):
    def __init__(self, listeners: list[Hooks]) -> None:
        self.listeners = listeners
        self.waiting = 0
        for name in EVENTS:
            fns = [getattr(h, name) for h in listeners if getattr(type(h), name) is not getattr(Hooks, name)]
            if not fns:
                continue
            setattr(self, name, fns[0] if len(fns) == 1 else _each(fns))
        self._ended: list[Exchange] = []  # requests whose bookkeeping is still to do, in order
        self._first = 0.0  # when the oldest of them was queued (the loop's clock)
        self._timer: asyncio.TimerHandle | None = None
        # The listeners of request_done, called one by one in `settle` (not through _each: a call
        # a request less). Empty: nobody listens, nothing is queued.
        self._dones = [getattr(h, "request_done") for h in listeners
                       if type(h).request_done is not Hooks.request_done]
        if self._dones:
            self.request_done = self._defer  # type: ignore[method-assign]
        if "compaction" in self.__dict__:
            # A compaction event carries its conversation's bill so far (the journal): the
            # conversation's previous request, ended a moment ago, is on it.
            self.compaction = _settled_first(self, self.__dict__["compaction"])  # type: ignore[method-assign]

    def find(self, kind: type) -> Any:
        return next((h for h in self.listeners if isinstance(h, kind)), None)

    def settle(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        ended, self._ended = self._ended, []
        dones = self._dones
        for ex in ended:
            try:
                for done in dones:
                    done(ex)
            except Exception:  # (one request's bookkeeping failing must not lose the others')
                log.exception("the bookkeeping of request %s failed", ex.request_id)

    def _defer(self, ex: Exchange) -> None:
        ended = self._ended
        ended.append(ex)
        if len(ended) == 1:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # (no loop: nothing to give way to)
                self.settle()
                return
            self._first = loop.time()
            self._timer = loop.call_later(DEFER_S, self._due, loop)
        elif len(ended) >= MAX_DEFERRED:
            self.settle()

    def _due(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self.waiting > 0 and loop.time() - self._first < MAX_DEFER_S:
            self._timer = loop.call_later(DEFER_S, self._due, loop)  # a request still waits for its answer
            return
        self.settle()


def _settled_first(hooks: Fanout, fn: Any) -> Any:
    def call(*args: Any) -> None:
        hooks.settle()
        fn(*args)

    return call


def _each(fns: list[Any]) -> Any:
    def call(*args: Any) -> None:
        for fn in fns:
            fn(*args)

    return call


class _CallTimer:
    __slots__ = ("hooks", "call", "t0", "span")

    def __init__(self, hooks: Hooks, call: SummarizerCall) -> None:
        self.hooks = hooks
        self.call = call
        self.t0 = 0.0
        self.span: Any = None  # a child span of the traced request's (proxy/ops/tracing.py)

    async def __aenter__(self) -> SummarizerCall:
        ex = CURRENT.get()
        if ex is not None:
            ex.summarizer_calls += 1
            if ex.span is not None:
                self.span = ex.tracing.start_child(ex, f"summarize {self.call.kind}", {
                    "gen_ai.operation.name": "chat", "gen_ai.request.model": self.call.model,
                    "compaction.summarizer_kind": self.call.kind})
        made = RECORD_CALLS.get()
        if made is not None:
            made[0] += 1
        self.t0 = time.perf_counter()
        return self.call

    async def __aexit__(self, typ: Any, exc: Any, tb: Any) -> None:
        self.call.seconds = time.perf_counter() - self.t0
        if isinstance(exc, SummarizerError):
            self.call.error = getattr(exc, "reason", "") or exc.kind
        elif exc is not None:
            self.call.error = "cancelled" if isinstance(exc, BaseException) and not isinstance(exc, Exception) else "error"
        if self.span is not None:
            _end_call_span(self.span, self.call)
        self.hooks.summarizer_done(self.call)


def _end_call_span(span: Any, call: SummarizerCall) -> None:
    """A summarizer call's span: its usage and error, then its end."""
    tokens = call.tokens
    if tokens is not None:
        span.set_attributes({"gen_ai.usage.input_tokens": tokens.prompt, "gen_ai.usage.output_tokens": tokens.completion})
    if call.error is not None:
        span.set_attribute("error.type", call.error)
    span.end()
