"""Codex's remote compaction v2 (design.md § Responses API): a `POST /v1/responses` whose last
input item is `{"type": "compaction_trigger"}` asks for exactly one `compaction` output item,
which the client then keeps (with its user, developer and system messages) as its new history.
Codex reads the `response.output_item.done` events, counts the compaction items among them (it
fails on any count but one) and needs a `response.completed`.

An upstream that serves it gets the request as any other (the stages applied; its item relayed
unchanged). One that does not (a local server, vLLM, llama.cpp, a gateway) refuses the unknown
item type with a 400; the proxy then answers the request itself, with the item its own
`/v1/responses/compact` makes (`cpx1.` token, credential scoped, expanded into its summary on the
next request: proxy/protocols/responses/compact.py), whole or streamed as asked.
`responses.native_compaction` says which: `upstream`, `proxy`, or `auto` (sent up until an
upstream and model refuse it once; answered here from then on).
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from proxy import errors, native, offload, reuse
from proxy.byheaders import Caller
from proxy.exchange import EXCHANGE
from proxy.protocols.responses.adapter import ResponsesAdapter
from proxy.protocols.responses.body import parse_responses_body
from proxy.protocols.responses.runtime import RESPONSES
from proxy.protocols.responses.websocket import NativeAnswer
from proxy.state import STATE

TRIGGER = "compaction_trigger"
REFUSALS = (400, 422)  # how a server that does not know an item type answers (422: pydantic servers)


def maybe_trigger(raw: bytes, scope: str | None = None) -> bool:
    """A byte search that every trigger request passes (and nearly every other fails); what the
    body shares with the scope's previous one that lacked it is not searched again."""
    return reuse.contains(ResponsesAdapter.protocol, scope, raw, b'compaction_trigger"')


def is_trigger(body: Any) -> bool:
    """Whether `body` asks for a compaction: its last input item is the trigger."""
    items = body.get("input") if isinstance(body, dict) else None
    return isinstance(items, list) and bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == TRIGGER


def refused(status: int, body: Any) -> bool:
    """Whether an upstream's error answer says it does not know the trigger item. Servers word it
    their own way (OpenAI: "Invalid value: 'compaction_trigger'. Supported values are: ...";
    serde: "unknown variant `compaction_trigger`"; pydantic: "Input tag 'compaction_trigger' found
    using 'type' does not match any of the expected tags"), but each names it."""
    return status in REFUSALS and isinstance(body, (bytes, bytearray)) and b"compaction_trigger" in body


def response_object(body: dict[str, Any], item: dict[str, Any], usage: dict[str, Any], status: str = "completed",
                    created_at: int | None = None) -> dict[str, Any]:
    """The Response a server sends for the request `body`, whose one output item is `item`."""
    return {
        "id": "resp_" + item["id"].removeprefix("cmp_"), "object": "response",
        "created_at": created_at or int(time.time()), "status": status, "background": False, "error": None,
        "incomplete_details": None, "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"), "model": body["model"],
        "output": [item] if status == "completed" else [],
        "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None}, "service_tier": "default",
        "store": body.get("store", True), "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0), "truncation": body.get("truncation") or "disabled",
        "usage": usage if status == "completed" else None, "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def events(body: dict[str, Any], item: dict[str, Any], usage: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of that response, as a server sends them: created, in_progress, the item added
    and done, completed; each with its `sequence_number`."""
    created = int(time.time())
    start = response_object(body, item, usage, "in_progress", created)
    out: list[dict[str, Any]] = [
        {"type": "response.created", "response": start},
        {"type": "response.in_progress", "response": start},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response_object(body, item, usage, created_at=created)},
    ]
    return [{"type": e["type"], "sequence_number": n, **e} for n, e in enumerate(out)]


def stream_events(body: dict[str, Any], item: dict[str, Any], usage: dict[str, Any]) -> bytes:
    """Those events as an HTTP event stream."""
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n"
                    for e in events(body, item, usage))


async def compacted(app: web.Application, body: dict[str, Any], creds: Any, focus: str | None,
                    size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The history before the trigger compacted as `/v1/responses/compact` does (our earlier
    items' summaries updated): its one compaction item, and the usage."""
    # (handlers imports the protocol, whose hook this module is: imported when first used)
    from proxy.protocols.responses.handlers import serve_compact

    history = {**body, "input": body["input"][:-1]}
    out = await serve_compact(app[STATE], history, creds, focus, size=size)
    return out["output"][-1], out["usage"]


