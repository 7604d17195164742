"""The Responses routes' entry points: `GET /v1/responses` upgraded to a WebSocket (anything else
on it is passed through, as OpenAI's own GET routes are) and `POST /v1/responses/compact`."""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web
from yarl import URL

from proxy.config import secret
from proxy import credentials, errors, jsonbody, offload
from proxy.compaction import served
from proxy.compaction.making import CHARS_PER_IDENTIFIER_TOKEN
from proxy.compaction.summarizer import SummaryJob, summarizer_headers
from proxy.compaction.view import files_chars, identifier_budget
from proxy.body import BodyPace, read_body
from proxy.forward import (
    UPSTREAM_ERRORS,
    client_timeout,
    map_client_error,
    passthrough,
    relay,
    upstream_request_headers,
    upstream_url,
)
from proxy.protocols.responses import compact
from proxy.protocols.responses.protocol import ADAPTER
from proxy.protocols.responses.socket_turns import SocketTurns
from proxy.protocols.responses.items import input_items, item_type, parse_items, system_count
from proxy.protocols.responses.runtime import RESPONSES
from proxy.protocols.responses.websocket import Prepare, handshake_headers, relay_websocket
from proxy.state import STATE
from proxy.upstream import SummarizerError

log = logging.getLogger("proxy.responses")


def websocket_url(base_url: str, request: web.Request) -> str:
    """The upstream's /responses as a ws:// or wss:// URL, with the client's query string."""
    url = URL(base_url + "/responses", encoded=True)
    url = url.with_scheme({"http": "ws", "https": "wss"}.get(url.scheme, url.scheme))
    query = request.rel_url.raw_query_string
    return str(url) + (f"?{query}" if query else "")


