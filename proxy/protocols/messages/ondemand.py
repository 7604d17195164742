"""Anthropic's on-demand compaction (beta `compact-2026-09-04`; design.md § Messages API): a
request with `compaction: {"type": "summarize", "instructions"?}` is answered with exactly one
`{"type": "compaction", "content", "signature"}` block and `stop_reason: "compaction"`, which
later requests send first in an assistant message in place of the messages it summarizes.

An upstream that serves it gets the request (and its blocks) as any other. For one that does not
(LiteLLM before a local model, any Messages-compatible server) the proxy answers it, whole or
streamed, with a block whose `signature` is the proxy's token for a stored summary record (the
`cpx1.` token of proxy/compaction/served.py: an HMAC with the scope secret, so credential scoped);
a later request carrying such a block has it replaced by the summary's text before it goes
upstream. Blocks signed by the upstream go on unchanged. `anthropic.native_compaction` says
which: `upstream`, `proxy`, or `auto` (sent up until an upstream and model refuse it once).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Awaitable, Callable

import orjson
from aiohttp import web

from proxy import errors, jsonbody, native, offload, reuse
from proxy.byheaders import Caller
from proxy.exchange import EXCHANGE
from proxy.compaction.inject import summary_message_text
from proxy.compaction.making import CHARS_PER_IDENTIFIER_TOKEN
from proxy.compaction import served
from proxy.compaction.serialize import serialize_envelopes
from proxy.compaction.summarizer import SummaryJob, summarizer_headers
from proxy.compaction.view import files_chars, identifier_budget
from proxy.protocols.messages.adapter import MessagesAdapter
from proxy.state import STATE
from proxy.upstream import SummarizerError

BETA = "compact-2026-09-04"
REFUSALS = (400, 422)
LEARNED = web.AppKey("messages_native_compaction", dict)  # (upstream URL, model) -> whether it serves it
Position = tuple[int, int]  # (message, block)
MARK = b'"compaction"'  # in every body this hook handles: the field, or a block's type


def asks(body: Any) -> bool:
    """Whether the request is a compaction request."""
    cfg = body.get("compaction") if isinstance(body, dict) else None
    return isinstance(cfg, dict) and cfg.get("type") == "summarize"


def is_own(block: Any) -> bool:
    return (isinstance(block, dict) and block.get("type") == "compaction"
            and isinstance(block.get("signature"), str) and block["signature"].startswith(served.TOKEN_PREFIX))


def own_blocks(messages: Any) -> list[Position]:
    """Where our compaction blocks are in `messages`."""
    out = []
    for i, m in enumerate(messages if isinstance(messages, list) else ()):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            out += [(i, j) for j, b in enumerate(content) if is_own(b)]
    return out


def refused(status: int, body: Any) -> bool:
    """Whether an upstream's error says it does not know on-demand compaction: the parameter an
    extra input ("compaction: Extra inputs are not permitted"), the block an unknown tag, or the
    beta refused; not an upstream's own signature check of a block it made."""
    return (status in REFUSALS and isinstance(body, (bytes, bytearray))
            and (b"compaction" in body or BETA.encode() in body) and b"Invalid `signature`" not in body)


async def records(messages: list[Any], at: list[Position], state: Any, scope: str | None) -> dict[Position, Any]:
    """The summary record of each of our blocks; a 400 (Anthropic's shape) for one not made for
    this credential, altered, or whose record is gone."""
    out = {}
    for i, j in at:
        record = await served.record_of(messages[i]["content"][j]["signature"], state.store, state.scope_secret,
                                         scope)
        if record is served.BAD:
            raise errors.ProxyError(400, f"messages.{i}.content.{j}: Invalid `signature` in `compaction` block")
        if record is served.GONE:
            raise errors.ProxyError(400, f"messages.{i}.content.{j}: the compaction block's summary is no longer "
                                         "stored (expired or evicted); compact again from the full history")
        out[(i, j)] = record
    return out


