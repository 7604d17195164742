"""One upstream call for every route, whatever the protocol, in layers (in the manner of httpx's
`send`): the adapter says what an overflow looks like (an error answer, or a stream's first
events), how its events are checked and what its usage says.

    send            the attempts: a first, and at most one more
    _send_single    one upstream call, its answer read as one of the three below
    _refused        an answer that may say "too long": the stale-reasoning mend (Messages'
                    signed thinking a changed prefix made stale) or the overflow retry (the
                    stages compacting harder: `overflow_retry`) makes the next attempt
    _relay_whole    a whole answer relayed, its recall calls answered first
    _relay_stream   a stream's first events held while they may still say "too long", then
                    relayed, through the recall rounds (`_recall_rounds`) when the tool is
                    answered here (docs/design.md § Recall)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, NamedTuple, Sequence

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy import errors, jsonbody, offload
from proxy.adapter import Adapter
from proxy.flow import Flow, Stage, run_overflow
from proxy.body import upstream_body
from proxy.forward import (
    NOT_PARSED,
    UPSTREAM_ERRORS,
    client_response_headers,
    client_timeout,
    is_event_stream,
    map_client_error,
    relay_completion,
    relay_events,
    upstream_url,
)
from proxy.ops import tracing
from proxy.exchange import CURRENT, EXCHANGE
from proxy.recall import answers as recall_answers
from proxy.recall import relay as recall_relay
from proxy.recall.session import RecallSession

log = logging.getLogger("proxy.send")

OVERFLOW_STATUSES = (400, 413, 422)  # an answer that may say the request was too long

# After an overflow: the body to send instead and its x-compaction-* headers, or None.
Retry = Callable[[], Awaitable["tuple[bytes, dict[str, str]] | None"]]


class Upstream(NamedTuple):
    """Where a request goes: the URL, the headers sent along and the timeouts. (A named tuple:
    immutable as a frozen dataclass, whose fields each cost an object.__setattr__ call.)"""

    url: URL
    headers: CIMultiDict[str]
    timeout: aiohttp.ClientTimeout

    @classmethod
    def of(cls, request: web.Request, section: Any, path: str, headers: CIMultiDict[str], streaming: bool) -> "Upstream":
        """`section`: the config's upstream (base_url and timeouts) for this route."""
        headers["Content-Type"] = "application/json"
        return cls(upstream_url(section.base_url, request, path), headers,
                   client_timeout(section, streaming=streaming))


@dataclass(frozen=True)
class Answering:
    """The recall tool answered in this request's answer: its session, and its protocol's dialect
    and stream filter (proxy/recall)."""

    session: RecallSession
    dialect: Any
    rounds: Callable[[str], recall_relay.Rounds]
    # after a stream that answered recall rounds or dropped recall calls: what the protocol keeps of
    # them (its filter given)
    streamed: Callable[[Any], Awaitable[None]] | None = None
    # after a whole answer that left recall calls out (session.unanswered): the answer's bytes given
    whole: Callable[[bytes], Awaitable[None]] | None = None


def overflow_retry(stages: Sequence[Stage], flow: Flow, recall: Any = None, prefixes: Any = None) -> Retry:
    """The stages make the request smaller (once), or say they cannot (None). `recall` (the recall
    layer, when on): the originals the harder compaction replaced are kept before the retried
    request goes, so a lookup in its answer finds the handles its summary names. `prefixes` (the
    prefix-break alarm) learns what the retried request forwards."""

    async def retry() -> tuple[bytes, dict[str, str]] | None:
        if not await run_overflow(stages, flow):
            return None
        if recall is not None:
            await recall_answers.keep_retried(recall, flow)
        if prefixes is not None:
            prefixes.forwarded(CURRENT.get(), flow)
        return await offload.sized(len(flow.request.raw), flow.body), flow.report.headers()

    return retry


@dataclass
class Attempt:
    """One upstream call of a request: the body, its headers for the client, where it goes, and
    what may follow it (a first attempt may be retried compacted or mended; a second is final)."""

    data: bytes
    extra: dict[str, str]
    up: Upstream
    first: bool = True


@dataclass(frozen=True)
class Layers:
    """What wraps the single send: `retry` the overflow layer, `mend_reasoning` the stale-reasoning
    mend, `recall` the recall rounds; `not_an_overflow` makes the error for an empty stream when the
    request cannot be over its window (so no retry, and a stream's first events are not held to see
    whether they say it was); made only then (it names the counts: formatting them cost every
    request ~2k instructions)."""

    retry: Retry | None = None
    recall: Answering | None = None
    hooks: Any = None
    not_an_overflow: Callable[[], str] | None = None
    mend_reasoning: bool = False


