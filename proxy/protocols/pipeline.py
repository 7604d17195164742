"""The request path, once for every protocol (docs/design.md § One request, one flow).

A route is one call: `handle(request, protocol)`. Its layers, each one concern, from the top:

    handle          the body read and the caller known; a bypass or a body the proxy cannot
                    compact goes as it came (`as_sent`)
    prepare         the body parsed (`read`), who it is for (`identify`), the flow built; an
                    anonymous or observed request goes as it came, the rest through `run`
    run             the stages, the recall tool declared when they replaced anything, the body
                    rendered; a bug in a stage forwards the client's bytes (`fallback`)
    forward         the prepared body sent (proxy/protocols/send.py: overflow retry, mend,
                    recall rounds, one upstream call) and the answer relayed

A Responses WebSocket turn calls `prepare` and sends on its socket; `inspect`'s dry run calls
`prepare` with a store and a summarizer that write and send nothing. What differs by protocol
is a field of its `Protocol` (base.py): the pipeline names none.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from functools import partial
from typing import Any, Awaitable, Callable, NamedTuple

from aiohttp import web

from proxy import errors, offload, reuse
from proxy.adapter import Request
from proxy.body import BodyPace, read_body
from proxy.byheaders import Caller
from proxy.compaction.budget import could_overflow
from proxy.compaction.stage import journal_fault
from proxy.flow import Flow, Identity, Report, run_request
from proxy.hashing import conversation_digest
from proxy.ops import reasons
from proxy.exchange import EXCHANGE, Exchange, Prefix
from proxy.protocols.base import AsSent, Protocol
from proxy.protocols.send import Answering, Retry, Upstream, overflow_retry, send
from proxy.recall import answers as recall_answers
from proxy.recall.session import RecallSession
from proxy.state import STATE, ProxyState
from proxy.watch import observed

log = logging.getLogger("proxy.pipeline")

_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


@dataclass(slots=True)
class Prepared:
    """One request after the stages: what to forward and its x-compaction-* headers, and what the
    send needs to retry it, answer recall in it and judge its stream."""

    data: bytes
    headers: dict[str, str]
    model: str
    stream: bool
    retry: Retry | None = None  # compacted harder after an overflow
    recall: RecallSession | None = None  # the recall tool is declared and answered here
    small: Callable[[], str] | None = None  # send's not_an_overflow: the request is well under its window
    mend: bool = False  # stale reasoning in a refusal is the proxy's to mend
    request: Request | None = None  # as parsed (None: not parsed)


class Incoming(NamedTuple):
    """A body as it reached the pipeline: its bytes, the client's headers, what they say, the
    exchange the request is logged under, and the request's path (a protocol may name the model
    or the method there). (A named tuple: a frozen dataclass's fields each cost a call.)"""

    raw: bytes
    headers: Any
    caller: Caller
    ex: Exchange
    path: str = ""


# -- the route ----------------------------------------------------------------------------------
def route_handler(protocol: Protocol) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A protocol's route: `handle` with the protocol given (a partial, which aiohttp takes as the
    coroutine function it wraps). Not a coroutine awaiting `handle`: every event a stream relays
    resumes each frame of the chain between aiohttp's task and the relay."""
    return partial(handle, protocol=protocol)


async def handle(request: web.Request, protocol: Protocol, *, path: str | None = None,
                 count_only: bool = False) -> web.StreamResponse:
    """A protocol's route. `path`: the upstream's, when not the adapter's (a token count's, or
    one the client's path names); `count_only`: a token count, which makes no record or note,
    declares the tool unkept and is answered whole."""
    state = request.app[STATE]
    raw = await read_body(request, state.max_body, BodyPace.of(state.cfg.server))
    caller = protocol.caller(request, state)
    incoming = Incoming(raw, request.headers, caller, request[EXCHANGE], request.path)
    if caller.bypass:
        return await as_sent(request, state, protocol, incoming, "bypassed", reasons.BYPASS, path, count_only)
    if protocol.native is not None:  # the agent's own compaction handshake, answered or forwarded
        return await protocol.native(request, raw, caller, count_only,
                                     partial(_prepared, request, state, protocol, incoming, path, count_only))
    return await _prepared(request, state, protocol, incoming, path, count_only, raw)


