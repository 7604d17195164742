"""`compaction-proxy inspect FILE`: what the proxy would forward for one request body.

It runs the request's real stages (tool results to notes, then the history) on a real ProxyState,
for a chat completions, a Responses or an Anthropic Messages body, with two things swapped for
the dry run: the store is read through but never written (DryRunStore), and the summarizers'
upstream caller answers a placeholder instead of calling anyone (DryRunCaller). With
`--summarize` the caller is the real one: the configured upstream writes the summary (and the
notes) the proxy would make; the store is still not written.
"""

from __future__ import annotations

import difflib
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import aiohttp
from multidict import CIMultiDict

import orjson

from proxy import jsonbody
from proxy.protocols import pipeline
from proxy.protocols.base import AsSent
from proxy.protocols.chat.body import parse_chat_body
from proxy.protocols.registry import PROTOCOLS
from proxy.compaction.stage import MARK as COMPACTION_MARK
from proxy.flow import Flow
from proxy.config import Config, secret
from proxy.hashing import conversation_digest
from proxy.model import Kind
from proxy.exchange import Exchange
from proxy.protocols.responses import items as response_items
from proxy.state import ProxyState
from proxy.store import open_store
from proxy.store.base import Store
from proxy.store.memory import MemoryStore
from proxy.toolresults.select import BEGIN as TOOL_OUTPUT_BEGIN
from proxy.upstream import SummaryCaller

# Anthropic-only fields: a body with one of them is a Messages body (a chat body has none)
_MESSAGES_FIELDS = ("system", "thinking", "anthropic_version", "stop_sequences", "top_k", "container",
                    "context_management", "mcp_servers")
_MESSAGES_BLOCKS = ("tool_use", "tool_result", "thinking", "redacted_thinking")


def protocol_of(body: Any) -> str:
    """"responses" for a Responses body (an `input`, no `messages`); "messages" for an Anthropic
    Messages body (a top-level Anthropic field, or a content block only Messages has: tool_use,
    tool_result, thinking); else "chat"."""
    if not isinstance(body, dict):
        return "chat"
    if "messages" not in body and ("input" in body or "previous_response_id" in body):
        return "responses"
    if any(k in body for k in _MESSAGES_FIELDS):
        return "messages"
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in _MESSAGES_BLOCKS
                                             for b in content):
            return "messages"
    return "chat"

PLACEHOLDER = ("## Active Task\n(dry run: no summarizer was called; `compaction-proxy inspect --summarize` "
               "asks the configured upstream for the real text)")
NOTE_PLACEHOLDER = "(dry run: this tool output would be replaced by the summarizer's note)"
HEAD_LINES, TAIL_LINES, LINE_CHARS = 12, 4, 240  # of each message in the diff


class DryRunStore(Store):
    """Reads see the real store and what this run wrote; writes stay in memory."""

    def __init__(self, inner: Store) -> None:
        super().__init__(ttl_s=inner.ttl_s, max_records=inner.max_records, clock=inner.clock)
        self.inner = inner
        self.overlay = MemoryStore(ttl_s=inner.ttl_s, max_records=inner.max_records, clock=inner.clock)
        self.healthy = True

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        found = await self.inner.get_many(keys)
        found.update(await self.overlay.get_many(keys))
        return found

    async def peek(self, key: str) -> bytes | None:
        found = await self.overlay.peek(key)
        return found if found is not None else await self.inner.peek(key)

    async def put(self, key: str, value: bytes, ttl_s: float | None = ...) -> None:  # type: ignore[assignment]
        await self.overlay.put(key, value, ttl_s)

    async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
        if await self.inner.peek(key) is not None:  # (a look: a dry run refreshes nothing it only checks)
            return False
        return await self.overlay.add(key, value, ttl_s)

    async def delete(self, key: str, expected: bytes | None = None) -> bool:
        return await self.overlay.delete(key, expected)

    async def append(self, name: str, value: bytes, max_len: int) -> None:
        await self.overlay.append(name, value, max_len)

    async def put_original(self, key: str, value: bytes, identifiers: Sequence[str],
                           words: Sequence[str] | None = None) -> None:
        await self.overlay.put_original(key, value, identifiers, words)

    async def find_originals(
        self, prefix: str, words: Sequence[str], identifiers: Sequence[str], limit: int
    ) -> list[str]:
        found = await self.inner.find_originals(prefix, words, identifiers, limit)
        return found + [k for k in await self.overlay.find_originals(prefix, words, identifiers, limit) if k not in found]

    async def tail(self, name: str, n: int) -> list[tuple[float, bytes]]:
        return await self.inner.tail(name, n)

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class CallLog:
    history: int = 0
    tool: int = 0