async def send(request: web.Request, http: aiohttp.ClientSession, adapter: Adapter, up: Upstream, data: bytes,
               extra: dict[str, str], *, retry: Retry | None = None, recall: Answering | None = None,
               hooks: Any = None, not_an_overflow: Callable[[], str] | None = None,
               mend_reasoning: bool = False) -> web.StreamResponse:
    """Forward `data`, relay the answer with `extra` headers; a first attempt that the upstream
    refused for length (or for reasoning the proxy made stale) is followed by one more.
    `mend_reasoning`: the proxy changed this body or an earlier one of the conversation."""
    ex = request[EXCHANGE]
    if ex.span is not None:  # traced: the upstream continues the proxy's span, not the client's
        ex.tracing.inject(ex, up.headers)
    layers = Layers(retry, recall, hooks, not_an_overflow, mend_reasoning)
    attempt: Attempt | web.StreamResponse = Attempt(data, extra, up)
    while isinstance(attempt, Attempt):
        attempt = await _send_single(request, http, adapter, attempt, layers)
    return attempt


async def _send_single(request: web.Request, http: aiohttp.ClientSession, adapter: Adapter, a: Attempt,
                       layers: Layers) -> "web.StreamResponse | Attempt":
    """One upstream call: its answer relayed, or the next attempt (nothing has gone to the client)."""
    ex = request[EXCHANGE]
    can_retry = a.first and layers.retry is not None
    t0 = time.perf_counter()
    try:
        async with http.post(a.up.url, data=upstream_body(a.data), headers=a.up.headers, timeout=a.up.timeout,
                             allow_redirects=False) as upstream:
            ex.upstream_ttfb_s = time.perf_counter() - t0
            if a.first and (can_retry or layers.mend_reasoning) and upstream.status in OVERFLOW_STATUSES:
                return await _refused(ex, adapter, a, upstream, layers)
            if not _checkable_stream(upstream):
                return await _relay_whole(request, http, adapter, a, upstream, layers, t0)
            return await _relay_stream(request, http, adapter, a, upstream, layers, t0)
    except UPSTREAM_ERRORS as e:
        err = map_client_error(e)
        log.warning("upstream %s request failed after %.0f ms: %s", adapter.protocol,
                    (time.perf_counter() - t0) * 1000, err.message)
        return err.response(a.extra)


async def _refused(ex: Any, adapter: Adapter, a: Attempt, upstream: aiohttp.ClientResponse,
                   layers: Layers) -> "web.StreamResponse | Attempt":
    """An answer that may say the request was too long (or carried stale reasoning): the mend
    layer, then the overflow layer, may make the next attempt; else the error goes to the client."""
    err_body = await upstream.read()
    if layers.mend_reasoning and (mended := adapter.without_stale_reasoning(upstream.status, err_body, a.data,
                                                                           a.up.headers)):
        data, set_headers = mended
        headers = a.up.headers.copy()
        headers.update(set_headers)
        log.warning("upstream refused thinking that compaction made stale (model %s); sent again "
                    "asking it to leave the stale blocks out", ex.model)
        if layers.hooks is not None:
            layers.hooks.stale_reasoning(adapter.protocol)
        return Attempt(data, a.extra, a.up._replace(headers=headers), first=False)
    if layers.retry is not None and adapter.is_overflow(upstream.status, err_body) and (
            again := await _compacted(layers.retry)):
        log.info("upstream rejected the request for length; retrying compacted")
        return Attempt(again[0], again[1], a.up, first=False)
    return web.Response(status=upstream.status, body=err_body,
                        headers={**client_response_headers(upstream.headers), **a.extra})


