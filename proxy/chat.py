"""POST /v1/chat/completions: parse, build the flow, run the stages, forward, relay.

The handler is the shape every protocol's route has (spec 10.1): the adapter parses the body into
the neutral model, the stages (tool-result notes, then history compaction) work on the flow, and
the forwarding is layered: one upstream call (`send`), and around it the overflow layer that asks
the stages to compact harder and sends once more. When the stages change nothing, the client's
original bytes go upstream. Whatever happens, the client gets the upstream's answer or an
OpenAI-shaped error, with the x-compaction-* headers.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

from proxy import credentials, errors, jsonbody, offload
from proxy.adapters import prefix
from proxy.adapters.base import Request
from proxy.adapters.chat import ChatAdapter
from proxy.chat_request import latest_user_index, message_text
from proxy.compaction.budget import could_overflow
from proxy.compaction.view import Outcome
from proxy.flow import Flow, Identity, Report, run_overflow, run_request
from proxy.forward import (
    UPSTREAM_ERRORS,
    BodyPace,
    client_response_headers,
    client_timeout,
    is_event_stream,
    map_client_error,
    read_body,
    relay_completion,
    relay_events,
    upstream_request_headers,
    upstream_url,
)
from proxy.hashing import conversation_digest
from proxy.recall import answers as recall_answers
from proxy.recall import chat as recall_chat
from proxy.recall import chat_stream as recall_stream
from proxy.recall.session import RecallSession
from proxy.ops.events import compaction_event
from proxy.ops.exchange import EXCHANGE, Prefix, Usage
from proxy.state import STATE, ProxyState
from proxy.text import clip_hint

log = logging.getLogger("proxy.chat")

CHAT = ChatAdapter()
CONTENT_LOG_CHARS = 200  # head and tail of the latest user message logged with server.log_content
EMPTY_STREAM = "the event stream ended before its first event (llama.cpp does this for a prompt over its context window)"
EMPTY_STREAM_SMALL = ("the upstream ended the event stream without sending an event; the request ({tokens} tokens) is "
                      "well under the model's {window}-token window, so it was not retried compacted (llama.cpp does "
                      "this for a request it rejects, such as a message it cannot template)")


def _headers(status: str, before: int, after: int) -> dict[str, str]:
    return Report(before, status=status, tokens_after=after).headers()


async def handle_chat(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    ex = request[EXCHANGE]
    raw = await read_body(request, state.max_body, BodyPace.of(cfg.server))
    api_key = cfg.upstream.api_key.get_secret_value() if cfg.upstream.api_key else None
    up_headers = upstream_request_headers(request.headers, api_key, identity_encoding=True)
    if request.headers.get("x-compaction-bypass", "").strip().lower() in ("1", "true", "yes"):
        return await _bypass(request, state, raw, up_headers)
    creds = credentials.resolve(request.headers, state.scope_secret, api_key, CHAT.credential_headers)
    # What the conversation's previous body shared is reused; the rest is parsed off the event
    # loop when it is large.
    parsed = await prefix.parse(CHAT, raw, state.counter, cfg, creds.scope)
    if cfg.compaction.learn_token_ratio and state.ratios is not None:
        parsed.ratio = await state.ratios.ratio(parsed.model, parsed.ratio)  # learned from the upstream's usage
    ex.model, ex.stream = parsed.model, parsed.stream
    before = parsed.total()
    # The conversation's name for the journal and the bill (anonymous requests share one scope there).
    ex.conversation = conversation_digest(creds.scope or "", parsed.first_digest())
    ex.prefix = Prefix(parsed.keys, list(parsed.conversation.tokens), parsed.tools_tokens)  # the original's, for the bill
    send = _sender(request, state, up_headers, parsed.stream)

    if cfg.server.log_content:
        _log_content(parsed.body)
    if creds.scope is None:
        # No credential, no configured key, no session id: any other such client could be served
        # this one's records, so none are kept or read for it.
        _warn_anonymous()
        status = "failed-open" if _needs_compaction(state, parsed.model, before) else "none"
        return await _answer(await send(raw, _headers(status, before, before)))
    flow = Flow.of(CHAT, parsed, Identity(creds.scope, creds.headers, request.headers.get("x-compaction-focus") or None,
                                          ex.conversation, recall=state.recall is not None,
                                          recall_tokens=recall_chat.declaration_tokens(state.recall, state.prompts, state.counter,
                                                                                       parsed) if state.recall else 0))
    try:
        await run_request(state.stages, flow)
        recall = None
        if state.recall is not None:  # the originals kept; the tool declared when anything was replaced
            recall = await recall_chat.prepare(state.recall, state.prompts, flow)
        data = flow.body() if not flow.changed else await offload.sized(len(raw), flow.body)
    except Exception:
        # A bug in our own stages must never cost the client its request: forward what it sent.
        log.exception("shrinking the request failed unexpectedly; forwarding it unchanged")
        status = "failed-open" if _needs_compaction(state, parsed.model, before) else "none"
        if status != "none":
            state.hooks.compaction(compaction_event(ex, creds.scope, parsed.conversation,
                                                    Outcome(status, reason="internal error"), before, before))
        return await _answer(await send(raw, _headers(status, before, before)))
    report = flow.report
    if report.tokens_after is None:
        report.tokens_after = flow.total()
    after = report.tokens_after
    log.debug("chat %s: %s, %d -> %d tokens, %d tool results summarized", parsed.model, report.status, before, after,
              report.tool_results)
    window = state.compaction.budget_for(parsed.model).window
    small = None if could_overflow(after, window) else EMPTY_STREAM_SMALL.format(tokens=after, window=window)
    headers = report.headers()
    if recall is not None:
        send = _sender(request, state, up_headers, parsed.stream, recall)
        headers["x-compaction-recalls"] = "0"
    resp = await _answer(await _with_overflow_retry(send, flow, data, headers, state, not_an_overflow=small))
    recall_answers.finished(state.hooks, "chat", parsed.model, recall)
    _learn_ratio(state, parsed, after, resp, ex.usage)
    return resp


# -- forwarding, in layers -------------------------------------------------------------------------
@dataclass
class Overflow:
    """The upstream said the request was too long, and nothing went to the client yet: `fallback`
    is what the client gets if no smaller request can be made."""

    fallback: web.StreamResponse
    why: str  # for the log line


# (data, headers, *, may_retry=False, not_an_overflow=None) -> the relayed answer, or an Overflow
Send = Callable[..., Awaitable[Any]]


async def _answer(sent: Any) -> web.StreamResponse:
    return sent.fallback if isinstance(sent, Overflow) else sent


async def _with_overflow_retry(send: Send, flow: Flow, data: bytes, headers: dict[str, str], state: ProxyState, *,
                               not_an_overflow: str | None) -> Any:
    """One forward; when the upstream says it was too long, the stages compact harder (once) and
    it is sent again. (Recall, issue 16, is one more layer around `send`.)"""
    may_retry = state.cfg.compaction.enabled
    sent = await send(data, headers, may_retry=may_retry, not_an_overflow=not_an_overflow)
    if not isinstance(sent, Overflow):
        return sent
    try:
        smaller = await run_overflow(state.stages, flow)
        again = (await offload.sized(len(data), flow.body), flow.report.headers()) if smaller else None
    except Exception:
        log.exception("compacting for the overflow retry failed unexpectedly")
        again = None
    if again is None:
        return sent
    log.info("%s; retrying compacted", sent.why)
    return await send(*again, may_retry=False)


def _sender(request: web.Request, state: ProxyState, headers: Any, streaming: bool,
            recall: RecallSession | None = None) -> Send:
    """A single upstream call that relays the answer, or reports an overflow it did not relay.
    With a `recall` session, the recall layer: the model's recall calls are answered inside the
    answer, whole or streamed (design 13.3)."""
    url = upstream_url(state.cfg.upstream.base_url, request, CHAT.upstream_path)
    headers["Content-Type"] = "application/json"
    timeout = client_timeout(state.cfg.upstream, streaming=streaming)
    ex = request[EXCHANGE]
    first_call = True

    async def send(data: bytes, extra: dict[str, str], *, may_retry: bool = False,
                   not_an_overflow: str | None = None) -> Any:
        nonlocal first_call
        first, first_call = first_call, False
        t0 = time.perf_counter()
        try:
            async with state.session.post(url, data=data, headers=headers, timeout=timeout, allow_redirects=False) as upstream:
                ex.upstream_ttfb_s = time.perf_counter() - t0
                if may_retry and upstream.status in (400, 413, 422):
                    # Nothing has gone to the client yet: an overflow can still be compacted and retried.
                    err_body = await upstream.read()
                    rejected = web.Response(status=upstream.status, body=err_body,
                                            headers={**_passthrough_headers(upstream), **extra})
                    if CHAT.is_overflow(upstream.status, err_body):
                        return Overflow(rejected, "upstream rejected the request for length")
                    return rejected
                if not _checkable_stream(upstream):
                    resp = await relay_completion(request, upstream, extra)
                    if recall is not None and resp.status == 200 and isinstance(resp, web.Response):
                        body = await offload.sized(len(data), orjson.loads, data)
                        resp = await recall_chat.answer_whole(state.session, url, headers, timeout, resp, recall, body)
                    ex.upstream_s = time.perf_counter() - t0
                    if resp.status == 200 and isinstance(resp, web.Response):
                        ex.usage = CHAT.usage(resp.body)
                    return resp
                # Headers wait for the first bytes: until then an empty stream can still be retried.
                chunk = await upstream.content.readany()
                ex.upstream_ttfb_s = time.perf_counter() - t0
                if chunk and recall is not None:
                    body = await offload.sized(len(data), orjson.loads, data)
                    post = lambda b: state.session.post(url, data=jsonbody.dumps(b), headers=headers,  # noqa: E731
                                                        timeout=timeout, allow_redirects=False)
                    result = await recall_stream.relay(request, upstream, chunk, extra, body, post, recall, state.hooks)
                    ex.upstream_s = time.perf_counter() - t0
                    ex.usage = Usage.from_openai(result.usage)
                    return result.response
                if chunk:
                    checker = CHAT.event_checker()
                    resp = await relay_events(request, upstream, extra, chunk, checker)
                    ex.upstream_s = time.perf_counter() - t0
                    ex.usage = CHAT.stream_usage(checker)
                    return resp
                # llama.cpp answers a prompt over its window with 200 and an empty event stream; also
                # a request it rejects for other reasons, which no compaction can fix.
                if first and not_an_overflow is not None:
                    log.warning("upstream sent an empty event stream for a request well under its window")
                    return errors.upstream_bad_response(not_an_overflow).response(extra)
                empty = errors.upstream_bad_response(EMPTY_STREAM).response(extra)
                return Overflow(empty, "upstream sent an empty event stream") if may_retry else empty
        except UPSTREAM_ERRORS as e:
            err = map_client_error(e)
            log.warning("upstream request failed after %.0f ms: %s", (time.perf_counter() - t0) * 1000, err.message)
            return err.response(extra)

    return send


# -- the rest of the request -------------------------------------------------------------------
def _learn_ratio(state: ProxyState, parsed: Request, after: int, resp: web.StreamResponse, usage: Any) -> None:
    """The upstream's prompt count of what we forwarded, against ours (spec 9.5). Only for the
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