class DryRunCaller(SummaryCaller):
    """Answers every summarizer call with a placeholder that passes the proxy's checks."""

    def __init__(self, session: aiohttp.ClientSession, cfg: Config, log: CallLog) -> None:
        super().__init__(session, cfg)
        self.log = log

    async def complete(self, adapter: Any, call: Any, **kwargs: Any) -> str:
        if TOOL_OUTPUT_BEGIN in call.prompt:
            self.log.tool += 1
            return NOTE_PLACEHOLDER
        self.log.history += 1
        return PLACEHOLDER


class CountingCaller(SummaryCaller):
    """The real caller, counting its calls (for the report of --summarize)."""

    def __init__(self, session: aiohttp.ClientSession, cfg: Config, log: CallLog) -> None:
        super().__init__(session, cfg)
        self.log = log

    async def complete(self, adapter: Any, call: Any, **kwargs: Any) -> str:
        if TOOL_OUTPUT_BEGIN in call.prompt:
            self.log.tool += 1
        else:
            self.log.history += 1
        return await super().complete(adapter, call, **kwargs)


@dataclass
class Report:
    model: str
    encoding: str
    window: int
    threshold: int
    target: int
    tokens_before: int
    tokens_after: int
    status: str
    reason: str
    scope: str | None
    summarize: bool
    calls: dict[str, int]
    tool_notes: list[dict[str, Any]] = field(default_factory=list)
    cut: dict[str, Any] | None = None
    record: dict[str, Any] | None = None
    diff: list[str] = field(default_factory=list)
    forwarded: dict[str, Any] = field(default_factory=dict)
    why: str = ""  # the reason's word, as the answer's x-compaction-reason would say

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def inspect_config(cfg: Config) -> Config:
    """The proxy's config for a one-request run: nothing in the background, nothing reported."""
    return cfg.model_copy(update={
        "compaction": cfg.compaction.model_copy(update={"prepare_percent": 0}),
        "metrics": cfg.metrics.model_copy(update={"enabled": False}),
        "journal": cfg.journal.model_copy(update={"enabled": False}),
        "server": cfg.server.model_copy(update={"access_log": False}),
    })


async def inspect(cfg: Config, raw: bytes, *, headers: dict[str, str], summarize: bool = False,
                  protocol: str | None = None) -> Report:
    """The dry run of one request body, a chat completions or an Anthropic Messages one (`protocol`,
    else told from the body); raises ProxyError for a body the proxy would refuse."""
    try:
        protocol = protocol or protocol_of(orjson.loads(raw))
    except orjson.JSONDecodeError:
        protocol = "chat"  # (the chat parse names the error)
    body = parse_chat_body(raw) if protocol == "chat" else None
    cfg = inspect_config(cfg)
    log = CallLog()
    store = DryRunStore(open_store(cfg.store.url, ttl_s=cfg.store.ttl_s, max_records=cfg.store.max_records))

    def make_caller(session: aiohttp.ClientSession) -> SummaryCaller:
        return (CountingCaller if summarize else DryRunCaller)(session, cfg, log)

    state = await ProxyState.create(cfg, store=store, make_caller=make_caller)
    try:
        return await _run(state, jsonbody.dumps(body) if body is not None else raw, headers, summarize, log,
                          protocol)
    finally:
        await state.close()


