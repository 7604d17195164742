"""The Gemini routes (design.md § Gemini API): `POST /{v1,v1beta,v1alpha}/models/{model}:{method}`.
generateContent and streamGenerateContent are compacted, countTokens counts what would be
forwarded now; every other method, and every other /v1beta or /v1alpha path, is passed through to
`gemini.base_url` as it came. A `models/...:method` path is Gemini whatever its version prefix
(google-genai sends /v1 by default). The credential comes as `x-goog-api-key` or the `key` query
parameter: both are forwarded as they came and scope the records alike; the proxy's own calls
carry it as the header (never in a URL the proxy writes). Errors the proxy makes here are in
Google's shape."""

from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable

from aiohttp import web
from multidict import CIMultiDict

from proxy import credentials, errors, offload
from proxy.adapter import Request
from proxy.body import BodyPace, read_body
from proxy.byheaders import Caller
from proxy.compaction.stage import journal_fault
from proxy.flow import Flow, Identity, Report, run_request
from proxy.forward import passthrough, upstream_request_headers
from proxy.hashing import conversation_digest
from proxy.ops import reasons
from proxy.ops.exchange import EXCHANGE
from proxy.protocols.gemini.adapter import GEMINI
from proxy.protocols.gemini.errors import GOOGLE
from proxy.send import Upstream, overflow_retry, send
from proxy.state import STATE
from proxy.watch import observed

log = logging.getLogger("proxy.gemini")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
KEY_HEADER = "x-goog-api-key"
# One route per version: aiohttp finds a route by its path's literal prefix first, so each
# `/<version>/models` prefix must be literal to win over that version's pass-through.
VERSIONS = ("v1", "v1beta", "v1alpha")
MODEL_PATHS = tuple(f"/{v}/models/{{target:[^/:]+:[A-Za-z]+}}" for v in VERSIONS)
COMPACTED = ("generateContent", "streamGenerateContent")


def gemini_route(handler: Handler) -> Handler:
    """Every error made while handling this request takes Google's shape."""

    @functools.wraps(handler)
    async def wrapped(request: web.Request) -> web.StreamResponse:
        errors.SHAPE.set(GOOGLE)  # this request's task only
        return await handler(request)

    return wrapped