def _needs_compaction(state: ProxyState, model: str, tokens: int) -> bool:
    return state.cfg.compaction.enabled and tokens > state.compaction.budget_for(model).threshold


def _log_content(body: dict[str, Any]) -> None:
    """Only with server.log_content on: message content is the client's data, not ours to log."""
    messages = body["messages"]
    i = latest_user_index(messages)
    latest = clip_hint(message_text(messages[i]), CONTENT_LOG_CHARS, CONTENT_LOG_CHARS) if i is not None else ""
    log.info("chat %s: %d messages; latest user message: %s", body["model"], len(messages), latest)


_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


async def _bypass(request: web.Request, state: ProxyState, raw: bytes, up_headers: Any) -> web.StreamResponse:
    """x-compaction-bypass: the body goes upstream as it came, valid or not; the counts are the
    proxy's when it can make them, else 0."""
    ex = request[EXCHANGE]
    try:
        parsed = await offload.sized(len(raw), CHAT.parse, raw, state.counter, state.cfg)
        tokens, streaming = parsed.total(), parsed.stream
        ex.model, ex.stream = parsed.model, streaming
        api_key = state.cfg.upstream.api_key.get_secret_value() if state.cfg.upstream.api_key else None
        scope = credentials.resolve(request.headers, state.scope_secret, api_key, CHAT.credential_headers).scope
        ex.conversation = conversation_digest(scope or "", parsed.first_digest())
        ex.prefix = Prefix(parsed.keys, list(parsed.conversation.tokens), parsed.tools_tokens)  # billed: direct and proxied alike
    except Exception:  # not ours to judge: the upstream answers it
        tokens, streaming = 0, _STREAM_TRUE.search(raw) is not None
    send = _sender(request, state, up_headers, streaming)
    return await _answer(await send(raw, _headers("bypassed", tokens, tokens)))


def _checkable_stream(upstream: aiohttp.ClientResponse) -> bool:
    """A successful, uncompressed event stream: one we can read event by event."""
    return upstream.status == 200 and is_event_stream(upstream) and not upstream.headers.get("content-encoding")


def _passthrough_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return dict(client_response_headers(upstream.headers))