async def _prepared(request: web.Request, state: ProxyState, protocol: Protocol, incoming: Incoming,
                    path: str | None, count_only: bool, raw: bytes) -> web.StreamResponse:
    """The body (`raw`: as a native handshake left it) prepared and forwarded."""
    if raw is not incoming.raw:
        incoming = incoming._replace(raw=raw)
    caller = incoming.caller
    try:
        p = await prepare(state, protocol, incoming, count_only=count_only)
    except errors.Uncompactable:  # not the proxy's to refuse: the upstream judges it
        return await as_sent(request, state, protocol, incoming, "none", reasons.UNCOMPACTABLE, path, count_only)
    if count_only:
        p.mend = p.stream = False  # (a count is answered whole; its refusal relayed as it came)
    return await forward(request, state, protocol, p, caller, path)


async def as_sent(request: web.Request, state: ProxyState, protocol: Protocol, incoming: Incoming, status: str,
                  why: str, path: str | None = None, count_only: bool = False) -> web.StreamResponse:
    """The body forwarded as it came, valid or not; the counts are the proxy's when it can read
    the body, else 0 (the upstream judges it)."""
    raw = incoming.raw
    try:
        parsed = await parse_alone(state, protocol, incoming)
        tokens, streaming = parsed.total(), parsed.stream
        incoming.ex.model, incoming.ex.stream = parsed.model, streaming
        _note(incoming.ex, parsed, incoming.caller.credentials.scope)  # billed: direct and proxied alike
    except Exception:
        tokens, streaming = 0, _STREAM_TRUE.search(raw) is not None
    up = _upstream(request, state, protocol, incoming.caller, streaming and not count_only, path)
    return await send(request, state.session, protocol.adapter, up, raw,
                      Report(tokens, status, tokens, why=why).headers())


async def forward(request: web.Request, state: ProxyState, protocol: Protocol, p: Prepared, caller: Caller,
                  path: str | None = None) -> web.StreamResponse:
    """The prepared body sent and its answer relayed, recall answered in it; the token ratio
    learned from the answer's usage where the protocol does."""
    recall = None
    if p.recall is not None:
        recall = protocol.answering(state, p.recall) if protocol.answering is not None else \
            Answering(p.recall, protocol.dialect, protocol.rounds)
    up = _upstream(request, state, protocol, caller, p.stream, path)
    resp = await send(request, state.session, protocol.adapter, up, p.data, p.headers, retry=p.retry, recall=recall,
                      hooks=state.hooks, not_an_overflow=p.small, mend_reasoning=p.mend)
    recall_answers.finished(state.hooks, protocol.name, p.model, p.recall)
    if protocol.learns_ratio:
        _learn_ratio(state, p, resp, request[EXCHANGE].usage)
    return resp


def _upstream(request: web.Request, state: ProxyState, protocol: Protocol, caller: Caller, streaming: bool,
              path: str | None) -> Upstream:
    adapter = protocol.adapter
    return Upstream.of(request, adapter.upstream(state.cfg), path or adapter.upstream_path, caller.forwarded(),
                       streaming)