@gemini_route
async def handle_gemini_passthrough(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    return await passthrough(request, state.session, state.cfg.gemini, state.max_body, BodyPace.of(state.cfg.server),
                             base_path="")


CODE_ASSIST_PATH = "/v1internal{tail:[:/].*}"


@gemini_route
async def handle_code_assist(request: web.Request) -> web.StreamResponse:
    """Code Assist (Gemini CLI signed in with Google: `/v1internal:generateContent` and the rest,
    an OAuth bearer token), relayed as it came to `gemini.code_assist_base_url`; not compacted."""
    state = request.app[STATE]
    section = state.cfg.gemini
    upstream = section.model_copy(update={"base_url": section.code_assist_base_url})
    return await passthrough(request, state.session, upstream, state.max_body, BodyPace.of(state.cfg.server),
                             base_path="")


def caller_of(request: web.Request, state: Any) -> Caller:
    """The credential from x-goog-api-key, Authorization, or `?key=` (read as x-goog-api-key, so a
    key scopes the same records however it came); the client's headers go upstream unchanged."""
    headers = request.headers
    key = request.query.get("key")
    if key and KEY_HEADER not in headers:
        headers = CIMultiDict(headers)
        headers[KEY_HEADER] = key
    creds = credentials.resolve(headers, state.scope_secret, None, GEMINI.credential_headers, key_header=KEY_HEADER)
    return Caller.of(headers, creds, upstream_request_headers(request.headers, None, identity_encoding=True))


def _model_and_method(request: web.Request) -> tuple[str, str]:
    model, _, method = request.match_info["target"].rpartition(":")
    return model, method


@gemini_route
async def handle_model_call(request: web.Request) -> web.StreamResponse:
    """generateContent / streamGenerateContent compacted; countTokens counted as forwarded now;
    any other method passed through."""
    _, method = _model_and_method(request)
    if method not in (*COMPACTED, "countTokens"):
        return await handle_gemini_passthrough.__wrapped__(request)  # type: ignore[attr-defined]
    state = request.app[STATE]
    raw = await read_body(request, state.max_body, BodyPace.of(state.cfg.server))
    caller = caller_of(request, state)
    count_only = method == "countTokens"
    if caller.bypass:
        return await _as_sent(request, state, raw, caller, "bypassed", reasons.BYPASS)
    try:
        req, report, retry = await prepare(request, state, raw, caller, count_only=count_only)
    except errors.Uncompactable:  # not the proxy's to refuse: the upstream judges it
        return await _as_sent(request, state, raw, caller, "none", reasons.UNCOMPACTABLE)
    flow_body = req[1]
    body = await offload.sized(len(raw) // offload.COPY_SHARE, GEMINI.render, req[0], flow_body) \
        if flow_body is not req[0].conversation else raw
    up = _upstream(request, state, caller, req[0].stream)
    return await send(request, state.session, GEMINI, up, body, report.headers(), retry=retry, hooks=state.hooks,
                      mend_reasoning=False)


async def parse(state: Any, raw: bytes, request: web.Request) -> Request:
    model, method = _model_and_method(request)
    req = await offload.sized(len(raw), functools.partial(GEMINI.parse, model=model), raw, state.counter, state.cfg)
    req.stream = method == "streamGenerateContent"
    return req


async def prepare(request: web.Request, state: Any, raw: bytes, caller: Caller, *,
                  count_only: bool) -> tuple[tuple[Request, Any], Report, Any]:
    """Parse; the stages on the request's flow (count_only: records and notes made already apply,
    none is made); a bug in them forwards the request as sent."""
    req = await parse(state, raw, request)
    ex = request[EXCHANGE]
    ex.model, ex.stream = req.model, req.stream
    scope = caller.credentials.scope
    ex.conversation = conversation_digest(scope or "", req.first_digest())
    if scope is None:  # no records kept or read: compaction was needed and not done
        return (req, req.conversation), state.compaction.unchanged(req.model, req.total(), reasons.ANONYMOUS), None
    identity = Identity(scope, caller.credentials.headers, caller.focus, ex.conversation)
    req.extra["count_only"] = count_only
    flow = Flow.of(GEMINI, req, identity)
    if (seen := observed(state, ex, flow, request.headers, start=not count_only)) is not None:
        return (req, req.conversation), seen, None
    try:
        await run_request(state.stages, flow)
    except Exception:
        log.exception("shrinking the Gemini request failed unexpectedly; forwarding it unchanged")
        report = state.compaction.unchanged(req.model, flow.report.tokens_before, reasons.INTERNAL)
        journal_fault(state.hooks, ex, scope, req.conversation, report.status, flow.report.tokens_before)
        return (req, req.conversation), report, None
    if flow.report.tokens_after is None:
        flow.report.tokens_after = flow.total()
    if count_only:
        return (flow.request, flow.forwarded), flow.report, None
    state.prefixes.forwarded(ex, flow)
    return (flow.request, flow.forwarded), flow.report, overflow_retry(state.stages, flow, None, state.prefixes)


def _bypassed(raw: bytes, counter: Any, cfg: Any, model: str) -> int:
    try:
        return GEMINI.parse(raw, counter, cfg, model=model).total()
    except Exception:  # not a body the proxy can read: the upstream judges it
        return 0


async def _as_sent(request: web.Request, state: Any, raw: bytes, caller: Caller, status: str,
                   why: str) -> web.StreamResponse:
    model, method = _model_and_method(request)
    tokens = await offload.sized(len(raw), _bypassed, raw, state.counter, state.cfg, model)
    up = _upstream(request, state, caller, method == "streamGenerateContent")
    return await send(request, state.session, GEMINI, up, raw, Report(tokens, status, tokens, why=why).headers())


def _upstream(request: web.Request, state: Any, caller: Caller, streaming: bool) -> Upstream:
    return Upstream.of(request, state.cfg.gemini, request.rel_url.raw_path, caller.forwarded(), streaming)
