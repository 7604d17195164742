"""POST /v1/responses (and each WebSocket `response.create`): the chat path's flow and stages for
the Responses API (design.md § One request, one flow, 11).

A request: body decoded (zstd, gzip ...) and checked; the proxy's own compaction items expanded
into their summary messages; a stateful request (`previous_response_id`, `conversation`) forwarded
as it is; otherwise parsed by the Responses adapter (proxy/protocols/responses/adapter.py) into a Flow whose
stages make tool outputs notes, then, unless the client asked for native compaction
(`context_management`), the history a stored summary. Nothing changed: the client's bytes go upstream. The upstream's
overflow (HTTP 400 `context_length_exceeded`, or a stream failing with it before any output) is
compacted with half the budget and retried once, before anything reached the client.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from aiohttp import web

from proxy.config import secret
from proxy import credentials, errors, jsonbody, offload
from proxy.byheaders import ByHeaders, Caller, openai_caller
from proxy import reuse as prefix
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.compaction.budget import could_overflow
from proxy.compaction.stage import journal_fault
from proxy.flow import Flow, Identity, Report, run_request
from proxy.body import BodyPace, read_body
from proxy.hashing import conversation_digest
from proxy.recall import answers as recall_answers
from proxy.protocols.responses import recall_chains
from proxy.protocols.responses.recall import RESPONSES as RECALL
from proxy.protocols.responses.recall_stream import Rounds as RecallRounds
from proxy.recall.session import RecallSession
from proxy.ops import reasons
from proxy.ops.exchange import EXCHANGE
from proxy.protocols.responses import compact
from proxy.protocols.responses.body import parse_responses_body
from proxy.protocols.responses.items import stateful
from proxy.send import Answering, Upstream, overflow_retry, send
from proxy.state import STATE, ProxyState
from proxy.watch import observed

log = logging.getLogger("proxy.responses")
ADAPTER = ResponsesAdapter()


# A stream that fails for length can only be one whose request may be over the window: the first
# events of any other go to the client at once (send: not_an_overflow), and an empty one is no overflow.
def empty_stream_small(tokens: int, window: int) -> str:
    """(An f-string, as chat's: str.format of the long text costs every request ~10k instructions.)"""
    return (f"the upstream ended the event stream without sending an event; the request ({tokens} tokens) is "
            f"well under the model's {window}-token window, so it was not retried compacted")


def _headers(status: str, before: int, after: int, why: str) -> dict[str, str]:
    return Report(before, status=status, tokens_after=after, why=why).headers()


@dataclass
class Prepared:
    """One request after the stages: what to forward, its headers, and how to retry it."""

    data: bytes
    body: dict[str, Any]
    headers: dict[str, str]
    stream: bool
    retry: Any = None  # send.Retry: compacted harder after an overflow
    recall: RecallSession | None = None  # the recall tool is declared and answered here (design.md § Recall)
    # send's not_an_overflow: the request is well under its window (None: it may be over it)
    small: Callable[[], str] | None = None


NOT_OWN = "not_own"  # Request.extra: none of its input items is one of our compaction items


def has_own_items(parsed: Any, items: list[Any]) -> bool:
    """Whether one of `items` is our compaction item. `parsed`: the Request they were parsed into
    through the reuse (None: not so). The items it shares with the conversation's previous request
    (the same objects) are not looked at again when none of that request's was one; a request
    with none is marked so for the next."""
    known = 0
    prev = parsed.previous if parsed is not None else None
    if prev is not None and prev.extra.get(NOT_OWN):
        lead = len(parsed.conversation.values) - len(items)  # the instructions' envelope, before the items
        known = max(0, min(len(items), parsed.shared - lead))
    if compact.has_own(items, known):
        return True
    if parsed is not None:
        parsed.extra[NOT_OWN] = True
    return False


async def prepare(state: ProxyState, raw: bytes, body: dict[str, Any] | None, incoming: Any, ex: Any, *,
                  recall: bool = True, caller: Caller | None = None) -> Prepared:
    """The stages for one Responses body (HTTP: `body` None, parsed here; a socket's
    response.create: parsed already). `recall`: the route answers the recall tool (HTTP:
    proxy/send.py; a socket: socket_recall.py). `caller`: what `incoming` says (else read here)."""
    cfg = state.cfg
    if caller is not None:
        creds, focus = caller.credentials, caller.focus
    else:
        creds = credentials.resolve(incoming, state.scope_secret, secret(cfg.upstream.api_key))
        focus = incoming.get("x-compaction-focus") or None
    parsed = None
    if body is None and (len(raw) >= prefix.MIN_BYTES or not _maybe_stateful(raw)):
        # What the conversation's previous body shared is reused (per credential scope); the
        # rest is parsed off the event loop when it is large.
        parsed = await prefix.parse(ADAPTER, raw, state.counter, cfg, creds.scope)
        body = parsed.body
    elif body is None:
        body = await offload.sized(len(raw), parse_responses_body, raw)
    items = body.get("input") if isinstance(body.get("input"), list) else None
    if items is not None and has_own_items(parsed, items):
        body = {**body, "input": await compact.expand(items, state.store, state.scope_secret, creds.scope, state.prompts)}
        raw = jsonbody.dumps(body)
        parsed = None
    streaming = bool(body.get("stream"))
    ex.model, ex.stream = body["model"], streaming
    if stateful(body) is not None:
        # The history lives at the upstream: the proxy cannot see it, and changes nothing (but
        # the id a streamed recall answer showed for the stored one: recall/chains.py).
        body, raw = await recall_chains.resolved(state.store, creds.scope, body, raw,
                                                  state.prompts.text("recall-unanswered"))
        return Prepared(raw, body, _headers("none", 0, 0, reasons.STATEFUL), streaming)
    if parsed is None:
        parsed = await offload.sized(len(raw), ADAPTER.request_of, raw, body, state.counter, cfg)
    before = parsed.total()
    ex.conversation = conversation_digest(creds.scope or "", parsed.first_digest())
    if creds.scope is None:
        # No credential, no configured key, no session id: any other such client could be served
        # this one's records, so none are kept or read for it (as on the chat path).
        return Prepared(raw, body, state.compaction.unchanged(parsed.model, before, reasons.ANONYMOUS).headers(), streaming)
    flow = Flow.of(ADAPTER, parsed, Identity(creds.scope, creds.headers, focus,
                                          ex.conversation, *recall_answers.identity_fields(RECALL, state, parsed, on=recall)),
                   before)
    if (seen := observed(state, ex, flow, incoming)) is not None:  # forwarded as sent, the stages beside it
        return Prepared(raw, body, seen.headers(), streaming)
    try:
        await run_request(state.stages, flow)
        session = await recall_answers.prepare_flow(RECALL, state.recall, state.prompts, flow) \
            if flow.identity.recall and flow.changed else None  # (nothing replaced: nothing to keep or declare)
        data = flow.body()
    except Exception:
        # A bug in our own stages (or a message the view cannot map back) must never cost the
        # client its request: forward what it sent.
        log.exception("shrinking the Responses request failed unexpectedly; forwarding it unchanged")
        unchanged = state.compaction.unchanged(parsed.model, before, reasons.INTERNAL)
        journal_fault(state.hooks, ex, creds.scope, parsed.conversation, unchanged.status, before)
        return Prepared(raw, body, unchanged.headers(), streaming)
    if flow.report.tokens_after is None:
        flow.report.tokens_after = flow.total()

    headers = flow.report.headers()
    if session is not None:
        headers["x-compaction-recalls"] = "0"
    after, window = flow.report.tokens_after, state.compaction.budget_for(parsed.model).window
    small = None if could_overflow(after, window) else partial(empty_stream_small, after, window)
    state.prefixes.forwarded(ex, flow)
    return Prepared(data, body, headers, streaming, overflow_retry(state.stages, flow, state.recall, state.prefixes),
                    session, small)


async def handle_responses(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    ex = request[EXCHANGE]
    raw = await read_body(request, state.max_body, BodyPace.of(cfg.server))
    caller = CALLERS.of(request, (state.scope_secret, secret(cfg.upstream.api_key)))
    up_headers = caller.forwarded()
    if caller.bypass:
        return await _as_sent(request, state, raw, up_headers, "bypassed", reasons.BYPASS)
    try:
        p = await prepare(state, raw, None, request.headers, ex, caller=caller)
    except errors.Uncompactable:  # not the proxy's to refuse: the upstream judges it (a stored prompt's model)
        return await _as_sent(request, state, raw, up_headers, "none", reasons.UNCOMPACTABLE)
    recall = None
    if p.recall is not None:  # a streamed answer's shown ids lead to the stored last round (recall/chains.py)
        session = p.recall
        recall = Answering(session, RECALL, RecallRounds,
                           streamed=lambda rounds: recall_chains.remember(state.store, session.scope, *rounds.ids(),
                                                                        rounds.unanswered()),
                           whole=lambda answer: recall_chains.remember_answer(state.store, session.scope, answer,
                                                                              session.unanswered))
    resp = await send(request, state.session, ADAPTER, _upstream(request, state, up_headers, p.stream), p.data,
                      p.headers, retry=p.retry, recall=recall, hooks=state.hooks, not_an_overflow=p.small)
    recall_answers.finished(state.hooks, "responses", p.body["model"], p.recall)
    return resp


async def _as_sent(request: web.Request, state: ProxyState, raw: bytes, headers: Any, status: str,
                   why: str) -> web.StreamResponse:
    streaming = b'"stream":true' in raw.replace(b" ", b"")
    return await send(request, state.session, ADAPTER, _upstream(request, state, headers, streaming), raw,
                      _headers(status, 0, 0, why))


CALLERS = ByHeaders(openai_caller)  # what the headers say, worked out once per client's header list


def _maybe_stateful(raw: bytes) -> bool:
    """Whether a small body may name a history kept upstream (`previous_response_id`,
    `conversation`): such a body is forwarded as it is, so it is not counted. A byte search, much
    cheaper than a count; a false alarm only costs what the count saves. (A large body is parsed
    through the reuse and counted either way: there the search would cost more than it saves.)"""
    return raw.find(b'"previous_response_id"') >= 0 or raw.find(b'"conversation"') >= 0


def _upstream(request: web.Request, state: ProxyState, headers: Any, streaming: bool) -> Upstream:
    return Upstream.of(request, ADAPTER.upstream(state.cfg), "/responses", headers, streaming)
