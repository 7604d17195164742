"""POST /v1/chat/completions: parse, build the flow, run the stages, forward, relay.

The handler is the shape every protocol's route has (design.md § One request, one flow): the adapter parses the body into
the neutral model, the stages (tool-result notes, then history compaction) work on the flow, and
the forwarding is layered (proxy/send.py, shared by every route): one upstream call, and around it
the overflow layer that asks the stages to compact harder and sends once more. When the stages change nothing, the client's
original bytes go upstream. Whatever happens, the client gets the upstream's answer or an
OpenAI-shaped error, with the x-compaction-* headers.
"""

from __future__ import annotations

import logging
import re
from functools import partial
from typing import Any

from aiohttp import web

from proxy.config import secret
from proxy import errors, offload
from proxy.byheaders import ByHeaders, openai_caller
from proxy import reuse as prefix
from proxy.adapter import Request
from proxy.protocols.chat.adapter import ChatAdapter
from proxy.protocols.chat.body import latest_user_index, message_text
from proxy.compaction.budget import could_overflow
from proxy.compaction.stage import journal_fault
from proxy.flow import Flow, Identity, Report, run_request
from proxy.body import BodyPace, read_body
from proxy.hashing import conversation_digest
from proxy.recall import answers as recall_answers
from proxy.protocols.chat import recall as recall_chat
from proxy.protocols.chat import recall_stream
from proxy.ops import reasons
from proxy.ops.exchange import EXCHANGE, Prefix
from proxy.send import Answering, Upstream, overflow_retry, send
from proxy.state import STATE, ProxyState
from proxy.text import clip_hint
from proxy.watch import observed

log = logging.getLogger("proxy.chat")

CHAT = ChatAdapter()
CONTENT_LOG_CHARS = 200  # head and tail of the latest user message logged with server.log_content


def empty_stream_small(tokens: int, window: int) -> str:
    """The error for an empty stream from a request well under its window. (An f-string: every
    such request makes it, and str.format of the long text cost ~10k instructions, 1% of one.)"""
    return (f"the upstream ended the event stream without sending an event; the request ({tokens} tokens) is "
            f"well under the model's {window}-token window, so it was not retried compacted (llama.cpp does "
            f"this for a request it rejects, such as a message it cannot template)")


CALLERS = ByHeaders(openai_caller)  # what the headers say, worked out once per client's header list


def _headers(status: str, before: int, after: int, why: str) -> dict[str, str]:
    return Report(before, status=status, tokens_after=after, why=why).headers()


