"""Sending a Messages request to `anthropic.base_url` and relaying the answer with its checks: a
JSON answer must parse, a stream must be Anthropic's SSE to its message_stop (stream.py); what is
not becomes an Anthropic-shaped error (the route set the error shape). Once, before any byte went
to the client, an overflow ("prompt is too long") can be retried compacted (`retry`)."""

from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict

from proxy import errors, jsonbody
from proxy.adapters.messages.overflow import is_prompt_too_long
from proxy.adapters.messages.stream import MessagesEventChecker, messages_usage
from proxy.forward import (
    UPSTREAM_ERRORS,
    client_response_headers,
    client_timeout,
    is_event_stream,
    map_client_error,
    relay_completion,
    relay_events,
    upstream_request_headers,
    upstream_url,
)
from proxy.ops.exchange import EXCHANGE
from proxy.recall import answers as recall_answers
from proxy.recall import relay as recall_relay
from proxy.recall.messages import MESSAGES as RECALL
from proxy.recall.messages_stream import Rounds as RecallRounds

log = logging.getLogger("proxy.messages")

CREDENTIAL_HEADERS = ("x-api-key", "authorization")  # either one feeds the scope HMAC
EMPTY_STREAM = "the event stream ended before its first event"

# What to send instead after an overflow: (body bytes, x-compaction-* headers), or None.
Retry = Callable[[], Awaitable["tuple[bytes, dict[str, str]] | None"]]


def upstream_headers(request: web.Request, cfg: Any) -> CIMultiDict[str]:
    """The client's headers (anthropic-version and anthropic-beta as sent), identity encoding so
    the answer can be checked, `anthropic.api_key` as x-api-key when the client sent no key."""
    key = cfg.anthropic.api_key.get_secret_value() if cfg.anthropic.api_key else None
    return upstream_request_headers(request.headers, key, identity_encoding=True, key_header="x-api-key")


async def forward_messages(request: web.Request, session: aiohttp.ClientSession, cfg: Any, path: str, data: bytes,
                           headers: CIMultiDict[str], streaming: bool, extra: dict[str, str],
                           retry: Retry | None = None, recall: Any = None, hooks: Any = None) -> web.StreamResponse:
    """`recall` (a RecallSession): the model's recall calls are answered inside the answer, whole
    or streamed (design 13.3)."""
    url = upstream_url(cfg.anthropic.base_url, request, path)
    headers["Content-Type"] = "application/json"
    timeout = client_timeout(cfg.anthropic, streaming=streaming)
    ex = request[EXCHANGE]
    for attempt in range(2):
        t0 = time.perf_counter()
        try:
            async with session.post(url, data=data, headers=headers, timeout=timeout,
                                    allow_redirects=False) as upstream:
                ex.upstream_ttfb_s = time.perf_counter() - t0
                if attempt == 0 and retry is not None and upstream.status == 400:
                    err_body = await upstream.read()
                    if is_prompt_too_long(upstream.status, err_body):
                        again = await _compacted(retry)
                        if again is not None:
                            data, extra = again
                            log.info("upstream rejected the request for length; retrying compacted")
                            continue
                    return web.Response(status=upstream.status, body=err_body,
                                        headers={**client_response_headers(upstream.headers), **extra})
                if not (upstream.status == 200 and is_event_stream(upstream)
                        and not upstream.headers.get("content-encoding")):
                    resp = await relay_completion(request, upstream, extra)
                    if recall is not None and resp.status == 200 and isinstance(resp, web.Response):
                        resp = await recall_answers.answer_whole(RECALL, session, url, headers, timeout, resp, recall,
                                                                 orjson.loads(data))
                    ex.upstream_s = time.perf_counter() - t0
                    if resp.status == 200 and isinstance(resp, web.Response) and resp.body is not None:
                        ex.usage = messages_usage(_usage_of(resp.body))
                    return resp
                first = await upstream.content.readany()
                ex.upstream_ttfb_s = time.perf_counter() - t0
                if not first:
                    return errors.upstream_bad_response(EMPTY_STREAM).response(extra)
                if recall is not None:
                    post = lambda b: session.post(url, data=jsonbody.dumps(b), headers=headers,  # noqa: E731
                                                  timeout=timeout, allow_redirects=False)
                    result = await recall_relay.relay(request, upstream, first, extra, orjson.loads(data), post, recall,
                                                      RecallRounds(recall.name), MessagesEventChecker, hooks)
                    ex.upstream_s = time.perf_counter() - t0
                    ex.usage = messages_usage(result.usage)
                    return result.response
                checker = MessagesEventChecker()
                resp = await relay_events(request, upstream, extra, first, checker)
                ex.upstream_s = time.perf_counter() - t0
                ex.usage = messages_usage(checker.usage)
                return resp
        except UPSTREAM_ERRORS as e:
            err = map_client_error(e)
            log.warning("upstream request failed after %.0f ms: %s", (time.perf_counter() - t0) * 1000, err.message)
            return err.response(extra)
    raise AssertionError("unreachable")


async def _compacted(retry: Retry) -> tuple[bytes, dict[str, str]] | None:
    """The overflow retry's request, or None; a bug in it leaves the upstream's answer."""
    try:
        return await retry()
    except Exception:
        log.exception("compacting for the overflow retry failed unexpectedly")
        return None


def _usage_of(body: Any) -> Any:
    try:
        return orjson.loads(bytes(body)).get("usage")
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return None
