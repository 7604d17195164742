"""Moving bytes between client and upstream: header filtering, pass-through, response relay.
(The request body's reading is proxy/body.py; the event streams' checks, proxy/sse.py.)

Pass-through routes are relayed without looking inside: an SSE stream chunk by chunk (never
coalesced, never held back), anything else streamed when large. Chat completion answers are
checked on the way (`relay_completion`, `relay_events`): an answer that is not what OpenAI's API
sends becomes an OpenAI-shaped error, so clients raise an APIError instead of a decoding error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.config import secret
from proxy import errors
from proxy.body import BodyPace, LimitedBody, read_raw_body
from proxy.credentials import configured_credential, sent_credentials
from proxy.sse import EventChecker, Read

log = logging.getLogger("proxy.forward")

# RFC 9110 7.6.1 hop-by-hop headers, plus those aiohttp recomputes for the new connection, and
# Expect: the proxy answered the client's 100-continue and holds the whole body; passed on, it has
# aiohttp's client wait for a 100 Continue that an upstream need not send.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "expect",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
PROXY_HEADER_PREFIX = "x-compaction-"
SMALL_BODY = 1 << 20  # bodies up to this size are read whole; larger ones are streamed


class AsSentRequest(aiohttp.ClientRequest):
    """aiohttp's client request, but one without a body goes without a `Content-Length: 0` of its
    own (aiohttp adds one to a bodiless DELETE or POST): a request is framed as the client framed
    it (pass-through sends `b""` for a client's own `Content-Length: 0`)."""

    def update_body_from_data(self, body: Any, *args: Any, **kw: Any) -> None:
        added = body is None and "Content-Length" not in self.headers
        super().update_body_from_data(body, *args, **kw)
        if added:
            self.headers.popall("Content-Length", None)


def wants_bypass(headers: Any) -> bool:
    """The client asked that this request go upstream as it came (`x-compaction-bypass`)."""
    return headers.get("x-compaction-bypass", "").strip().lower() in ("1", "true", "yes")


def upstream_request_headers(
    incoming: Any, api_key: str | None, *, identity_encoding: bool = False, key_header: str = "Authorization",
    raw_body: bool = False,
) -> CIMultiDict[str]:
    """Client headers minus hop-by-hop and our own; the configured key (as `key_header`:
    Authorization, or Anthropic's x-api-key) when the client sent no credential of any kind
    (`api-key` and `x-api-key` count). Content-Encoding stays only with `raw_body` (the client's
    bytes forwarded as they came): a route that reads the body forwards it decoded (`read_body`)."""
    connection_listed = {
        t.strip().lower() for v in incoming.getall("connection", []) for t in v.split(",") if t.strip()
    }
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in incoming.items():
        low = name.lower()
        if low in HOP_BY_HOP or low in connection_listed or low.startswith(PROXY_HEADER_PREFIX):
            continue
        if identity_encoding and low == "accept-encoding":
            continue
        if not raw_body and low == "content-encoding":
            continue
        out.add(name, value)
    if api_key and not sent_credentials(out):
        out.update(configured_credential(api_key, key_header))
    if identity_encoding:
        # We may need to read this response (errors, retries): keep it uncompressed.
        out["Accept-Encoding"] = "identity"
    return out


def client_response_headers(upstream: Any) -> CIMultiDict[str]:
    """The upstream's answer headers minus hop-by-hop ones and those its Connection header lists,
    in their order. Copied whole and then removed from: a copy in C and a dozen deletes cost a
    small answer half (an upstream's twenty-odd headers a quarter) of a Python loop over them."""
    out: CIMultiDict[str] = CIMultiDict(upstream)
    for name in HOP_BY_HOP:
        if name in out:
            del out[name]  # (every header of that name, whatever its case)
    if "connection" in upstream:
        for v in upstream.getall("connection"):
            for t in v.split(","):
                t = t.strip()
                if t and t in out:
                    del out[t]
    return out


def is_event_stream(resp: aiohttp.ClientResponse) -> bool:
    return resp.headers.get("content-type", "").lower().startswith("text/event-stream")


_TIMEOUTS: dict[tuple[bool, float, float], aiohttp.ClientTimeout] = {}
_CACHED = 64  # distinct timeouts kept (a config has a handful; a reloaded one adds its own)


def client_timeout(cfg: Any, *, streaming: bool) -> aiohttp.ClientTimeout:
    """Whole-request limit for plain calls; an idle-read limit for streams (they may run long).
    Made once per distinct value (ClientTimeout is immutable; making one costs every request)."""
    key = (streaming, cfg.connect_timeout_s, cfg.stream_idle_timeout_s if streaming else cfg.timeout_s)
    timeout = _TIMEOUTS.get(key)
    if timeout is None:
        if streaming:
            timeout = aiohttp.ClientTimeout(total=None, connect=key[1], sock_read=key[2])
        else:
            timeout = aiohttp.ClientTimeout(total=key[2], connect=key[1])
        if len(_TIMEOUTS) >= _CACHED:
            _TIMEOUTS.clear()
        _TIMEOUTS[key] = timeout
    return timeout


def map_client_error(e: BaseException) -> errors.ProxyError:
    """An aiohttp/asyncio failure talking to the upstream, as the 502/504 the client gets."""
    if isinstance(e, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return errors.upstream_timeout("no response within the configured timeout")
    if isinstance(e, aiohttp.ClientConnectorError):
        # The operator's first question is which address failed and why (a wrong base_url, a
        # server that is down, no DNS); the host and port are config, never a credential.
        return errors.upstream_unreachable(f"cannot connect to {e.host}:{e.port} ({_connect_reason(e.os_error)})")
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return errors.upstream_unreachable("the upstream closed the connection")
    if isinstance(e, aiohttp.ClientPayloadError):
        return errors.upstream_bad_response("the response body was cut off")
    if isinstance(e, aiohttp.ClientResponseError):
        return errors.upstream_bad_response(e.message)
    return errors.upstream_unreachable(e.__class__.__name__)


def _connect_reason(err: OSError) -> str:
    if isinstance(err, socket.gaierror):
        return "the host name did not resolve"
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"
    if isinstance(err, ssl.SSLError):
        return f"TLS failed: {err.reason or err.__class__.__name__}"
    return err.strerror or err.__class__.__name__


UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
CLIENT_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)  # writing to a departed client


_URLS: dict[tuple[str, str], URL] = {}


def upstream_url(base_url: str, request: web.Request, raw_tail: str) -> URL:
    """base_url + the path tail, with the client's query string, both exactly as the client encoded
    them: decoding and re-encoding would change `%2F`, `%20` or `+` (and thus the request). A
    route's URL without a query is made once (URL is immutable; parsing one costs every request)."""
    query = request.rel_url.raw_query_string
    if query:
        return URL(f"{base_url}{raw_tail}?{query}", encoded=True)
    url = _URLS.get((base_url, raw_tail))
    if url is None:
        url = URL(base_url + raw_tail, encoded=True)
        if len(_URLS) >= _CACHED:  # (pass-through tails are the client's: bounded)
            _URLS.clear()
        _URLS[(base_url, raw_tail)] = url
    return url


async def relay(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    extra_headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Send the upstream's response to the client: status, headers, body as it arrives."""
    headers = client_response_headers(upstream.headers)
    if extra_headers:
        headers.update(extra_headers)
    length = upstream.content_length
    streaming = is_event_stream(upstream) or length is None or length > SMALL_BODY
    if not streaming:
        try:
            body = await upstream.read()
        except UPSTREAM_ERRORS as e:
            return map_client_error(e).response(extra_headers)
        return web.Response(status=upstream.status, body=body, headers=headers)

    resp = web.StreamResponse(status=upstream.status, headers=headers)
    if length is not None and not upstream.headers.get("content-encoding"):
        resp.content_length = length
    await resp.prepare(request)
    sse = is_event_stream(upstream)
    try:
        async for chunk in upstream.content.iter_any():
            await resp.write(chunk)
    except CLIENT_GONE:
        # The client went away: stop reading; leaving the context closes the upstream request.
        upstream.close()
        return resp
    except UPSTREAM_ERRORS as e:
        upstream.close()
        err = map_client_error(e)
        log.warning("upstream stream ended abnormally: %s", err.message)
        if sse:
            if not await _write_error_event(resp, err):
                return resp
        else:
            # A cut body must look cut to the client, not complete: drop the connection.
            if request.transport is not None:
                request.transport.abort()
            return resp
    try:
        await resp.write_eof()
    except CLIENT_GONE:
        pass
    return resp


async def _write_error_event(resp: web.StreamResponse, err: errors.ProxyError, checker: "EventChecker | None" = None) -> bool:
    """End a stream with an `error` event in the protocol's shape (the SDKs raise an APIError on
    it, so the client learns why), as the stream's checker writes it when known. False when the
    client is gone already."""
    try:
        await resp.write(checker.error_event(err) if checker is not None else err.event())
    except CLIENT_GONE:
        return False
    return True


NOT_PARSED: Any = object()  # relay_completion did not look inside the answer


async def relay_completion(
    request: web.Request, upstream: aiohttp.ClientResponse, extra_headers: dict[str, str]
) -> tuple[web.StreamResponse, Any]:
    """A chat completion answer that is not an event stream, read whole (such answers are small),
    and its JSON as the check parsed it (NOT_PARSED when it did not: not a JSON 200), so that its
    usage is read without a second parse.

    A 200 whose JSON does not parse is not the upstream's error but a broken answer: the client
    gets a 502 it can retry, not a body its SDK fails to decode.
    """
    if upstream.headers.get("content-encoding"):
        # we asked for identity; cannot look inside
        return await relay(request, upstream, extra_headers), NOT_PARSED
    try:
        body = await upstream.read()
    except UPSTREAM_ERRORS as e:
        return map_client_error(e).response(extra_headers), NOT_PARSED
    answer = NOT_PARSED
    if upstream.status == 200 and _is_json(upstream):
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            log.warning("upstream answered 200 with malformed JSON (%d bytes)", len(body))
            return errors.upstream_bad_response("the JSON body is malformed").response(extra_headers), NOT_PARSED
    headers = client_response_headers(upstream.headers)
    headers.update(extra_headers)
    return web.Response(status=upstream.status, body=body, headers=headers), answer


def _is_json(resp: aiohttp.ClientResponse) -> bool:
    return resp.headers.get("content-type", "").lower().startswith("application/json")


DRAIN_S = 1.0  # after [DONE], how long we wait for the upstream's end of stream


class _BrokenStream(Exception):
    """The upstream's event stream is not what OpenAI sends."""


async def relay_events(
    request: web.Request, upstream: aiohttp.ClientResponse, extra_headers: dict[str, str], first: bytes,
    checker: EventChecker | None = None, read: Read | None = None,
) -> web.StreamResponse:
    """A chat completion event stream whose first bytes (`first`) were read already. A broken event
    or a cut stream ends the client's stream with an `error` event instead of garbage. `checker`
    (a new one by default) is left with what it saw (the usage); `read`: the checker that read
    `first` already while it was held back, and what it said (they are not checked again)."""
    headers = client_response_headers(upstream.headers)
    headers.update(extra_headers)
    resp = web.StreamResponse(status=upstream.status, headers=headers)
    chunk = first
    if read is not None:
        checker, good, why = read
    else:
        checker = checker or EventChecker()
        good, why = checker.feed(chunk) if chunk else (b"", None)
    if good:
        # The first events are in hand: the headers go out in the same write as they do, one send
        # instead of two (aiohttp's switch, as its web.Response sets it; unknown to a later aiohttp,
        # it would only send them first again).
        resp._send_headers_immediately = False
    await resp.prepare(request)
    try:
        if good:
            await resp.write(good)
        if why is not None:
            raise _BrokenStream(why)
        if chunk:
            # The events after the first ones relayed by a task of their own, this one waiting for
            # its end: each event's read resumes that task's frame alone, not every frame between
            # aiohttp's handler task and here (the middleware, the route, the pipeline, the send
            # layers; docs/performance.md). The first events go out before it starts: a new task's
            # first step waits a loop iteration. Cancelling this task
            # cancels the one it waits for; what that one raises comes out here.
            await asyncio.get_running_loop().create_task(_relay_rest(resp, upstream, checker))
        good, why = checker.finish()
        if good:
            await resp.write(good)
        if why is not None:
            raise _BrokenStream(why)
        await resp.write_eof()
    except CLIENT_GONE:
        if checker.done:
            # The openai SDKs hang up right after [DONE]: a normal end. Read the upstream's last
            # bytes so its connection goes back to the pool instead of being cut.
            with contextlib.suppress(*UPSTREAM_ERRORS):
                await asyncio.wait_for(upstream.content.read(), DRAIN_S)
        if not upstream.content.at_eof():
            upstream.close()  # stop reading; leaving the caller's context closes the upstream request
    except (_BrokenStream, *UPSTREAM_ERRORS) as e:
        upstream.close()
        err = errors.upstream_bad_response(str(e)) if isinstance(e, _BrokenStream) else map_client_error(e)
        log.warning("upstream stream ended abnormally: %s", err.message)
        if await _write_error_event(resp, err, checker):
            try:
                await resp.write_eof()
            except CLIENT_GONE:
                pass
    return resp


async def _relay_rest(resp: web.StreamResponse, upstream: aiohttp.ClientResponse, checker: EventChecker) -> None:
    """relay_events' loop after the first events: each chunk checked and written, up to the end."""
    while chunk := await upstream.content.readany():
        good, why = checker.feed(chunk)
        if good:
            await resp.write(good)
        if why is not None:
            raise _BrokenStream(why)


def _has_dot_segment(path: str) -> bool:
    """On the decoded path, so that percent-encoded dots and slashes count too."""
    return any(seg in (".", "..") for seg in path.split("/"))


async def passthrough(
    request: web.Request, session: aiohttp.ClientSession, cfg: Any, max_body: int, pace: BodyPace,
    *, base_path: str = "/v1", key_header: str = "Authorization",
) -> web.StreamResponse:
    """Any other /v1/ route: same method, path, query and body, streamed both ways. `base_path`:
    the part of the client's path that `cfg.base_url` already ends with (Anthropic's has none);
    `key_header` carries `cfg.api_key`."""
    if _has_dot_segment(request.path):
        # Forwarded raw, `/v1/../x` (or `%2e%2e`, `..%2f`) would reach upstream paths outside the
        # configured base URL once the upstream normalizes it; no OpenAI route has such segments.
        raise errors.bad_request("The request path must not contain '.' or '..' segments.", code="invalid_path")
    length = request.content_length
    if length is not None and length > max_body:
        raise errors.body_too_large(max_body)
    streamed: LimitedBody | None = None
    data: Any
    if not request.body_exists:
        data = b"" if length == 0 else None  # (a Content-Length: 0 goes on; none is added)
    elif length is not None and length <= SMALL_BODY:
        data = await read_raw_body(request, max_body, pace)
    else:
        streamed = LimitedBody(request, max_body, pace)
        data = streamed.chunks()
    url = upstream_url(cfg.base_url, request, request.rel_url.raw_path[len(base_path):])
    headers = upstream_request_headers(
        request.headers, secret(cfg.api_key), key_header=key_header,
        raw_body=True,
    )
    if streamed is not None and length is not None:
        # A streamed body of known size keeps its Content-Length: some upstreams refuse chunked uploads.
        headers["Content-Length"] = str(length)
    try:
        async with session.request(
            request.method,
            url,
            data=data,
            headers=headers,
            timeout=client_timeout(cfg, streaming=True),
            allow_redirects=False,
        ) as upstream:
            return await relay(request, upstream)
    except UPSTREAM_ERRORS as e:
        if streamed is not None and streamed.error is not None:
            raise streamed.error from None
        raise map_client_error(e) from None