async def handle_chat(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    ex = request[EXCHANGE]
    raw = await read_body(request, state.max_body, BodyPace.of(cfg.server))
    api_key = secret(cfg.upstream.api_key)
    caller = CALLERS.of(request, (state.scope_secret, api_key))
    up_headers = caller.forwarded()
    if caller.bypass:
        return await _bypass(request, state, raw, up_headers, caller.credentials.scope)
    creds = caller.credentials
    # What the conversation's previous body shared is reused; the rest is parsed off the event
    # loop when it is large.
    try:
        parsed = await prefix.parse(CHAT, raw, state.counter, cfg, creds.scope)
    except errors.Uncompactable:  # not the proxy's to refuse: the upstream judges it
        return await _bypass(request, state, raw, up_headers, creds.scope, "none", reasons.UNCOMPACTABLE)
    if cfg.compaction.learn_token_ratio and state.ratios is not None:
        parsed.ratio = await state.ratios.ratio(parsed.model, parsed.ratio)  # learned from the upstream's usage
    ex.model, ex.stream = parsed.model, parsed.stream
    before = parsed.total()
    # The conversation's name for the journal and the bill (anonymous requests share one scope there).
    ex.conversation = conversation_digest(creds.scope or "", parsed.first_digest())
    # The original's, for the bill (its lists as parsed: a Request's counts and keys never change).
    ex.prefix = Prefix(parsed.keys, parsed.conversation.tokens, parsed.tools_tokens)
    up = Upstream.of(request, CHAT.upstream(cfg), CHAT.upstream_path, up_headers, parsed.stream)

    if cfg.server.log_content:
        _log_content(parsed.body)
    if creds.scope is None:
        # No credential, no configured key, no session id: any other such client could be served
        # this one's records, so none are kept or read for it.
        _warn_anonymous()
        return await send(request, state.session, CHAT, up, raw,
                          state.compaction.unchanged(parsed.model, before, reasons.ANONYMOUS).headers())
    flow = Flow.of(CHAT, parsed, Identity(creds.scope, creds.headers, caller.focus,
                                          ex.conversation, *recall_answers.identity_fields(recall_chat.CHAT, state, parsed)),
                   before)
    if (seen := observed(state, ex, flow, request.headers)) is not None:  # forwarded as sent, the stages beside it
        return await send(request, state.session, CHAT, up, raw, seen.headers())
    try:
        await run_request(state.stages, flow)
        recall = None
        if state.recall is not None and flow.changed:  # the originals kept; the tool declared when anything was replaced
            recall = await recall_chat.prepare(state.recall, state.prompts, flow)
        data = flow.body() if not flow.changed else await offload.sized(len(raw) // offload.COPY_SHARE, flow.body)
    except Exception:
        # A bug in our own stages must never cost the client its request: forward what it sent.
        log.exception("shrinking the request failed unexpectedly; forwarding it unchanged")
        unchanged = state.compaction.unchanged(parsed.model, before, reasons.INTERNAL)
        journal_fault(state.hooks, ex, creds.scope, parsed.conversation, unchanged.status, before)
        return await send(request, state.session, CHAT, up, raw, unchanged.headers())
    report = flow.report
    if report.tokens_after is None:
        report.tokens_after = flow.total()
    after = report.tokens_after
    log.debug("chat %s: %s, %d -> %d tokens, %d tool results summarized", parsed.model, report.status, before, after,
              report.tool_results)
    window = state.compaction.budget_for(parsed.model).window
    small = None if could_overflow(after, window) else partial(empty_stream_small, after, window)
    headers = report.headers()
    if recall is not None:
        headers["x-compaction-recalls"] = "0"
    state.prefixes.forwarded(ex, flow)
    resp = await send(request, state.session, CHAT, up, data, headers,
                      retry=overflow_retry(state.stages, flow, state.recall, state.prefixes)
                      if cfg.compaction.enabled else None,
                      recall=Answering(recall, recall_chat.CHAT, recall_stream.Rounds) if recall is not None else None,
                      hooks=state.hooks, not_an_overflow=small)
    recall_answers.finished(state.hooks, "chat", parsed.model, recall)
    _learn_ratio(state, parsed, after, resp, ex.usage)
    return resp


# -- the rest of the request -------------------------------------------------------------------
def _learn_ratio(state: ProxyState, parsed: Request, after: int, resp: web.StreamResponse, usage: Any) -> None:
    """The upstream's prompt count of what we forwarded, against ours (design.md § Learning the token ratio). Only for the
    request as planned: an overflow retry forwarded something else."""
    if (not state.cfg.compaction.learn_token_ratio or state.ratios is None or usage is None
            or resp.status != 200 or resp.headers.get("x-compaction-tokens-after") != str(after)):
        return
    state.ratios.observe(parsed.model, round(after / parsed.ratio), usage.prompt)


_anonymous_warned = False


def _warn_anonymous() -> None:
    global _anonymous_warned
    if not _anonymous_warned:
        _anonymous_warned = True
        log.warning("a request with no credential and no x-compaction-session is forwarded uncompacted "
                    "(set upstream.api_key, or send a credential or an x-compaction-session id)")


def _log_content(body: dict[str, Any]) -> None:
    """Only with server.log_content on: message content is the client's data, not ours to log."""
    messages = body["messages"]
    i = latest_user_index(messages)
    latest = clip_hint(message_text(messages[i]), CONTENT_LOG_CHARS, CONTENT_LOG_CHARS) if i is not None else ""
    log.info("chat %s: %d messages; latest user message: %s", body["model"], len(messages), latest)


_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


async def _bypass(request: web.Request, state: ProxyState, raw: bytes, up_headers: Any,
                  scope: str | None, status: str = "bypassed", why: str = reasons.BYPASS) -> web.StreamResponse:
    """x-compaction-bypass, or a body the proxy cannot compact: it goes upstream as it came, valid
    or not; the counts are the proxy's when it can make them, else 0."""
    ex = request[EXCHANGE]
    try:
        parsed = await offload.sized(len(raw), CHAT.parse, raw, state.counter, state.cfg)
        tokens, streaming = parsed.total(), parsed.stream
        ex.model, ex.stream = parsed.model, streaming
        ex.conversation = conversation_digest(scope or "", parsed.first_digest())
        ex.prefix = Prefix(parsed.keys, parsed.conversation.tokens, parsed.tools_tokens)  # billed: direct and proxied alike
    except Exception:  # not ours to judge: the upstream answers it
        tokens, streaming = 0, _STREAM_TRUE.search(raw) is not None
    up = Upstream.of(request, CHAT.upstream(state.cfg), CHAT.upstream_path, up_headers, streaming)
    return await send(request, state.session, CHAT, up, raw, _headers(status, tokens, tokens, why))
