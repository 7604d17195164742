"""POST /v1/chat/completions: parse, shrink tool results, compact history, forward, relay.

When the proxy changes nothing, the client's original bytes go upstream. Whatever happens, the
client gets the upstream's answer or an OpenAI-shaped error, with the x-compaction-* headers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy import errors
from proxy.chat_request import Conversation, analyze, parse_chat_body
from proxy.compaction.engine import Outcome, RequestContext
from proxy.forward import (
    UPSTREAM_ERRORS,
    client_response_headers,
    client_timeout,
    map_client_error,
    relay,
    upstream_request_headers,
    upstream_url,
)
from proxy.hashing import credential_scope
from proxy.state import STATE, ProxyState
from proxy.upstream import is_context_overflow

log = logging.getLogger("proxy.chat")

BIG_BODY = 512 * 1024  # above this, token counting runs off the event loop


async def read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise errors.body_too_large(limit)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise errors.body_too_large(limit) from None


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
    raw = await read_body(request, state.max_body)
    body = parse_chat_body(raw)
    streaming = bool(body.get("stream"))
    api_key = cfg.upstream.api_key.get_secret_value() if cfg.upstream.api_key else None
    up_headers = upstream_request_headers(request.headers, api_key, identity_encoding=True)
    model_cfg = cfg.model_settings(body["model"])

    if len(raw) > BIG_BODY:
        conv = await asyncio.to_thread(analyze, body, state.counter, encoding=model_cfg.encoding, ratio=model_cfg.token_ratio)
    else:
        conv = analyze(body, state.counter, encoding=model_cfg.encoding, ratio=model_cfg.token_ratio)
    before = conv.total()

    if request.headers.get("x-compaction-bypass", "").strip().lower() in ("1", "true", "yes"):
        return await _forward(request, state, raw, up_headers, streaming, _headers("bypassed", before, before, 0, 0))

    credential = request.headers.get("authorization") or (f"Bearer {api_key}" if api_key else "")
    ctx = RequestContext(
        upstream_headers={"Authorization": up_headers["Authorization"]} if "Authorization" in up_headers else {},
        scope=credential_scope(state.scope_secret, credential, request.headers.get("x-compaction-session")),
        focus=request.headers.get("x-compaction-focus") or None,
    )

    stage = await state.tool_results.process(conv, ctx.upstream_headers, ctx.scope)
    outcome = Outcome("none")
    if cfg.compaction.enabled:
        outcome = await state.compaction.process(conv, stage.messages, ctx)
    messages = outcome.messages or stage.messages
    after = outcome.tokens_after if outcome.tokens_after is not None else conv.total()
    wait = stage.wait_ms + outcome.wait_ms
    out_raw = raw if messages is conv.messages else _dump(body, messages)
    headers = _headers(outcome.status, before, after, stage.summarized, wait)

    retry = None
    if cfg.compaction.enabled:
        retry = _overflow_retry(state, conv, stage.messages, ctx, body, before, stage.summarized, wait)
    return await _forward(request, state, out_raw, up_headers, streaming, headers, retry)


def _dump(body: dict[str, Any], messages: list[dict[str, Any]]) -> bytes:
    out = dict(body)
    out["messages"] = messages
    return orjson.dumps(out)


def _overflow_retry(state: ProxyState, conv: Conversation, fwd: list[dict[str, Any]], ctx: RequestContext,
                    body: dict[str, Any], before: int, tool_results: int, wait_ms: float) -> Any:
    """What to do once when the upstream says the forwarded request was too long for its window."""

    async def retry() -> tuple[bytes, dict[str, str]] | None:
        budget = state.compaction.budget_for(conv.model).halved()
        outcome = await state.compaction.process(conv, fwd, ctx, budget=budget)
        if outcome.messages is None:
            return None
        return _dump(body, outcome.messages), _headers(
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
) -> web.StreamResponse:
    url = upstream_url(state.cfg.upstream.base_url, request, "/chat/completions")
    headers["Content-Type"] = "application/json"
    timeout = client_timeout(state.cfg.upstream, streaming=streaming)
    for attempt in range(2):
        t0 = time.perf_counter()
        try:
            async with state.session.post(
                url, data=data, headers=headers, timeout=timeout, allow_redirects=False
            ) as upstream:
                if attempt == 0 and retry is not None and upstream.status in (400, 413, 422):
                    # Nothing has gone to the client yet: an overflow can still be compacted and retried.
                    try:
                        err_body = await upstream.read()
                    except UPSTREAM_ERRORS as e:
                        raise map_client_error(e) from None
                    if is_context_overflow(upstream.status, err_body):
                        again = await retry()
                        if again is not None:
                            data, extra = again
                            log.info("upstream rejected the request for length; retrying compacted")
                            continue
                    return web.Response(
                        status=upstream.status,
                        body=err_body,
                        headers={**_passthrough_headers(upstream), **extra},
                    )
                return await relay(request, upstream, extra)
        except UPSTREAM_ERRORS as e:
            err = map_client_error(e)
            log.warning("upstream request failed after %.0f ms: %s", (time.perf_counter() - t0) * 1000, err.message)
            return err.response(extra)
    raise AssertionError("unreachable")


def _passthrough_headers(upstream: aiohttp.ClientResponse) -> dict[str, str]:
    return dict(client_response_headers(upstream.headers))
