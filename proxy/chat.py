"""POST /v1/chat/completions: parse, shrink tool results, compact history, forward, relay.

When the proxy changes nothing, the client's original bytes go upstream. Whatever happens, the
client gets the upstream's answer or an OpenAI-shaped error, with the x-compaction-* headers.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import aiohttp
from aiohttp import web

from proxy import credentials, errors, jsonbody, offload
from proxy.chat_request import (
    Conversation,
    analyze,
    keys_of,
    latest_user_index,
    message_text,
    parse_chat_body,
)
from proxy.compaction.budget import could_overflow
from proxy.compaction.engine import Outcome, RequestContext
from proxy.forward import (
    UPSTREAM_ERRORS,
    BodyPace,
    EventChecker,
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
from proxy.recall import chat as recall_chat
from proxy.recall import chat_stream as recall_stream
from proxy.recall.session import RecallSession
from proxy.ops.events import compaction_event, completion_usage, is_event
from proxy.ops.exchange import EXCHANGE, Exchange, Prefix, Usage
from proxy.state import STATE, ProxyState
from proxy.text import clip_hint
from proxy.toolresults.stage import StageResult
from proxy.tokens import encoding_name_for
from proxy.upstream import is_context_overflow

log = logging.getLogger("proxy.chat")

CONTENT_LOG_CHARS = 200  # head and tail of the latest user message logged with server.log_content
EMPTY_STREAM = "the event stream ended before its first event (llama.cpp does this for a prompt over its context window)"
EMPTY_STREAM_SMALL = ("the upstream ended the event stream without sending an event; the request ({tokens} tokens) is "
                      "well under the model's {window}-token window, so it was not retried compacted (llama.cpp does "
                      "this for a request it rejects, such as a message it cannot template)")


def _headers(status: str, before: int, after: int, tool_results: int, wait_ms: float) -> dict[str, str]:
    return {
        "x-compaction-status": status,
        "x-compaction-tokens-before": str(before),
        "x-compaction-tokens-after": str(after),
        "x-compaction-tool-results": str(tool_results),
        "x-compaction-wait-ms": str(int(round(wait_ms))),
    }


async def handle_chat(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    ex = request[EXCHANGE]
    raw = await read_body(request, state.max_body, BodyPace.of(cfg.server))
    api_key = cfg.upstream.api_key.get_secret_value() if cfg.upstream.api_key else None
    up_headers = upstream_request_headers(request.headers, api_key, identity_encoding=True)
    if request.headers.get("x-compaction-bypass", "").strip().lower() in ("1", "true", "yes"):
        return await _bypass(request, state, raw, up_headers)
    # Parsing, keying and counting grow with the body: off the event loop when it is large.
    body, conv = await offload.sized(len(raw), read_chat_request, raw, state.counter, cfg)
    if cfg.compaction.learn_token_ratio and state.ratios is not None:
        conv.ratio = await state.ratios.ratio(conv.model, conv.ratio)  # learned from the upstream's usage
    streaming = bool(body.get("stream"))
    ex.model, ex.stream = body["model"], streaming
    before = conv.total()
    creds = credentials.resolve(request.headers, state.scope_secret, api_key)
    # The conversation's name for the journal and the bill (anonymous requests share one scope there).
    ex.conversation = conversation_digest(creds.scope or "", conv.first_digest())
    ex.prefix = Prefix(conv.keys, list(conv.tokens), conv.tools_tokens)  # the original's, for the bill

    if cfg.server.log_content:
        _log_content(body)
    if creds.scope is None:
        # No credential, no configured key, no session id: any other such client could be served
        # this one's records, so none are kept or read for it.
        _warn_anonymous()
        status = "failed-open" if _needs_compaction(state, conv.model, before) else "none"
        return await _forward(request, state, raw, up_headers, streaming, _headers(status, before, before, 0, 0))
    ctx = RequestContext(
        upstream_headers=creds.headers,
        scope=creds.scope,
        focus=request.headers.get("x-compaction-focus") or None,
        conversation=ex.conversation,
        recall=state.recall is not None,
    )

    try:
        stage, outcome, messages = await shrink(state, conv, ctx)
        out_raw = raw if messages is conv.messages else await offload.sized(len(raw), _dump, body, messages)
    except Exception:
        # A bug in our own stages must never cost the client its request: forward what it sent.
        log.exception("shrinking the request failed unexpectedly; forwarding it unchanged")
        status = "failed-open" if _needs_compaction(state, conv.model, before) else "none"
        if status != "none":
            state.hooks.compaction(compaction_event(ex, ctx.scope, conv, Outcome(status, reason="internal error"), before, before))
        return await _forward(request, state, raw, up_headers, streaming, _headers(status, before, before, 0, 0))
    after = outcome.tokens_after if outcome.tokens_after is not None else conv.total()
    wait = stage.wait_ms + outcome.wait_ms
    headers = _headers(outcome.status, before, after, stage.summarized, wait)
    if is_event(ex, outcome):
        state.hooks.compaction(compaction_event(ex, ctx.scope, conv, outcome, before, after))

    recall = None
    if state.recall is not None:
        recall = await recall_chat.prepare(state.recall, state.prompts, ctx.scope, conv.messages, messages,
                                           conv.n_system, body, conv.encoding)
        if recall is not None:
            body = recall[1]
            out_raw = await offload.sized(len(raw), _dump, body, messages)
            # the declaration is part of what goes upstream: counted like the client's tools
            if outcome.tokens_after is None:  # a compacted request's count has the declaration already
                after += conv.scaled(state.counter.count_tools(body["tools"], conv.encoding) - conv.tools_tokens)
                headers["x-compaction-tokens-after"] = str(after)
            headers["x-compaction-recalls"] = "0"
    retry = None
    if cfg.compaction.enabled:
        retry = _overflow_retry(state, conv, stage.messages, ctx, body, before, stage.summarized, wait, ex)
    log.debug("chat %s: %s, %d -> %d tokens, %d tool results summarized", conv.model, outcome.status, before, after,
              stage.summarized)
    window = state.compaction.budget_for(conv.model).window
    small = None if could_overflow(after, window) else EMPTY_STREAM_SMALL.format(tokens=after, window=window)
    resp = await _forward(request, state, out_raw, up_headers, streaming, headers, retry, not_an_overflow=small,
                          recall=recall)
    if recall is not None and recall[0].rounds:
        state.hooks.recall_rounds(recall[0].rounds)
        log.info("chat %s: %s", conv.model, recall[0].summary())
    _learn_ratio(state, conv, after, resp, ex.usage)
    return resp


def _learn_ratio(state: ProxyState, conv: Conversation, after: int, resp: web.StreamResponse, usage: Any) -> None:
    """The upstream's prompt count of what we forwarded, against ours (spec 9.5). Only for the
    request as planned: an overflow retry forwarded something else."""
    if (not state.cfg.compaction.learn_token_ratio or state.ratios is None or usage is None
            or resp.status != 200 or resp.headers.get("x-compaction-tokens-after") != str(after)):
        return
    state.ratios.observe(conv.model, round(after / conv.ratio), usage.prompt)


_anonymous_warned = False


def _warn_anonymous() -> None:
    global _anonymous_warned
    if not _anonymous_warned:
        _anonymous_warned = True
        log.warning("a request with no credential and no x-compaction-session is forwarded uncompacted "
                    "(set upstream.api_key, or send a credential or an x-compaction-session id)")


async def shrink(state: ProxyState, conv: Conversation, ctx: RequestContext) -> tuple[StageResult, Outcome, list[Any]]:
    """The request's stages: tool results to notes, then the history. Returns the tool-result
    stage's result, the compaction's outcome and the messages to forward (conv.messages itself
    when nothing changed). `compaction-proxy inspect` runs this too, with a dry-run caller."""
    before = conv.total()
    stage = await state.tool_results.process(conv, ctx.upstream_headers, ctx.scope, recall=ctx.recall)
    outcome = Outcome("none")
    if state.cfg.compaction.enabled:
        outcome = not_larger(await state.compaction.process(conv, stage.messages, ctx), before)
    return stage, outcome, outcome.messages or stage.messages


def _needs_compaction(state: ProxyState, model: str, tokens: int) -> bool:
    return state.cfg.compaction.enabled and tokens > state.compaction.budget_for(model).threshold


def _log_content(body: dict[str, Any]) -> None:
    """Only with server.log_content on: message content is the client's data, not ours to log."""
    messages = body["messages"]
    i = latest_user_index(messages)
    latest = clip_hint(message_text(messages[i]), CONTENT_LOG_CHARS, CONTENT_LOG_CHARS) if i is not None else ""
    log.info("chat %s: %d messages; latest user message: %s", body["model"], len(messages), latest)


