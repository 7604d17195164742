"""What a protocol gives the pipeline: one `Protocol` per package, listed in the registry.

The pipeline (pipeline.py) knows no protocol by name. Everything that differs between Chat
Completions, Responses and Messages on the request path is a field here: the adapter (the body
onto the neutral model and back, the wire format), the recall dialect, how a request's headers
are read, and a few optional hooks. A field left at its default is the common behaviour.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from proxy import errors
from proxy.adapter import Adapter, Request
from proxy.byheaders import ByHeaders, Caller
from proxy.config import secret

if TYPE_CHECKING:
    from proxy.protocols.send import Answering
    from proxy.recall.session import RecallSession


@dataclass(frozen=True)
class AsSent:
    """A body the proxy reads but must not change (a history stored at the upstream): forwarded
    as it came, with its report's reason."""

    raw: bytes
    model: str
    stream: bool
    why: str


@dataclass(frozen=True)
class Protocol:
    adapter: Adapter
    callers: ByHeaders[Caller] | None  # what a request's headers say, worked out once per header list
    rounds: Callable[[str], Any]  # the stream filter of recall rounds (recall.relay.Rounds)
    # The body to run the stages on, given the state, the pipeline's Incoming and the credential's
    # scope: a Request, or AsSent. None: the adapter's parse, reusing what the conversation's
    # previous body shared (reuse.parse), or `parse` when the protocol has one.
    read: Callable[[Any, Any, Any], Awaitable["Request | AsSent"]] | None = None
    # The body parsed alone, given the state and the pipeline's Incoming, when the adapter's parse
    # is not all of it (Gemini: the model and the method are in the path). Also how a body that
    # goes as it came is counted.
    parse: Callable[[Any, Any], Awaitable[Request]] | None = None
    # How the recall tool is answered in the answer (None: the dialect and `rounds` as they are).
    answering: Callable[[Any, "RecallSession"], "Answering"] | None = None
    # The error for an empty stream from a request well under its window (None: an empty stream
    # is an error the adapter names, never an overflow to retry).
    empty_stream_small: Callable[[int, int], str] | None = None
    mends_reasoning: bool = False  # signed reasoning a changed prefix makes stale is the proxy's to mend
    learns_ratio: bool = False  # the upstream's usage teaches the token ratio (compaction.learn_token_ratio)
    log_content: Callable[[dict[str, Any]], None] | None = None  # server.log_content: what to log of a body
    # What a request says of its caller, when more than its headers do (Gemini's `?key=`): then
    # `callers` is not used.
    caller_of: Callable[[Any, Any], Caller] | None = None
    # The agent's own compaction handshake (proxy/native.py): `native(request, raw, caller,
    # count_only, forward)` answers the request here, or calls `forward(body)` (the pipeline's own
    # path, with the body to send). None: the protocol has none.
    native: Callable[[Any, bytes, Any, bool, Callable[[bytes], Awaitable[Any]]], Awaitable[Any]] | None = None

    @property
    def name(self) -> str:
        return self.adapter.protocol

    @functools.cached_property
    def log(self) -> logging.Logger:
        """The protocol's own logger (`proxy.chat` ...), looked up once."""
        return logging.getLogger(f"proxy.{self.name}")

    @property
    def dialect(self) -> Any:
        """The recall tool in this protocol's JSON (recall.answers.Dialect)."""
        return self.adapter.dialect

    def caller(self, request: Any, state: Any) -> Caller:
        if self.caller_of is not None:
            return self.caller_of(request, state)
        assert self.callers is not None
        return self.callers.of(request, (state.scope_secret, secret(self.adapter.upstream(state.cfg).api_key)))


Handler = Callable[[Any], Awaitable[Any]]


def shaped(shape: Any) -> Callable[[Handler], Handler]:
    """A route's decorator: every error made while handling its request (the middleware's, a
    relay's, a stream's last event) takes the protocol's `shape` (errors.SHAPE)."""

    def decorate(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def wrapped(request: Any) -> Any:
            errors.SHAPE.set(shape)  # this request's task only
            return await handler(request)

        return wrapped

    return decorate


@dataclass(frozen=True)
class Route:
    """One of a protocol's routes on the proxy. `label` names the protocol in metrics and log lines
    (a route the stages run on); None: a route of the protocol's that is no such request."""

    method: str
    path: str
    handler: Handler
    label: str | None = None
    guarded: bool = True  # behind the cross-site guard (a route that may carry the proxy's own key)


@dataclass(frozen=True)
class Passthrough:
    """Requests on the shared `/v1/...` paths that belong to a protocol (`claims`: by path or by
    header), relayed as they came by its `handler`."""

    claims: Callable[[Any], bool]
    handler: Handler