async def expand(body: dict[str, Any], at: list[Position], state: Any, scope: str | None) -> dict[str, Any]:
    """`body` with each of our blocks replaced by a text block of its summary (the same bytes each
    time: the prompt cache keeps working across requests that carry it)."""
    found = await records(body["messages"], at, state, scope)
    messages = list(body["messages"])
    for i in sorted({i for i, _ in at}):
        content = messages[i]["content"]
        messages[i] = {**messages[i], "content": [
            {"type": "text", "text": summary_message_text(state.prompts, found[(i, j)].summary)}
            if (i, j) in found else b for j, b in enumerate(content)]}
    return {**body, "messages": messages}


def record_id(scope: str, body: dict[str, Any]) -> bytes:
    """The same compaction request (scope, model, system, messages) names the same record."""
    material = orjson.dumps([scope, body.get("model"), body.get("system"), body.get("messages")],
                            option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(material).digest()[:16]


async def summarize(request: web.Request, body: dict[str, Any], caller: Caller, size: int) -> tuple[Any, bytes, int]:
    """The conversation after our last block summarized (that block's summary updated), stored:
    (the record, its id, the tokens read)."""
    from proxy.protocols.messages.protocol import MESSAGES  # (its protocol calls this module)

    state = request.app[STATE]
    cfg, scope, messages = state.cfg, caller.credentials.scope, body["messages"]
    if scope is None:
        raise errors.ProxyError(400, "Compaction needs a credential (or an x-compaction-session id) to keep its "
                                     "summary under.")
    at = own_blocks(messages)
    previous = (await records(messages, at[-1:], state, scope)).get(at[-1]) if at else None
    rest = messages[at[-1][0] + 1:] if at else messages
    model = cfg.compaction.summarizer.model or cfg.compaction.summarizer_model or body["model"]
    summarizer, budget = state.compaction.summarizer, state.compaction.budget_for(model)
    blocks: list[str] = []
    if rest:
        req = await offload.sized(size, MESSAGES.parse, jsonbody.dumps({**body, "messages": rest}), state.counter, cfg)
        span = req.conversation.envelopes[req.conversation.n_system:]
        blocks = await offload.sized(size, serialize_envelopes, span)
    counted = sum(summarizer.count(b) for b in blocks)
    if not blocks:
        if previous is None:
            raise errors.ProxyError(400, "messages: nothing to compact")
        return previous, record_id(scope, body), 0
    instructions = (body["compaction"].get("instructions") or "").strip()
    job = SummaryJob(adapter=MESSAGES.summarizer(cfg), headers=summarizer_headers(cfg.compaction.summarizer,
                                                                                  caller.own_headers),
                     model=model, window=cfg.context_window(model), output_cap=budget.output_cap,
                     timeout_s=cfg.compaction.summarizer_timeout_s,
                     focus=instructions or caller.focus or cfg.compaction.focus,
                     max_calls=cfg.compaction.max_fold_calls, purpose="compact", scope=scope)
    try:
        model_text = await summarizer.summarize(job, blocks, previous.summary if previous else None)
    except SummarizerError as e:
        raise errors.ProxyError(502, f"Compaction failed: {e}") from None
    record = await offload.sized(size, served.finish, model_text, span, "", previous, model=model,
                                 created=time.time(), files_chars=files_chars(budget),
                                 identifier_chars=CHARS_PER_IDENTIFIER_TOKEN * identifier_budget(
                                     budget.target, cfg.compaction.identifiers_share, counted))
    rid = record_id(scope, body)
    await state.store.put(served.record_key(scope, rid), record.to_bytes())
    return record, rid, counted


def message(body: dict[str, Any], rid: bytes, block: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    return {"id": "msg_cpx_" + rid.hex()[:24], "type": "message", "role": "assistant", "model": body["model"],
            "content": [block], "stop_reason": "compaction", "stop_sequence": None, "usage": usage}


def stream_events(final: dict[str, Any]) -> bytes:
    """The message as the API streams it: the block's signature with its start, the summary in
    one `compaction_delta` (the SDKs take the delta's content whole)."""
    block, usage = final["content"][0], final["usage"]
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**final, "content": [], "stop_reason": None,
                                              "usage": {**usage, "output_tokens": 1}}},
        {"type": "content_block_start", "index": 0,
         "content_block": {"type": "compaction", "content": None, "signature": block["signature"]}},
        {"type": "ping"},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "compaction_delta", "content": block["content"]}},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "compaction", "stop_sequence": None},
         "usage": {"output_tokens": usage["output_tokens"]}},
        {"type": "message_stop"},
    ]
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