def _dump(body: dict[str, Any], messages: list[dict[str, Any]]) -> bytes:
    out = dict(body)
    out["messages"] = messages
    return jsonbody.dumps(out)


def read_chat_request(raw: bytes, counter: Any, cfg: Any) -> tuple[dict[str, Any], Conversation]:
    """The body parsed and checked, and its conversation keyed and counted (pure; may run in a
    worker thread)."""
    body = parse_chat_body(raw)
    model_cfg = cfg.model_settings(body["model"])
    encoding = model_cfg.encoding or encoding_name_for(body["model"])
    keys, _ = keys_of(body["messages"])
    return body, analyze(body, counter, encoding=encoding, ratio=model_cfg.token_ratio, keys=keys)


def not_larger(outcome: Outcome, before: int) -> Outcome:
    """A compacted request that is not smaller than the original is no compaction: the original
    goes upstream (its newest turn alone can be over the window), and the status says so."""
    if outcome.messages is None or outcome.tokens_after is None or outcome.tokens_after < before:
        return outcome
    return Outcome("failed-open", wait_ms=outcome.wait_ms,
                   reason=f"the compacted request ({outcome.tokens_after} tokens) is not smaller than the original ({before})")


_STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')


async def _bypass(request: web.Request, state: ProxyState, raw: bytes, up_headers: Any) -> web.StreamResponse:
    """x-compaction-bypass: the body goes upstream as it came, valid or not; the counts are the
    proxy's when it can make them, else 0."""
    ex = request[EXCHANGE]
    try:
        body, conv = await offload.sized(len(raw), read_chat_request, raw, state.counter, state.cfg)
        tokens, streaming = conv.total(), bool(body.get("stream"))
        ex.model, ex.stream = body["model"], streaming
        api_key = state.cfg.upstream.api_key.get_secret_value() if state.cfg.upstream.api_key else None
        scope = credentials.resolve(request.headers, state.scope_secret, api_key).scope
        ex.conversation = conversation_digest(scope or "", conv.first_digest())
        ex.prefix = Prefix(conv.keys, list(conv.tokens), conv.tools_tokens)  # billed: direct and proxied alike
    except Exception:  # not ours to judge: the upstream answers it
        tokens, streaming = 0, _STREAM_TRUE.search(raw) is not None
    return await _forward(request, state, raw, up_headers, streaming, _headers("bypassed", tokens, tokens, 0, 0))