async def answer(request: web.Request, body: dict[str, Any], caller: Caller, size: int) -> web.StreamResponse:
    """The trigger answered here, its one compaction item sent whole or streamed."""
    item, usage = await compacted(request.app, body, caller.credentials, caller.focus, size)
    streamed = (lambda: stream_events(body, item, usage)) if body.get("stream") else None
    return await native.whole_or_streamed(request, response_object(body, item, usage), streamed)


def on_socket(app: web.Application, body: dict[str, Any], caller: Caller) -> NativeAnswer | None:
    """A socket turn (`body`: the whole history it stands for) that is a trigger the proxy may
    answer: now (as for HTTP), or once the upstream's error event refuses it (`auto`, not known
    yet: learned then)."""
    if not is_trigger(body) or not isinstance(body.get("model"), str) or body.get("previous_response_id"):
        return None  # (a chain not read, both stages off: the history is the upstream's to compact)
    state = app[STATE]
    mode, known = state.cfg.responses.native_compaction, app[RESPONSES].native_compaction
    key = (state.cfg.upstream.base_url, body["model"])
    now = native.answers_here(mode, known.get(key))
    if not now and (mode != "auto" or key in known):
        return None

    async def made() -> list[str]:
        item, usage = await compacted(app, body, caller.credentials, caller.focus, 0)
        return [orjson.dumps(e).decode() for e in events(body, item, usage)]

    def refusal(ev: dict[str, Any]) -> bool:
        if not refused(int(ev.get("status") or 400), orjson.dumps(ev.get("error"))):
            return False
        native.log.info("the upstream refused compaction_trigger on a WebSocket (model %s); answering it here",
                        body["model"])
        native.remember(known, key, False)
        return True

    return NativeAnswer(made, now, refusal)


Forward = Callable[[bytes], Awaitable[web.StreamResponse]]


def handled(request: web.Request, raw: bytes, caller: Caller, count_only: bool,
            forward: Forward) -> Awaitable[web.StreamResponse]:
    """The protocol's native hook (protocols/base.py): a trigger request answered here or
    forwarded (`forward`: the pipeline's own path) as the setting and what the upstream has shown
    say; any other request forwarded (`forward`'s own coroutine: a frame awaiting it would be
    resumed by every event of its stream)."""
    if not maybe_trigger(raw, caller.credentials.scope):
        return forward(raw)
    return _handled(request, raw, caller, forward)


async def _handled(request: web.Request, raw: bytes, caller: Caller, forward: Forward) -> web.StreamResponse:
    body = await offload.sized(len(raw), _checked, raw)
    if body is None or not is_trigger(body):
        return await forward(raw)  # (the route answers a body it cannot read as it does any other)
    state = request.app[STATE]
    ex = request[EXCHANGE]
    ex.model, ex.stream = body["model"], bool(body.get("stream"))
    known = request.app[RESPONSES].native_compaction
    return await native.handshake(state.cfg.responses.native_compaction, known,
                                  (state.cfg.upstream.base_url, body["model"]), lambda: forward(raw),
                                  lambda: answer(request, body, caller, len(raw)), refused)


def _checked(raw: bytes) -> dict[str, Any] | None:
    """The body, when the route's own checks pass it (else None: the route answers their error)."""
    try:
        return parse_responses_body(raw)
    except errors.ProxyError:
        return None