async def answer(request: web.Request, body: dict[str, Any], caller: Caller, size: int) -> web.StreamResponse:
    """The compaction request answered here, whole or streamed."""
    state = request.app[STATE]
    record, rid, counted = await summarize(request, body, caller, size)
    scope = caller.credentials.scope
    block = {"type": "compaction", "content": record.summary,
             "signature": served.sign(state.scope_secret, scope, rid)}  # type: ignore[arg-type]
    usage = {"input_tokens": counted, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
             "output_tokens": state.compaction.summarizer.count(record.summary)}
    final = message(body, rid, block, usage)
    return await native.whole_or_streamed(request, final, (lambda: stream_events(final)) if body.get("stream") else None)


async def counted(request: web.Request, raw: bytes, caller: Caller) -> bytes:
    """A count_tokens body as it goes upstream: our blocks replaced by their summaries, and the
    `compaction` parameter, which the count ignores, left out unless the setting says the upstream
    serves it (one that does not refuses it); the same bytes when neither is there."""
    body = await offload.sized(len(raw), native.parse_object, raw) if raw.find(b'"compaction"') >= 0 else None
    at = own_blocks(body.get("messages")) if body is not None else []
    state = request.app[STATE]
    dropped = body is not None and "compaction" in body and state.cfg.anthropic.native_compaction != "upstream"
    if not at and not dropped:
        return raw
    body = await expand(body, at, state, caller.credentials.scope) if at else body  # type: ignore[arg-type]
    return jsonbody.dumps({k: v for k, v in body.items() if not (dropped and k == "compaction")})


Forward = Callable[[bytes], Awaitable[web.StreamResponse]]


def handled(request: web.Request, raw: bytes, caller: Caller, count_only: bool,
            forward: Forward) -> Awaitable[web.StreamResponse]:
    """The protocol's native hook (protocols/base.py): a compaction request answered here or
    forwarded (`forward`: the pipeline's own path, given the body to send) as the setting and the
    upstream say; our blocks expanded in whatever goes upstream (a count: `counted`); any other
    request forwarded as it came (`forward`'s own coroutine: a frame awaiting it would be resumed
    by every event of its stream)."""
    if not count_only and not reuse.contains(MessagesAdapter.protocol, caller.credentials.scope, raw, MARK):
        return forward(raw)
    return _handled(request, raw, caller, count_only, forward)


async def _handled(request: web.Request, raw: bytes, caller: Caller, count_only: bool,
                   forward: Forward) -> web.StreamResponse:
    if count_only:
        return await forward(await counted(request, raw, caller))
    body = await offload.sized(len(raw), native.parse_object, raw)
    if body is None or not isinstance(body.get("model"), str):
        return await forward(raw)  # (the upstream judges it)
    state = request.app[STATE]
    at = own_blocks(body.get("messages"))

    async def forwarded() -> web.StreamResponse:  # our blocks expanded in whatever goes upstream
        return await forward(jsonbody.dumps(await expand(body, at, state, caller.credentials.scope)) if at else raw)

    if not asks(body):
        return await forwarded()
    ex = request[EXCHANGE]  # (logged as any request, answered here or not)
    ex.model, ex.stream = body["model"], bool(body.get("stream"))
    return await native.handshake(state.cfg.anthropic.native_compaction, request.app[LEARNED],
                                  (state.cfg.anthropic.base_url, body["model"]), forwarded,
                                  lambda: answer(request, body, caller, len(raw)), refused)