# -- the request --------------------------------------------------------------------------------
async def prepare(state: ProxyState, protocol: Protocol, incoming: Incoming, *, recall: bool = True,
                  count_only: bool = False) -> Prepared:
    """The stages for one body. `recall` False: the caller does not answer the recall tool."""
    parsed = await read(state, protocol, incoming)
    if isinstance(parsed, AsSent):
        return Prepared(parsed.raw, Report(0, "none", 0, why=parsed.why).headers(), parsed.model, parsed.stream)
    ex, caller = incoming.ex, incoming.caller
    before = parsed.total()
    _note(ex, parsed, caller.credentials.scope)
    if state.cfg.server.log_content and protocol.log_content is not None:
        protocol.log_content(parsed.body)
    identity = identify(state, protocol, parsed, caller, ex.conversation, recall=recall)
    if identity is None:
        # No credential, no configured key, no session id: any other such client could be served
        # this one's records, so none are kept or read for it.
        _warn_anonymous()
        return _unchanged(state, protocol, parsed, before, reasons.ANONYMOUS, caller.long_context)
    parsed.extra["count_only"] = count_only  # a token count: records and notes made already apply, none is made
    flow = Flow.of(protocol.adapter, parsed, identity, before)
    if (seen := observed(state, ex, flow, incoming.headers, start=not count_only)) is not None:
        return Prepared(parsed.raw, seen.headers(), parsed.model, parsed.stream, request=parsed)
    return await run(state, protocol, flow, ex, dry=count_only)


async def read(state: ProxyState, protocol: Protocol, incoming: Incoming) -> Request | AsSent:
    """The body as the stages' Request (what the conversation's previous body shared reused, the
    rest parsed off the event loop when large), or one to forward as it came."""
    scope = incoming.caller.credentials.scope
    if protocol.read is not None:
        parsed = await protocol.read(state, incoming, scope)
    elif protocol.parse is not None:
        parsed = await protocol.parse(state, incoming)
    else:
        parsed = await reuse.parse(protocol.adapter, incoming.raw, state.counter, state.cfg, scope)
    incoming.ex.model, incoming.ex.stream = parsed.model, parsed.stream
    if isinstance(parsed, Request) and protocol.learns_ratio and state.cfg.compaction.learn_token_ratio \
            and state.ratios is not None:
        parsed.ratio = await state.ratios.ratio(parsed.model, parsed.ratio)  # learned from the upstream's usage
    return parsed


async def parse_alone(state: ProxyState, protocol: Protocol, incoming: Incoming) -> Request:
    """The body parsed by itself (nothing reused, nothing expanded): to count one that goes as it came."""
    if protocol.parse is not None:
        return await protocol.parse(state, incoming)
    return await offload.sized(len(incoming.raw), protocol.adapter.parse, incoming.raw, state.counter, state.cfg)


def identify(state: ProxyState, protocol: Protocol, parsed: Request, caller: Caller, conversation: str, *,
             recall: bool = True, scope: str | None = None) -> Identity | None:
    """Who the request is for (None: no scope, so no records kept or read): its credential's
    scope (or `scope`, a dry run's without one), the headers the proxy's own calls carry, the
    focus, the recall fields."""
    scope = caller.credentials.scope or scope
    if scope is None:
        return None
    return Identity(scope, caller.own_headers, caller.focus, conversation,
                    *recall_answers.identity_fields(protocol.dialect, state, parsed,
                                                    on=recall and protocol.dialect is not None), caller.long_context)