async def _run(state: ProxyState, raw: bytes, headers: dict[str, str], summarize: bool, log: CallLog,
               name: str) -> Report:
    """The pipeline's `read` and `run` on the body, as the route would (a dry run: nothing kept,
    nothing sent), and what they did."""
    protocol = PROTOCOLS[name]
    incoming = CIMultiDict(headers)
    caller = protocol.callers.make(incoming, state.scope_secret, secret(protocol.adapter.upstream(state.cfg).api_key))
    ex = Exchange("inspect", "POST", "inspect", "inspect", name)
    sent = raw  # the diff's left side: the body as the client sent it
    read = await pipeline.read(state, protocol, pipeline.Incoming(raw, incoming, caller, ex))
    parsed = read if not isinstance(read, AsSent) else protocol.adapter.parse(read.raw, state.counter, state.cfg)
    parsed.extra["count_only"] = False  # (the stages read it: a request, not a count)
    before = parsed.total()
    budget = state.compaction.budget_for(parsed.model)
    scope = caller.credentials.scope
    # Without a credential no stored record can be matched; the stages still show what a first
    # request of this conversation would get.
    conversation = conversation_digest(scope or "", parsed.first_digest())
    identity = pipeline.identify(state, protocol, parsed, caller, conversation, scope="inspect-without-credential")
    assert identity is not None
    flow = Flow.of(protocol.adapter, parsed, identity)
    if isinstance(read, AsSent):
        # The history lives at the upstream (previous_response_id, conversation): the route
        # forwards such a body as it came.
        flow.report.reason = "the history is stored at the upstream (previous_response_id or conversation)"
        flow.report.why = read.why
    else:
        await pipeline.run(state, protocol, flow, ex, dry=True)
    outcome = flow.report
    after = outcome.tokens_after if outcome.tokens_after is not None else flow.total()
    report = Report(
        model=parsed.model, encoding=parsed.encoding, window=budget.window, threshold=budget.threshold,
        target=budget.target, tokens_before=before, tokens_after=after, status=outcome.status, reason=outcome.reason,
        scope=scope, summarize=summarize, calls={"history": log.history, "tool_result": log.tool},
        why=outcome.why,
    )
    original = parsed.conversation
    noted = flow.marks.get(COMPACTION_MARK, flow.forwarded)  # after the tool-result stage
    # envelopes before the client's list: a Messages system, a Responses instructions
    lead = {"messages": original.n_system, "responses": int(isinstance(parsed.body.get("instructions"), str))}.get(protocol, 0)
    for i, (old, new) in enumerate(zip(original.envelopes, noted.envelopes)):
        if new is not old:
            calls = [it.call_id for it in old.items if it.kind is Kind.TOOL_RESULT]
            report.tool_notes.append({
                "index": i - lead,
                "tool_call_id": ", ".join(str(c) for c in calls), "tokens_before": original.tokens[i],
                "tokens_after": noted.tokens[i],
                "source": _note_source(" ".join(it.text for it in new.items), summarize),
            })
    record = outcome.record
    n_system = original.n_system
    if record is not None:
        report.cut = {"first": n_system + 1, "last": n_system + record.covered, "covered": record.covered,
                      "kept": len(original) - n_system - record.covered, "messages": len(original)}
        report.record = {"chain": record.chain, "created": record.created, "reused": outcome.status == "reused",
                         "summary": record.summary}
    client = orjson.loads(sent)
    report.forwarded = orjson.loads(flow.body())  # what the proxy would send
    report.diff = diff_lines(_shown(client), _shown(report.forwarded))
    return report


def _shown(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A body's messages for the diff: a Messages body's top-level system, a Responses body's
    instructions as the first; a Responses body's input items (a string: one user message)."""
    system = body.get("system", body.get("instructions"))
    lead = [{"role": "system", "content": system}] if system else []
    if "messages" in body or "input" not in body:
        return lead + list(body.get("messages") or [])
    return lead + response_items.input_items(body)


def _note_source(text: str, summarize: bool) -> str:
    if NOTE_PLACEHOLDER in text:
        return "new note (dry run: placeholder)"
    return "note" if summarize else "note from the store"  # a dry run makes placeholders only


def message_lines(msg: dict[str, Any]) -> list[str]:
    """One message as readable lines, long content clipped head and tail (the same way on both
    sides of the diff, so an unchanged message stays unchanged)."""
    kind = msg.get("type")
    if kind not in (None, "message"):  # a Responses item that is no message
        return _item_lines(msg)
    head = f"### {msg.get('role')}"
    if msg.get("tool_call_id"):
        head += f" (answers {msg['tool_call_id']})"
    lines = [head]
    for call in msg.get("tool_calls") or []:
        fn = call.get("function") or {}
        lines.append(f"-> {fn.get('name')}({_clip(str(fn.get('arguments', '')), 120)})  [{call.get('id')}]")
    content = msg.get("content")
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict):
                continue
            if p.get("type") == "tool_use":  # (Messages blocks)
                lines.append(f"-> {p.get('name')}({_clip(orjson.dumps(p.get('input')).decode(), 120)})  [{p.get('id')}]")
            elif p.get("type") == "tool_result":
                inner = p.get("content")
                said = inner if isinstance(inner, str) else "\n".join(
                    str(x.get("text", f"[{x.get('type')}]")) for x in inner or [] if isinstance(x, dict))
                parts.append(f"(answers {p.get('tool_use_id')})\n{said}")
            else:
                parts.append(str(p.get("text", f"[{p.get('type')}]")))
        content = "\n".join(parts)
    return lines + (_clipped(content) if isinstance(content, str) else [])


