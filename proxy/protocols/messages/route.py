"""The Anthropic routes (design.md § Messages API): /v1/messages, /v1/messages/count_tokens, and every other
Anthropic request passed through to `anthropic.base_url`, beside the OpenAI routes of the same
proxy. An Anthropic request is one on an Anthropic-only path (/v1/messages..., /v1/complete) or
one that carries `anthropic-version` (the anthropic SDKs and Claude Code send it on every call,
so /v1/models or /v1/files from them reach Anthropic, not OpenAI). Errors the proxy makes on
these routes are in Anthropic's shape."""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

from proxy.config import secret
from proxy import credentials, errors, offload
from proxy.byheaders import ByHeaders, Caller
from proxy import reuse as prefix
from proxy.adapter import Request
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.protocols.messages.errors import ANTHROPIC
from proxy.protocols.messages.forward import upstream_headers
from proxy.protocols.messages.windows import long_context
from proxy.compaction.stage import journal_fault
from proxy.flow import Flow, Identity, Report, run_request
from proxy.model import Conversation
from proxy.body import BodyPace, read_body
from proxy.forward import passthrough
from proxy.hashing import conversation_digest
from proxy.ops import reasons
from proxy.ops.exchange import EXCHANGE
from proxy.recall import answers as recall_answers
from proxy.protocols.messages.recall import MESSAGES as RECALL
from proxy.protocols.messages.recall_stream import Rounds as RecallRounds
from proxy.recall.session import RecallSession
from proxy.send import Answering, Upstream, overflow_retry, send
from proxy.state import STATE
from proxy.watch import observed

log = logging.getLogger("proxy.messages")
MESSAGES = MessagesAdapter()
VERSION_HEADERS = ("anthropic-version", "anthropic-beta")  # the proxy's own calls carry the client's
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ANTHROPIC_PATHS = ("/v1/messages", "/v1/complete")
_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


def is_anthropic(request: web.Request) -> bool:
    path = request.path
    return any(path == p or path.startswith(p + "/") for p in ANTHROPIC_PATHS) or "anthropic-version" in request.headers


def anthropic_route(handler: Handler) -> Handler:
    """Every error made while handling this request (the middleware's, a relay's, a stream's last
    event) takes Anthropic's shape."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        errors.SHAPE.set(ANTHROPIC)  # this request's task only
        return await handler(request)

    return wrapped


@anthropic_route
async def handle_anthropic_passthrough(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return await passthrough(request, state.session, state.cfg.anthropic, state.max_body, BodyPace.of(state.cfg.server),
                             base_path="", key_header="x-api-key")


def _headers(status: str, before: int, after: int, why: str) -> dict[str, str]:
    return Report(before, status, after, why=why).headers()


def _bypassed(raw: bytes, counter: Any, cfg: Any) -> tuple[int, bool]:
    """The proxy's count and the stream flag of a body forwarded as it came (0, a guess: when the
    body is not one the proxy can read; the upstream judges it)."""
    try:
        req = MESSAGES.parse(raw, counter, cfg)
    except Exception:
        return 0, _STREAM_TRUE.search(raw) is not None
    return req.total(), req.stream


@dataclass(frozen=True)
class _Calls:
    """What the proxy's own calls for a request carry (its credentials, anthropic-version and
    -beta as sent), and whether it opted into the 1M window."""

    headers: dict[str, str]
    long_context: bool


def _caller(headers: Any, scope_secret: bytes, key: str | None) -> Caller:
    creds = credentials.resolve(headers, scope_secret, key, MESSAGES.credential_headers, key_header="x-api-key")
    calls = {**creds.headers, **{h: headers[h] for h in VERSION_HEADERS if h in headers}}
    return Caller.of(headers, creds, upstream_headers(headers, key), _Calls(calls, long_context(headers)))


CALLERS = ByHeaders(_caller)  # what the headers say, worked out once per client's header list


def _caller_of(request: web.Request, state: Any) -> Caller:
    return CALLERS.of(request, (state.scope_secret, secret(state.cfg.anthropic.api_key)))


def _identity(request: web.Request, state: Any, req: Request, caller: Caller) -> Identity | None:
    """Who the request is for: its credential's scope (None: no credential, no session id, so no
    records kept or read), the credentials and anthropic-version / -beta for the proxy's own calls."""
    scope = caller.credentials.scope
    request[EXCHANGE].conversation = conversation_digest(scope or "", req.first_digest())
    if scope is None:
        return None
    return Identity(scope, caller.extra.headers, caller.focus, request[EXCHANGE].conversation,
                    *recall_answers.identity_fields(RECALL, state, req), caller.extra.long_context)