def is_websocket_upgrade(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket" and request.method == "GET"


async def handle_responses_get(request: web.Request, prepare: Prepare | None = None) -> web.StreamResponse:
    state = request.app[STATE]
    cfg = state.cfg
    if not is_websocket_upgrade(request):
        return await passthrough(request, state.session, cfg.upstream, state.max_body, BodyPace.of(cfg.server))
    api_key = secret(cfg.upstream.api_key)
    headers = handshake_headers(request.headers, upstream_request_headers(request.headers, api_key))
    return await relay_websocket(request, state.socket_session or state.session,
                                 websocket_url(cfg.upstream.base_url, request), headers,
                                 prepare or SocketTurns(request), state.max_body, state.sockets)


# ---- /v1/responses/compact -------------------------------------------------------------------

NOT_SERVED = (404, 405)  # how a server without /responses/compact answers


async def handle_compact(request: web.Request) -> web.StreamResponse:
    """Passed through to an upstream that serves it; served here when it does not (or when
    `responses.serve_compact` is set). Our own compaction items in the input are expanded first
    either way: no upstream can read them."""
    state = request.app[STATE]
    cfg = state.cfg
    rt = request.app[RESPONSES]
    raw = await read_body(request, state.max_body, BodyPace.of(cfg.server))
    api_key = secret(cfg.upstream.api_key)
    creds = credentials.resolve(request.headers, state.scope_secret, api_key)
    body = await offload.sized(len(raw), _parse, raw)
    items = input_items(body)
    if not cfg.responses.serve_compact and rt.upstream_compact is not False:
        data = raw
        if compact.has_own(items):
            expanded = await compact.expand(items, state.store, state.scope_secret, creds.scope, state.prompts)
            data = jsonbody.dumps({**body, "input": expanded})
        headers = upstream_request_headers(request.headers, api_key, identity_encoding=True)
        headers["Content-Type"] = "application/json"
        try:
            async with state.session.post(
                upstream_url(cfg.upstream.base_url, request, "/responses/compact"), data=data, headers=headers,
                timeout=client_timeout(cfg.upstream, streaming=False), allow_redirects=False,
            ) as upstream:
                if upstream.status not in NOT_SERVED:
                    rt.upstream_compact = True
                    return await relay(request, upstream)
                await upstream.read()
        except UPSTREAM_ERRORS as e:
            raise map_client_error(e) from None
        log.info("the upstream does not serve /responses/compact (HTTP %d); serving it here", upstream.status)
        rt.upstream_compact = False
    focus = request.headers.get("x-compaction-focus")
    return web.json_response(await serve_compact(state, body, creds, focus, size=len(raw)))


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = jsonbody.load_request(raw)
    except jsonbody.Unreadable as e:
        raise errors.unreadable(e) from None
    if not isinstance(body, dict):
        raise errors.bad_request("The request body must be a JSON object.", code="invalid_type")
    if not isinstance(body.get("model"), str):
        raise errors.bad_request("Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
    inp = body.get("input")
    if inp is not None and not isinstance(inp, (str, list)):
        raise errors.bad_request("Invalid type for 'input': expected a string or an array of input items.",
                                 param="input", code="invalid_type")
    return body


def _span(items: list[Any], last: int, count: Any) -> tuple[int, list[str], list[Any], int]:
    """(where the span to summarize starts, its transcript blocks, the user messages, the blocks'
    tokens): after our last compaction item (`last`) and the system part."""
    entries = parse_items(items)
    start = max(last + 1, system_count(entries))
    blocks = compact.transcript([e for e in entries[start:] if not compact.is_own(e.raw)])
    users = [it for it in items if item_type(it) == "message" and it.get("role") == "user"]
    return start, blocks, users, sum(count(b) for b in blocks)


def _record(items: list[Any], start: int, users: list[Any], model_text: str, before: served.CompactRecord | None,
            **finish: Any) -> served.CompactRecord:
    span = [e for e in ADAPTER.envelopes(items)[start:] if not compact.is_own(e.value)]
    kept = "\n".join(e.text for e in parse_items(users))  # returned to the client as they are
    return served.finish(model_text, span, kept, before, created=time.time(), **finish)


async def serve_compact(state: Any, body: dict[str, Any], creds: credentials.Credentials,
                        focus: str | None, size: int = 0) -> dict[str, Any]:
    """The compaction made here: the span after our last compaction item summarized (updating
    that item's summary), stored, and named by a signed token. `size`, the body's: the work that
    grows with it (the transcript, the count, the identifiers) leaves the loop past offload's."""
    cfg = state.cfg
    if creds.scope is None:
        raise errors.bad_request("Compaction needs a credential (or an x-compaction-session id) to keep its summary "
                                 "under.", code="missing_credentials")
    items = input_items(body)
    records = await compact.own_records(items, state.store, state.scope_secret, creds.scope)
    last = max(records) if records else -1
    before = records[last] if records else None
    previous = before.summary if before else None
    model = cfg.compaction.summarizer.model or cfg.compaction.summarizer_model or body["model"]
    summarizer = state.compaction.summarizer
    start, blocks, users, counted = await offload.sized(size, _span, items, last, summarizer.count)
    budget = state.compaction.budget_for(model)
    if not blocks:
        if before is None:
            raise errors.bad_request("Nothing to compact: the input has no conversation items.", param="input")
        record = before
    else:
        job = SummaryJob(
            adapter=ADAPTER.summarizer(cfg),
            headers=summarizer_headers(cfg.compaction.summarizer, creds.headers),
            model=model,
            window=cfg.context_window(model),
            output_cap=budget.output_cap,
            timeout_s=cfg.compaction.summarizer_timeout_s,
            focus=focus or cfg.compaction.focus,
            max_calls=cfg.compaction.max_fold_calls,
            purpose="compact",
            scope=creds.scope,
        )
        try:
            model_text = await summarizer.summarize(job, blocks, previous)
        except SummarizerError as e:
            raise errors.ProxyError(502, f"Compaction failed: {e}", type="upstream_error",
                                    code="compaction_failed") from None
        record = await offload.sized(
            size * offload.SCAN_WEIGHT, _record, items, start, users, model_text, before, model=model,
            files_chars=files_chars(budget), identifier_chars=CHARS_PER_IDENTIFIER_TOKEN * identifier_budget(
                budget.target, cfg.compaction.identifiers_share, counted))
    rid = await offload.sized(size, compact.record_id, creds.scope, body)
    await state.store.put(served.record_key(creds.scope, rid), record.to_bytes())
    out_tokens = summarizer.count(record.summary)
    usage = {"input_tokens": counted, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out_tokens,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": counted + out_tokens}
    return compact.compacted_response(rid, served.sign(state.scope_secret, creds.scope, rid), users, usage)