def _item_lines(item: dict[str, Any]) -> list[str]:
    """A Responses input item other than a message: a call as `-> name(arguments) [call_id]`, an
    output as a tool message answering its call, anything else by its type."""
    kind = str(item.get("type"))
    if kind.endswith("_call") and "output" not in item:
        args = item.get("arguments", item.get("input", item.get("action", "")))
        args = args if isinstance(args, str) else orjson.dumps(args).decode()
        return [f"### assistant ({kind})", f"-> {item.get('name', kind)}({_clip(args, 120)})  [{item.get('call_id')}]"]
    if kind.endswith("_output"):
        out = item.get("output")
        if isinstance(out, list):  # content parts
            out = "\n".join(str(p.get("text", f"[{p.get('type')}]")) for p in out if isinstance(p, dict))
        elif not isinstance(out, str):
            out = orjson.dumps(out).decode()
        return [f"### tool (answers {item.get('call_id')})"] + _clipped(out)
    return [f"### [{kind}]"]


def _clipped(content: str) -> list[str]:
    text = content.splitlines()
    if len(text) > HEAD_LINES + TAIL_LINES:
        text = text[:HEAD_LINES] + [f"[... {len(text) - HEAD_LINES - TAIL_LINES} lines ...]"] + text[-TAIL_LINES:]
    return [_clip(line, LINE_CHARS) for line in text]


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def diff_lines(original: list[dict[str, Any]], forwarded: list[dict[str, Any]]) -> list[str]:
    a = [line for m in original for line in message_lines(m)]
    b = [line for m in forwarded for line in message_lines(m)]
    return list(difflib.unified_diff(a, b, "original", "forwarded", n=2, lineterm=""))


def format_report(r: Report) -> str:
    out = [f"model {r.model} ({r.encoding}): window {r.window}, threshold {r.threshold}, target {r.target} tokens",
           f"tokens: {r.tokens_before} received -> {r.tokens_after} forwarded "
           f"({'over' if r.tokens_before > r.threshold else 'under'} the threshold)"]
    if r.scope is None:
        out.append("no credential given (--api-key, or OPENAI_API_KEY / ANTHROPIC_API_KEY): stored records of a "
                   "client cannot be matched")
    n = len(r.tool_notes)
    out.append(f"tool results: {n} {'becomes a note' if n == 1 else 'become notes'}")
    for n in r.tool_notes:
        out.append(f"  message {n['index'] + 1} (answers {n['tool_call_id']}): {n['tokens_before']} -> "
                   f"{n['tokens_after']} tokens, {n['source']}")
    out.append(f"history: {r.status}" + (f" ({r.reason})" if r.reason else "") + (f"; reason: {r.why}" if r.why else ""))
    if r.cut is not None and r.record is not None:
        c = r.cut
        out.append(f"  cut: messages {c['first']}-{c['last']} of {c['messages']} summarized, {c['kept']} kept verbatim")
        if r.record["reused"]:
            made = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.record["created"]))
            out.append(f"  reuses the stored record {r.record['chain'][:16]}... made {made}")
        else:
            out.append("  a new summary" + (" (dry run: placeholder text)" if not r.summarize else ""))
    calls = r.calls["history"] + r.calls["tool_result"]
    split = f"{r.calls['history']} history, {r.calls['tool_result']} tool result"
    out.append(f"summarizer calls: {calls} made ({split})" if r.summarize
               else f"summarizer calls: {calls} asked for in this dry run ({split}), none made")
    out.append("")
    out.append("diff of the messages (original -> forwarded):" if r.diff else "forwarded unchanged")
    out += r.diff
    return "\n".join(out)


def request_headers(api_key: str | None, session: str | None, focus: str | None,
                    key_header: str = "authorization") -> dict[str, str]:
    """The headers the client would send, its key under the header its client uses (the scope of
    stored records depends on it): `Authorization: Bearer` (the openai and anthropic Python
    packages) or a raw `x-api-key` (Claude Code with an API key)."""
    h: dict[str, str] = {}
    if api_key and key_header == "x-api-key":
        h["x-api-key"] = api_key
    elif api_key:
        h["Authorization"] = f"Bearer {api_key}"
    if session:
        h["x-compaction-session"] = session
    if focus:
        h["x-compaction-focus"] = focus
    return h

