"""POST /v1/responses (and each WebSocket `response.create`): the chat path's flow and stages for
the Responses API (spec 10, 11).

A request: body decoded (zstd, gzip ...) and checked; the proxy's own compaction items expanded
into their summary messages; a stateful request (`previous_response_id`, `conversation`) forwarded
as it is; otherwise parsed by the Responses adapter (proxy/adapters/responses.py) into a Flow whose
stages make tool outputs notes, then, unless the client asked for native compaction
(`context_management`), the history a stored summary. Nothing changed: the client's bytes go upstream. The upstream's
overflow (HTTP 400 `context_length_exceeded`, or a stream failing with it before any output) is
compacted with half the budget and retried once, before anything reached the client.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy import credentials, jsonbody, offload
from proxy.adapters.responses import ResponsesAdapter
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
from proxy.recall import relay as recall_relay
from proxy.recall.responses import RESPONSES as RECALL
from proxy.recall.responses_stream import Rounds as RecallRounds
from proxy.recall.session import RecallSession
from proxy.ops.exchange import EXCHANGE
from proxy.responses import compact
from proxy.responses.body import parse_responses_body
from proxy.responses.items import stateful
from proxy.responses.stream import ResponsesEventChecker, answer_usage, read_preamble, responses_usage
from proxy.state import STATE, ProxyState
from proxy.upstream import is_context_overflow

log = logging.getLogger("proxy.responses")
BYPASS = ("1", "true", "yes")
ADAPTER = ResponsesAdapter()


def _headers(status: str, before: int, after: int, tool_results: int = 0, wait_ms: float = 0) -> dict[str, str]:
    return Report(before, status=status, tokens_after=after, tool_results=tool_results, wait_ms=wait_ms).headers()


@dataclass
class Prepared:
    """One request after the stages: what to forward, its headers, and how to retry it."""

    data: bytes
    body: dict[str, Any]
    headers: dict[str, str]
    stream: bool
    retry: Any = None  # async () -> (bytes, headers) | None: compacted harder after an overflow
    recall: RecallSession | None = None  # the recall tool is declared and answered here (design 13)


async def prepare(state: ProxyState, raw: bytes, body: dict[str, Any], incoming: Any, ex: Any, *,
                  recall: bool = True) -> Prepared:
    """The stages for one Responses body (HTTP or a socket's response.create). `recall`: the
    route answers the recall tool (a WebSocket turn does not: no handles are written for it)."""
    cfg = state.cfg
    api_key = cfg.upstream.api_key.get_secret_value() if cfg.upstream.api_key else None
    creds = credentials.resolve(incoming, state.scope_secret, api_key)
    items = body.get("input") if isinstance(body.get("input"), list) else None
    if items is not None and compact.has_own(items):
        body = {**body, "input": await compact.expand(items, state.store, state.scope_secret, creds.scope, state.prompts)}
        raw = jsonbody.dumps(body)
    streaming = bool(body.get("stream"))
    ex.model, ex.stream = body["model"], streaming
    if stateful(body) is not None:
        # The history lives at the upstream: the proxy cannot see it, and changes nothing.
        return Prepared(raw, body, _headers("none", 0, 0, 0, 0), streaming)
    parsed = await offload.sized(len(raw), ADAPTER.request_of, raw, body, state.counter, cfg)
    before = parsed.total()
    ex.conversation = conversation_digest(creds.scope or "", parsed.first_digest())
    if creds.scope is None:
        # No credential, no configured key, no session id: any other such client could be served
        # this one's records, so none are kept or read for it (as on the chat path).
        over = cfg.compaction.enabled and before > state.compaction.budget_for(parsed.model).threshold
        return Prepared(raw, body, _headers("failed-open" if over else "none", before, before, 0, 0), streaming)
    flow = Flow.of(ADAPTER, parsed, Identity(creds.scope, creds.headers, incoming.get("x-compaction-focus") or None,
                                          ex.conversation, **recall_answers.identity_fields(RECALL, state, parsed, on=recall)))
    try:
        await run_request(state.stages, flow)
        session = await recall_answers.prepare_flow(RECALL, state.recall, state.prompts, flow) \
            if flow.identity.recall else None
        data = flow.body()
    except Exception:
        # A bug in our own stages (or a message the view cannot map back) must never cost the
        # client its request: forward what it sent.
        log.exception("shrinking the Responses request failed unexpectedly; forwarding it unchanged")
        return Prepared(raw, body, _headers("none", before, before, 0, 0), streaming)
    if flow.report.tokens_after is None:
        flow.report.tokens_after = flow.total()

    async def retry() -> tuple[bytes, dict[str, str]] | None:
        if not await run_overflow(state.stages, flow):
            return None
        return flow.body(), flow.report.headers()

    headers = flow.report.headers()
    if session is not None:
        headers["x-compaction-recalls"] = "0"
    return Prepared(data, body, headers, streaming, retry, session)


async def handle_responses(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    ex = request[EXCHANGE]
    raw = await read_body(request, state.max_body, BodyPace.of(cfg.server))
    api_key = cfg.upstream.api_key.get_secret_value() if cfg.upstream.api_key else None
    up_headers = upstream_request_headers(request.headers, api_key, identity_encoding=True)
    if request.headers.get("x-compaction-bypass", "").strip().lower() in BYPASS:
        return await _forward(request, state, raw, up_headers, b'"stream":true' in raw.replace(b" ", b""),
                              _headers("bypassed", 0, 0, 0, 0))
    body = await offload.sized(len(raw), parse_responses_body, raw)
    p = await prepare(state, raw, body, request.headers, ex)
    resp = await _forward(request, state, p.data, up_headers, p.stream, p.headers, p.retry, p.recall)
    recall_answers.finished(state.hooks, "responses", body["model"], p.recall)
    return resp


async def _forward(request: web.Request, state: ProxyState, data: bytes, headers: Any, streaming: bool,
                   extra: dict[str, str], retry: Any = None, recall: RecallSession | None = None) -> web.StreamResponse:
    """Send upstream and relay; after an overflow (HTTP, or a stream's before any output) once
    more, compacted by `retry`. With a `recall` session, the model's recall calls are answered
    inside the answer, whole or streamed (design 13.3)."""
    url = upstream_url(state.cfg.upstream.base_url, request, "/responses")
    headers["Content-Type"] = "application/json"
    timeout = client_timeout(state.cfg.upstream, streaming=streaming)
    ex = request[EXCHANGE]
    for attempt in range(2):
        can_retry = attempt == 0 and retry is not None
        t0 = time.perf_counter()
        try:
            async with state.session.post(url, data=data, headers=headers, timeout=timeout,
                                          allow_redirects=False) as upstream:
                ex.upstream_ttfb_s = time.perf_counter() - t0
                if upstream.status != 200 or not is_event_stream(upstream) or upstream.headers.get("content-encoding"):
                    if can_retry and upstream.status in (400, 413, 422):
                        err_body = await upstream.read()
                        if is_context_overflow(upstream.status, err_body):
                            again = await _compacted(retry)
                            if again is not None:
                                data, extra = again
                                log.info("upstream rejected the Responses request for length; retrying compacted")
                                continue
                        return web.Response(status=upstream.status, body=err_body,
                                            headers={**client_response_headers(upstream.headers), **extra})
                    resp = await relay_completion(request, upstream, extra)
                    if recall is not None and resp.status == 200 and isinstance(resp, web.Response):
                        resp = await recall_answers.answer_whole(RECALL, state.session, url, headers, timeout, resp,
                                                                 recall, await offload.sized(len(data), orjson.loads, data))
                    ex.upstream_s = time.perf_counter() - t0
                    if resp.status == 200 and isinstance(resp, web.Response):
                        ex.usage = answer_usage(resp.body)
                    return resp
                held, seen = await read_preamble(upstream)
                if seen.overflow and can_retry:
                    again = await _compacted(retry)
                    if again is not None:
                        data, extra = again
                        log.info("upstream failed the Responses stream for length; retrying compacted")
                        continue
                if recall is not None and held:
                    sent = await offload.sized(len(data), orjson.loads, data)
                    post = lambda b: state.session.post(url, data=jsonbody.dumps(b), headers=headers,  # noqa: E731
                                                        timeout=timeout, allow_redirects=False)
                    result = await recall_relay.relay(request, upstream, held, extra, sent, post, recall,
                                                      RecallRounds(recall.name), ResponsesEventChecker, state.hooks)
                    ex.upstream_s = time.perf_counter() - t0
                    ex.usage = responses_usage(result.usage)
                    return result.response
                checker = ResponsesEventChecker()
                resp = await relay_events(request, upstream, extra, held, checker)
                ex.upstream_s = time.perf_counter() - t0
                ex.usage = responses_usage(checker.usage)
                return resp
        except UPSTREAM_ERRORS as e:
            err = map_client_error(e)
            log.warning("upstream Responses request failed: %s", err.message)
            return err.response(extra)
    raise AssertionError("unreachable")


async def _compacted(retry: Any) -> tuple[bytes, dict[str, str]] | None:
    try:
        return await retry()
    except Exception:
        log.exception("compacting for the overflow retry failed unexpectedly")
        return None