def _overflow_retry(state: ProxyState, conv: Conversation, fwd: list[dict[str, Any]], ctx: RequestContext,
                    body: dict[str, Any], before: int, tool_results: int, wait_ms: float, ex: Exchange) -> Any:
    """What to do once when the upstream says the forwarded request was too long for its window."""

    async def retry() -> tuple[bytes, dict[str, str]] | None:
        budget = state.compaction.budget_for(conv.model).halved()
        outcome = not_larger(await state.compaction.process(conv, fwd, ctx, budget=budget), before)
        if outcome.messages is None:
            return None
        if is_event(ex, outcome):
            state.hooks.compaction(compaction_event(ex, ctx.scope, conv, outcome, before, outcome.tokens_after or before))
        dumped = await offload.sized(sum(conv.tokens) * 4, _dump, body, outcome.messages)
        return dumped, _headers(
            outcome.status, before, outcome.tokens_after or before, tool_results, wait_ms + outcome.wait_ms
        )

    return retry


async def _forward(
    request: web.Request,
    state: ProxyState,
    data: bytes,
    headers: Any,
    streaming: bool,
    extra: dict[str, str],
    retry: Any = None,
    not_an_overflow: str | None = None,
    recall: tuple[RecallSession, dict[str, Any]] | None = None,
) -> web.StreamResponse:
    """Send the request upstream and relay the answer. `retry` compacts it once more after an
    overflow; `not_an_overflow`, when set, is why an empty stream cannot be one (the 502's text)."""
    url = upstream_url(state.cfg.upstream.base_url, request, "/chat/completions")
    headers["Content-Type"] = "application/json"
    timeout = client_timeout(state.cfg.upstream, streaming=streaming)
    ex = request[EXCHANGE]
    for attempt in range(2):
        can_retry = attempt == 0 and retry is not None
        t0 = time.perf_counter()
        try:
            async with state.session.post(
                url, data=data, headers=headers, timeout=timeout, allow_redirects=False
            ) as upstream:
                ex.upstream_ttfb_s = time.perf_counter() - t0
                if can_retry and upstream.status in (400, 413, 422):
                    # Nothing has gone to the client yet: an overflow can still be compacted and retried.
                    err_body = await upstream.read()
                    if is_context_overflow(upstream.status, err_body):
                        again = await _compacted(retry)
                        if again is not None:
                            data, extra = again
                            log.info("upstream rejected the request for length; retrying compacted")
                            continue
                    return web.Response(
                        status=upstream.status,
                        body=err_body,
                        headers={**_passthrough_headers(upstream), **extra},
                    )
                if not _checkable_stream(upstream):
                    resp = await relay_completion(request, upstream, extra)
                    if recall is not None and resp.status == 200 and isinstance(resp, web.Response):
                        resp = await recall_chat.answer_whole(state.session, url, headers, timeout, resp, *recall)
                    ex.upstream_s = time.perf_counter() - t0
                    if resp.status == 200 and isinstance(resp, web.Response):
                        ex.usage = completion_usage(resp.body)
                    return resp
                # Headers wait for the first bytes: until then an empty stream can still be retried.
                first = await upstream.content.readany()
                ex.upstream_ttfb_s = time.perf_counter() - t0
                if first and recall is not None:
                    post = lambda b: state.session.post(url, data=jsonbody.dumps(b), headers=headers,  # noqa: E731
                                                        timeout=timeout, allow_redirects=False)
                    result = await recall_stream.relay(request, upstream, first, extra, recall[1], post, recall[0])
                    ex.upstream_s = time.perf_counter() - t0
                    ex.usage = Usage.from_openai(result.usage)
                    return result.response
                if first:
                    checker = EventChecker()
                    resp = await relay_events(request, upstream, extra, first, checker)
                    ex.upstream_s = time.perf_counter() - t0
                    ex.usage = Usage.from_openai(checker.usage)
                    return resp
                # llama.cpp answers a prompt over its window with 200 and an empty event stream; also
                # a request it rejects for other reasons, which no compaction can fix.
                if attempt == 0 and not_an_overflow is not None:
                    log.warning("upstream sent an empty event stream for a request well under its window")
                    return errors.upstream_bad_response(not_an_overflow).response(extra)
                again = await _compacted(retry) if can_retry else None
                if again is None:
                    return errors.upstream_bad_response(EMPTY_STREAM).response(extra)
                data, extra = again
                log.info("upstream sent an empty event stream; retrying compacted")
        except UPSTREAM_ERRORS as e:
            err = map_client_error(e)
            log.warning("upstream request failed after %.0f ms: %s", (time.perf_counter() - t0) * 1000, err.message)
            return err.response(extra)
    raise AssertionError("unreachable")


async def _compacted(retry: Any) -> tuple[bytes, dict[str, str]] | None:
    """The overflow retry's compacted request, or None; a bug in it leaves the upstream's answer."""
    try:
        return await retry()
    except Exception:
        log.exception("compacting for the overflow retry failed unexpectedly")
        return None


def _checkable_stream(upstream: aiohttp.ClientResponse) -> bool:
    """A successful, uncompressed event stream: one we can read event by event."""
    return upstream.status == 200 and is_event_stream(upstream) and not upstream.headers.get("content-encoding")


def _passthrough_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return dict(client_response_headers(upstream.headers))
