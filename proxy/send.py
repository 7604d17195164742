"""One upstream call for every route, layered (design.md § One request, one flow), whatever the protocol: the adapter says
what an overflow looks like (an error answer, or a stream's first events), how its events are
checked and what its usage says.

`send` forwards a body and relays the answer with its checks (a JSON answer must parse, a stream
must be whole and valid; what is not becomes an error in the route's shape). Around that single
call, the overflow layer: when the upstream says the request was too long before anything went
to the client, `retry` (the stages compacting harder: `overflow_retry`) makes a smaller body and
it is sent once more. Around the relay, the recall layer when the route answers the recall tool
(design.md § Recall): the model's recall calls are answered inside the answer, whole or streamed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, NamedTuple, Sequence

import aiohttp
import orjson
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
from proxy.ops.exchange import CURRENT, EXCHANGE
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


async def send(request: web.Request, http: aiohttp.ClientSession, adapter: Adapter, up: Upstream, data: bytes,
               extra: dict[str, str], *, retry: Retry | None = None, recall: Answering | None = None,
               hooks: Any = None, not_an_overflow: Callable[[], str] | None = None,
               mend_reasoning: bool = False) -> web.StreamResponse:
    """Forward `data`, relay the answer with `extra` headers. `not_an_overflow`: makes the error for
    an empty stream when the request cannot be over the window (so no retry, and a stream's first
    events are not held to see whether they say it was); made only then (it names the counts:
    formatting them cost every request ~2k instructions). `mend_reasoning`: the proxy changed
    this body or an earlier one of the conversation, so a refusal of reasoning made stale by that
    change is the proxy's to mend (once)."""
    ex = request[EXCHANGE]
    if ex.span is not None:  # traced: the upstream continues the proxy's span, not the client's
        ex.tracing.inject(ex, up.headers)
    for attempt in range(2):
        can_retry = attempt == 0 and retry is not None
        t0 = time.perf_counter()
        try:
            async with http.post(up.url, data=upstream_body(data), headers=up.headers, timeout=up.timeout,
                                 allow_redirects=False) as upstream:
                ex.upstream_ttfb_s = time.perf_counter() - t0
                if attempt == 0 and (retry is not None or mend_reasoning) and upstream.status in OVERFLOW_STATUSES:
                    # Nothing has gone to the client yet: an overflow can still be compacted and retried.
                    err_body = await upstream.read()
                    if mend_reasoning and (mended := adapter.without_stale_reasoning(upstream.status, err_body, data,
                                                                                up.headers)):
                        data, set_headers = mended
                        headers = up.headers.copy()
                        headers.update(set_headers)
                        up = up._replace(headers=headers)
                        log.warning("upstream refused thinking that compaction made stale (model %s); sent again "
                                    "asking it to leave the stale blocks out", ex.model)
                        if hooks is not None:
                            hooks.stale_reasoning(adapter.protocol)
                        continue
                    if can_retry and adapter.is_overflow(upstream.status, err_body) and (
                            again := await _compacted(retry)):
                        data, extra = again
                        log.info("upstream rejected the request for length; retrying compacted")
                        continue
                    return web.Response(status=upstream.status, body=err_body,
                                        headers={**client_response_headers(upstream.headers), **extra})
                if not _checkable_stream(upstream):
                    resp, answer = await relay_completion(request, upstream, extra)
                    if recall is not None and resp.status == 200 and isinstance(resp, web.Response):
                        answer = NOT_PARSED  # the recall layer may answer with other bytes
                        resp = await recall_answers.answer_whole(
                            recall.dialect, http, up.url, up.headers, up.timeout, resp, recall.session,
                            await offload.sized(len(data), orjson.loads, data))
                        if recall.whole is not None and recall.session.unanswered and isinstance(resp, web.Response):
                            await recall.whole(bytes(resp.body))
                    ex.upstream_s = time.perf_counter() - t0
                    if answer is not NOT_PARSED:
                        ex.usage = adapter.answer_usage(answer)
                    elif resp.status == 200 and isinstance(resp, web.Response) and resp.body is not None:
                        ex.usage = adapter.usage(resp.body)
                    return resp
                # Headers wait for the first events: until then an overflow can still be retried
                # (held for that only when a retry can follow).
                held, overflow = await adapter.stream_preamble(upstream, hold=can_retry and not_an_overflow is None)
                ex.upstream_ttfb_s = time.perf_counter() - t0
                if not held and attempt == 0 and not_an_overflow is not None:
                    log.warning("upstream sent an empty event stream for a request well under its window")
                    return errors.upstream_bad_response(not_an_overflow()).response(extra)
                # (llama.cpp answers a prompt over its window with 200 and an empty event stream)
                why = "the stream failed for length" if overflow else \
                    "upstream sent an empty event stream" if not held and adapter.empty_stream_overflows else None
                if why is not None and can_retry and (again := await _compacted(retry)):
                    data, extra = again
                    log.info("%s; retrying compacted", why)
                    continue
                if not held:
                    return errors.upstream_bad_response(adapter.empty_stream).response(extra)
                if recall is not None:
                    sent = await offload.sized(len(data), orjson.loads, data)
                    post = lambda b: _round(ex, http.post(up.url, data=jsonbody.dumps(b),  # noqa: E731
                                                          headers=up.headers, timeout=up.timeout,
                                                          allow_redirects=False))
                    rounds = recall.rounds(recall.session.name)
                    result = await recall_relay.relay(request, upstream, held, extra, sent, post, recall.session,
                                                      rounds, adapter.event_checker, hooks)
                    if recall.streamed is not None and (recall.session.rounds or rounds.dropped):
                        await recall.streamed(rounds)
                    ex.upstream_s = time.perf_counter() - t0
                    ex.usage = adapter.stream_usage(result)
                    return result.response
                checker = adapter.event_checker()
                resp = await relay_events(request, upstream, extra, held, checker)
                ex.upstream_s = time.perf_counter() - t0
                ex.usage = adapter.stream_usage(checker)
                return resp
        except UPSTREAM_ERRORS as e:
            err = map_client_error(e)
            log.warning("upstream %s request failed after %.0f ms: %s", adapter.protocol,
                        (time.perf_counter() - t0) * 1000, err.message)
            return err.response(extra)
    raise AssertionError("unreachable")


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