async def _relay_whole(request: web.Request, http: aiohttp.ClientSession, adapter: Adapter, a: Attempt,
                       upstream: aiohttp.ClientResponse, layers: Layers, t0: float) -> web.StreamResponse:
    """A whole answer relayed (or an error, or a stream we do not read), the recall calls in a
    successful one answered first; its usage noted."""
    ex = request[EXCHANGE]
    resp, answer = await relay_completion(request, upstream, a.extra)
    recall = layers.recall
    if recall is not None and resp.status == 200 and isinstance(resp, web.Response):
        answer = NOT_PARSED  # the recall layer may answer with other bytes
        resp = await recall_answers.answer_whole(
            recall.dialect, http, a.up.url, a.up.headers, a.up.timeout, resp, recall.session,
            recall_answers.parsed_later(a.data))
        if recall.whole is not None and recall.session.unanswered and isinstance(resp, web.Response):
            await recall.whole(bytes(resp.body))
    ex.upstream_s = time.perf_counter() - t0
    if answer is not NOT_PARSED:
        ex.usage = adapter.answer_usage(answer)
    elif resp.status == 200 and isinstance(resp, web.Response) and resp.body is not None:
        ex.usage = adapter.usage(resp.body)
    return resp


async def _relay_stream(request: web.Request, http: aiohttp.ClientSession, adapter: Adapter, a: Attempt,
                        upstream: aiohttp.ClientResponse, layers: Layers,
                        t0: float) -> "web.StreamResponse | Attempt":
    """An event stream: its first events held while they may still say the request was too long
    (an overflow retried as the next attempt), then relayed, through the recall rounds when the
    tool is answered here."""
    ex = request[EXCHANGE]
    can_retry = a.first and layers.retry is not None
    held, overflow, read = await adapter.stream_preamble(upstream, hold=can_retry and layers.not_an_overflow is None)
    ex.upstream_ttfb_s = time.perf_counter() - t0
    if not held and a.first and layers.not_an_overflow is not None:
        log.warning("upstream sent an empty event stream for a request well under its window")
        return errors.upstream_bad_response(layers.not_an_overflow()).response(a.extra)
    # (llama.cpp answers a prompt over its window with 200 and an empty event stream)
    why = "the stream failed for length" if overflow else \
        "upstream sent an empty event stream" if not held and adapter.empty_stream_overflows else None
    if why is not None and can_retry and (again := await _compacted(layers.retry)):
        log.info("%s; retrying compacted", why)
        return Attempt(again[0], again[1], a.up, first=False)
    if not held:
        return errors.upstream_bad_response(adapter.empty_stream).response(a.extra)
    if layers.recall is not None:
        return await _recall_rounds(request, http, adapter, a, upstream, held, layers, t0)
    # (the checker that held the first events back goes on: they are not checked twice)
    checker = read.checker if read is not None else adapter.event_checker()
    resp = await relay_events(request, upstream, a.extra, held, checker, read)
    ex.upstream_s = time.perf_counter() - t0
    ex.usage = adapter.stream_usage(checker)
    return resp


async def _recall_rounds(request: web.Request, http: aiohttp.ClientSession, adapter: Adapter, a: Attempt,
                         upstream: aiohttp.ClientResponse, held: Any, layers: Layers,
                         t0: float) -> web.StreamResponse:
    """A stream relayed through the recall layer: rounds of lookups answered here."""
    ex, recall, up = request[EXCHANGE], layers.recall, a.up
    assert recall is not None
    sent = recall_answers.parsed_later(a.data)
    post = lambda b: _round(ex, http.post(up.url, data=jsonbody.dumps(b),  # noqa: E731
                                          headers=up.headers, timeout=up.timeout, allow_redirects=False))
    rounds = recall.rounds(recall.session.name)
    result = await recall_relay.relay(request, upstream, held, a.extra, sent, post, recall.session,
                                      rounds, adapter.event_checker, layers.hooks)
    if recall.streamed is not None and (recall.session.rounds or rounds.dropped):
        await recall.streamed(rounds)
    ex.upstream_s = time.perf_counter() - t0
    ex.usage = adapter.stream_usage(result)
    return result.response


async def _round(ex: Any, call: Any) -> Any:
    """One more upstream round to answer recall calls, to its answer's headers (a child span when
    traced)."""
    with tracing.child(ex, "recall round", **{"gen_ai.operation.name": tracing.OPERATION}):
        return await call


async def _compacted(retry: Retry | None) -> tuple[bytes, dict[str, str]] | None:
    """The overflow retry's request, or None; a bug in it leaves the upstream's answer."""
    try:
        return await retry() if retry is not None else None
    except Exception:
        log.exception("compacting for the overflow retry failed unexpectedly")
        return None


def _checkable_stream(upstream: aiohttp.ClientResponse) -> bool:
    """A successful, uncompressed event stream: one we can read event by event."""
    return upstream.status == 200 and is_event_stream(upstream) and not upstream.headers.get("content-encoding")