async def run(state: ProxyState, protocol: Protocol, flow: Flow, ex: Exchange, *, dry: bool = False) -> Prepared:
    """The stages on the flow, the recall tool declared when they replaced anything (its
    originals kept), the body rendered. `dry` (a token count, inspect's dry run): nothing kept,
    and the body is not sent (no overflow retry armed, no prefix noted)."""
    parsed = flow.request
    try:
        await run_request(state.stages, flow)
        session = None
        if flow.identity.recall and flow.changed:
            declared = await recall_answers.prepare(protocol.dialect, state.recall, state.prompts, flow,
                                                    keep=not dry)
            if declared is not None:
                flow.request, session = declared
        data = flow.body() if not flow.changed else \
            await offload.sized(len(parsed.raw) // offload.COPY_SHARE, flow.body)
    except Exception:
        # A bug in our own stages must never cost the client its request: forward what it sent.
        log.exception("shrinking the %s request failed unexpectedly; forwarding it unchanged", protocol.name)
        return fallback(state, protocol, parsed, flow, ex)
    return _after_stages(state, protocol, flow, ex, data, session, dry)


def _after_stages(state: ProxyState, protocol: Protocol, flow: Flow, ex: Exchange, data: bytes,
                  session: RecallSession | None, dry: bool) -> Prepared:
    report, parsed = flow.report, flow.request
    if report.tokens_after is None:
        report.tokens_after = flow.total()
    if protocol.log.isEnabledFor(logging.DEBUG):
        protocol.log.debug("%s %s: %s, %d -> %d tokens, %d tool results summarized", protocol.name, parsed.model,
                           report.status, report.tokens_before, report.tokens_after, report.tool_results)
    headers = report.headers()
    p = Prepared(data, headers, parsed.model, parsed.stream, request=parsed)
    if dry:
        return p
    p.mend = protocol.mends_reasoning and (flow.changed or report.status == "failed-open")
    if session is not None:
        headers["x-compaction-recalls"] = "0"
        p.recall = session
    p.small = _small(state, protocol, parsed, report.tokens_after)
    state.prefixes.forwarded(ex, flow)
    if state.cfg.compaction.enabled:
        p.retry = overflow_retry(state.stages, flow, state.recall, state.prefixes)
    return p


def fallback(state: ProxyState, protocol: Protocol, parsed: Request, flow: Flow, ex: Exchange) -> Prepared:
    """The client's body as it came after a fault of ours, journalled when it needed compacting."""
    before = flow.report.tokens_before
    p = _unchanged(state, protocol, parsed, before, reasons.INTERNAL, flow.identity.long_context)
    journal_fault(state.hooks, ex, flow.identity.scope, parsed.conversation, p.headers["x-compaction-status"], before)
    return p


def _unchanged(state: ProxyState, protocol: Protocol, parsed: Request, before: int, cause: str,
               long_context: bool) -> Prepared:
    """The request forwarded as the client sent it, for `cause` (a reason word)."""
    report = state.compaction.unchanged(parsed.model, before, cause, long_context=long_context)
    return Prepared(parsed.raw, report.headers(), parsed.model, parsed.stream, request=parsed,
                    mend=protocol.mends_reasoning and report.status == "failed-open")


def _small(state: ProxyState, protocol: Protocol, parsed: Request, after: int) -> Callable[[], str] | None:
    """The empty-stream error of a request that cannot be over its window (made only when sent)."""
    if protocol.empty_stream_small is None:
        return None
    window = state.compaction.budget_for(parsed.model).window
    return None if could_overflow(after, window) else partial(protocol.empty_stream_small, after, window)


def _note(ex: Exchange, parsed: Request, scope: str | None) -> None:
    """The exchange's conversation (the journal's and the bill's name for it: anonymous requests
    share one scope there) and the original's prefix, for the bill. (`read` noted its model.)"""
    ex.conversation = conversation_digest(scope or "", parsed.first_digest())
    ex.prefix = Prefix(parsed.keys, parsed.conversation.tokens, parsed.tools_tokens)


def _learn_ratio(state: ProxyState, p: Prepared, resp: web.StreamResponse, usage: Any) -> None:
    """The upstream's prompt count of what we forwarded, against ours (docs/design.md § Learning
    the token ratio). Only for the request as planned: an overflow retry forwarded something else."""
    after = p.headers.get("x-compaction-tokens-after")
    if (not state.cfg.compaction.learn_token_ratio or state.ratios is None or usage is None or p.request is None
            or resp.status != 200 or after is None or resp.headers.get("x-compaction-tokens-after") != after):
        return
    state.ratios.observe(p.model, round(int(after) / p.request.ratio), usage.prompt)


_anonymous_warned = False


def _warn_anonymous() -> None:
    global _anonymous_warned
    if not _anonymous_warned:
        _anonymous_warned = True
        log.warning("a request with no credential and no x-compaction-session is forwarded uncompacted "
                    "(set upstream.api_key, or send a credential or an x-compaction-session id)")