@dataclass
class Prepared:
    """One request after the stages: what to forward, its x-compaction-* report, how to retry it."""

    request: Request
    forwarded: Conversation
    report: Report
    retry: Any = None  # send.Retry: compacted harder after an overflow
    recall: RecallSession | None = None  # the recall tool is declared and answered here (design.md § Recall)

    def body(self) -> bytes:
        return MESSAGES.render(self.request, self.forwarded)

    async def rendered(self) -> bytes:
        """The body to send: the client's bytes when nothing changed, else written off the event
        loop when large."""
        if self.forwarded is self.request.conversation:
            return self.request.raw
        return await offload.sized(len(self.request.raw) // offload.COPY_SHARE, self.body)


async def prepare(request: web.Request, state: Any, raw: bytes, caller: Caller, *, count_only: bool) -> Prepared:
    """Parse; then the stages (tool-result notes, then the history unless Anthropic's own
    compaction covers it) on the request's flow; a bug in them forwards the request as sent.
    `count_only` (count_tokens): stored records and notes apply, none is made."""
    cfg = state.cfg
    # What the conversation's previous body shared is reused (per credential scope); the rest is
    # parsed off the event loop when it is large.
    req = await prefix.parse(MESSAGES, raw, state.counter, cfg, caller.credentials.scope)
    ex = request[EXCHANGE]
    ex.model, ex.stream = req.model, req.stream
    identity = _identity(request, state, req, caller)
    if identity is None:
        # No records kept or read (see _identity): compaction was needed and not done, as on chat.
        return _unchanged(state, req, caller, req.total(), reasons.ANONYMOUS)
    req.extra["count_only"] = count_only  # count_tokens: records and notes made already apply, none is made
    flow = Flow.of(MESSAGES, req, identity)
    # observed: forwarded (or counted) as sent, the stages beside it
    if (seen := observed(state, ex, flow, request.headers, start=not count_only)) is not None:
        return Prepared(req, req.conversation, seen)
    try:
        await run_request(state.stages, flow)
        session = None
        if identity.recall and flow.changed:  # the originals kept (count_tokens: counted only); the tool declared
            recall = await recall_answers.prepare(RECALL, state.recall, state.prompts, flow, keep=not count_only)
            if recall is not None:
                flow.request, session = recall
    except Exception:
        log.exception("shrinking the Messages request failed unexpectedly; forwarding it unchanged")
        unchanged = _unchanged(state, req, caller, flow.report.tokens_before, reasons.INTERNAL)
        journal_fault(state.hooks, ex, identity.scope, req.conversation, unchanged.report.status,
                      flow.report.tokens_before)
        return unchanged
    if flow.report.tokens_after is None:
        flow.report.tokens_after = flow.total()
    if count_only:
        return Prepared(flow.request, flow.forwarded, flow.report)
    state.prefixes.forwarded(ex, flow)
    return Prepared(flow.request, flow.forwarded, flow.report, overflow_retry(state.stages, flow, state.recall,
                                                                              state.prefixes), session)


def _unchanged(state: Any, req: Request, caller: Caller, before: int, cause: str) -> Prepared:
    """The request forwarded as the client sent it, for `cause` (a reason word)."""
    return Prepared(req, req.conversation,
                    state.compaction.unchanged(req.model, before, cause, long_context=caller.extra.long_context))


@anthropic_route
async def handle_messages(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    raw = await read_body(request, state.max_body, BodyPace.of(cfg.server))
    caller = _caller_of(request, state)
    headers = caller.forwarded()
    if caller.bypass:
        return await _as_sent(request, state, raw, headers, "bypassed", reasons.BYPASS)
    try:
        p = await prepare(request, state, raw, caller, count_only=False)
    except errors.Uncompactable:  # not the proxy's to refuse: the upstream judges it
        return await _as_sent(request, state, raw, headers, "none", reasons.UNCOMPACTABLE)
    body = await p.rendered()
    extra = p.report.headers()
    if p.recall is not None:
        extra["x-compaction-recalls"] = "0"
    recall = Answering(p.recall, RECALL, RecallRounds) if p.recall is not None else None
    # Thinking made stale by the proxy is the proxy's to mend: a body it changed, or one it could
    # not compact this time though it may have before (its record lost with a restart or evicted):
    # the kept turns' thinking was then made under the summary.
    mend = p.forwarded is not p.request.conversation or p.report.status == "failed-open"
    resp = await send(request, state.session, MESSAGES, _upstream(request, cfg, headers, p.request.stream), body,
                      extra, retry=p.retry, recall=recall, hooks=state.hooks, mend_reasoning=mend)
    recall_answers.finished(state.hooks, "messages", p.request.model, p.recall)
    return resp


async def _as_sent(request: web.Request, state: Any, raw: bytes, headers: Any, status: str, why: str,
                   path: str = MESSAGES.upstream_path) -> web.StreamResponse:
    """The body forwarded as it came, with the proxy's count when it can make one."""
    tokens, stream = await offload.sized(len(raw), _bypassed, raw, state.counter, state.cfg)
    up = _upstream(request, state.cfg, headers, stream and path == MESSAGES.upstream_path, path)
    return await send(request, state.session, MESSAGES, up, raw, _headers(status, tokens, tokens, why))


@anthropic_route
async def handle_count_tokens(request: web.Request) -> web.StreamResponse:
    """Claude Code decides its own compaction from this count: it is the count of what the proxy
    would forward now (design.md § Messages API), asked of the upstream."""
    state = request.app[STATE]
    raw = await read_body(request, state.max_body, BodyPace.of(state.cfg.server))
    caller = _caller_of(request, state)
    try:
        p = await prepare(request, state, raw, caller, count_only=True)
    except errors.Uncompactable:
        return await _as_sent(request, state, raw, caller.forwarded(), "none", reasons.UNCOMPACTABLE,
                              "/v1/messages/count_tokens")
    body = await p.rendered()
    up = _upstream(request, state.cfg, caller.forwarded(), False, "/v1/messages/count_tokens")
    return await send(request, state.session, MESSAGES, up, body, p.report.headers())


def _upstream(request: web.Request, cfg: Any, headers: Any, streaming: bool, path: str = MESSAGES.upstream_path) -> Upstream:
    return Upstream.of(request, MESSAGES.upstream(cfg), path, headers, streaming)
