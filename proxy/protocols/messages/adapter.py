"""Anthropic Messages (`POST /v1/messages`) as the neutral model, and back (design.md § Messages API).

An envelope is a message (a turn; cuts fall between messages, turns.py says where), plus one
SYSTEM envelope first for the top-level `system` when there is one. Items are the message's
blocks, one each: text (USER / ASSISTANT), tool_use and server_tool_use (TOOL_CALL), tool_result
(TOOL_RESULT, its error flag kept), image and document (the role's kind, read as "[image]"), and
OPAQUE for what the proxy never edits: thinking and redacted_thinking (signed), server tool
results, native compaction blocks, and any block type it does not know.

Rendering writes the envelopes the stages left alone from their bytes as sent, puts the system
envelope back as `system`, and re-places the cache breakpoints (breakpoints.py) once a summary
went in: the summary block carries one, the client's oldest give way past four.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Mapping

import orjson

from proxy import jsonbody
from proxy.adapter import (
    BUILT, Adapter, Request, SummaryCall, SummaryRequest, built_before, counted_after, splice)
from proxy.rendered import per_item, read_on, written_parts
from proxy import reuse as prefix
from proxy.recent_bodies import Prior
from proxy.protocols.messages import binding, breakpoints
from proxy.protocols.messages.body import block_text, blocks, parse_messages_body, too_deep
from proxy.protocols.messages.count import count_message, count_system
from proxy.protocols.messages.forward import CREDENTIAL_HEADERS
from proxy.protocols.messages.overflow import is_prompt_too_long
from proxy.protocols.messages.stream import MessagesEventChecker, messages_usage
from proxy.protocols.messages import summary
from proxy.protocols.messages.turns import (
    cut_allowed_at, native_compaction, summary_block, with_annotation, with_note, with_summary)
from proxy.config import Config
from proxy.hashing import DigestCache, message_digest
from proxy.model import Conversation, Envelope, Injected, Item, Kind, named
from proxy.exchange import Usage
from proxy.tokens import TokenCounter, encoding_name_for
from proxy.protocols.messages.recall import MESSAGES as DIALECT

log = logging.getLogger("proxy.messages")

_ROLE_KIND = {"user": Kind.USER, "assistant": Kind.ASSISTANT}
_SYSTEM = "system"  # the system envelope's value: {"system": <the body's system>}
MAX_KEPT = 4  # kept message lists whose breakpoints inject holds (a request applies two or three records)
SLOTS = "messages.slots"  # a request's forwarded messages and their breakpoints (render), in its __dict__
# Stable digests without the cache breakpoints: clients move them, and they are not content.
UNMARKED = DigestCache(canonical=breakpoints.unmarked)


def _item(block: Any, role: str) -> Item:
    if not isinstance(block, dict):
        return Item(Kind.OPAQUE, raw=block)
    t = block.get("type")
    if t == "text":
        return Item(_ROLE_KIND[role], block_text(block), raw=block)
    if t in ("tool_use", "server_tool_use"):
        args = jsonbody.dumps(block.get("input", {})).decode()
        return Item(Kind.TOOL_CALL, args, call_id=block.get("id"), name=str(block.get("name", "tool")), args=args,
                    raw=block)
    if t == "tool_result":
        inner = block.get("content")
        plain = inner is None or isinstance(inner, str) or all(
            isinstance(b, dict) and b.get("type") == "text" for b in inner)
        return Item(Kind.TOOL_RESULT, block_text(block), call_id=block.get("tool_use_id"),
                    is_error=bool(block.get("is_error")), plain=plain, raw=block)
    if t in ("image", "document"):
        return Item(_ROLE_KIND[role], f"[{t}]", plain=False, raw=block)
    return Item(Kind.OPAQUE, raw=block)  # thinking, redacted_thinking, server tool results, compaction, unknown


def _without_compaction(prior: Prior | None) -> int:
    """How many leading messages are known to carry no compaction block: those the previous
    request shared, when it had none (and no context_management) anywhere."""
    prev = prior.request if prior is not None else None
    return len(prior) if prev is not None and not prev.native_compaction else 0  # type: ignore[arg-type]


_Built = tuple[list[Envelope], int, dict[str, Item]]  # envelopes, the turn and the calls after them


def _kind(role: str, items: tuple[Item, ...]) -> Kind:
    """What a message is to the stages: a user message that answers tool calls is a tool result
    (whatever else it carries), an assistant message is the assistant's even when its thinking
    (opaque) comes first."""
    if role == "user":
        return Kind.TOOL_RESULT if any(it.kind is Kind.TOOL_RESULT for it in items) else Kind.USER
    return Kind.ASSISTANT


class MessagesAdapter(Adapter):
    protocol = "messages"
    dialect = DIALECT
    upstream_path = "/v1/messages"  # under anthropic.base_url
    credential_headers = CREDENTIAL_HEADERS

    # -- the body ------------------------------------------------------------------------------
    envelope_field = "messages"  # the array whose messages a body that grows shares (proxy/reuse.py)
    _kept: tuple[Any, ...] = ()  # inject's last kept messages and their breakpoints, newest first

    def parse(self, raw: bytes, counter: TokenCounter, cfg: Config, *, ratio: float | None = None,
              prior: Prior | None = None) -> Request:
        """The body checked and counted; the first messages as `prior` had them (parsed, checked,
        written, keyed and counted there). Each message is written once, here; the envelopes are
        made when a stage first reads them."""
        body, prior = prefix.parse_body(parse_messages_body, raw, prior, whole=False)
        model = body["model"]
        settings = cfg.model_settings(model)
        encoding = settings.encoding or encoding_name_for(model)
        system = [{_SYSTEM: body["system"]}] if body.get("system") else []
        messages = body["messages"]
        values = [*system, *messages]
        try:
            written, keys = prefix.written_and_keys(system, messages, prior)
        except orjson.JSONEncodeError:  # parsed JSON fails to write for one reason only: nesting
            raise too_deep() from None
        tokens = counted_after([self._count_system(v, encoding, counter, k) for v, k in zip(system, keys)], prior,
                               encoding, len(values), lambda i: count_message(counter, values[i], encoding, keys[i]))
        has_system = bool(system)
        built: dict[str, Any] = {}  # the envelopes once made, and where their making stopped
        after = built_before(prior)
        tools = body.get("tools")
        # (positional, in Request's order: keywords cost every request ~5k instructions)
        return Request(raw, body, model, bool(body.get("stream")),
                       Conversation(None, tokens, lambda: self.envelopes(values, has_system, after=after, built=built),
                                    values, len(system)),
                       keys, written, encoding, settings.token_ratio if ratio is None else ratio,
                       prefix.tools_tokens(counter, tools, encoding, prior), tools,
                       False, native_compaction(body, _without_compaction(prior)) is not None, {BUILT: built}, UNMARKED)

    def envelopes(self, values: list[Any], has_system: bool, *, after: _Built | None = None,
                  built: dict[str, Any] | None = None) -> list[Envelope]:
        """`values`: the system envelope's value first when `has_system`, then the messages. A tool
        result is named after the latest call with its id before it (model.name_results).
        `after`: the envelopes of the first messages and the turn and calls their making ended
        with (the previous request's, for the messages it shared); `built` gets this making's."""
        msgs = values[1:] if has_system else values
        out: list[Envelope] = list(after[0]) if after is not None else []
        turn = after[1] if after is not None else 0
        calls: dict[str, Item] = dict(after[2]) if after is not None else {}
        for i in range(len(out), len(msgs)):
            v = msgs[i]
            role = v["role"]
            items = tuple(named(_item(b, role), calls) for b in blocks(v.get("content")))
            if role == "user" and not any(it.kind is Kind.TOOL_RESULT for it in items):
                turn += 1
            out.append(Envelope(items, turn, cut_allowed_at(msgs, i), v, kind=_kind(role, items)))
        if built is not None:
            built["state"] = (out, turn, calls)
        return [self._system_envelope(values[0]), *out] if has_system else out

    @staticmethod
    def _system_envelope(value: dict[str, Any]) -> Envelope:
        text = "\n\n".join(block_text(b) for b in blocks(value[_SYSTEM]))
        return Envelope((Item(Kind.SYSTEM, text, raw=value[_SYSTEM]),), 0, False, value)

    def render(self, request: Request, forwarded: Conversation) -> bytes:
        if forwarded is request.conversation:
            return request.raw
        body = dict(request.body)
        envs = forwarded.envelopes
        if envs and envs[0].kind is Kind.SYSTEM:
            body["system"] = envs[0].value[_SYSTEM]
            envs = envs[1:]
        else:
            body.pop("system", None)
        body["messages"] = [e.value for e in envs]
        per = per_item(request, SLOTS, body["messages"], breakpoints.message_slots)
        body, dropped = breakpoints.fit(body, self._summary_path(body), per)
        if dropped:
            log.info("cache breakpoints: %d of the client's gave way to stay within %d (%s)", len(dropped),
                     breakpoints.MAX_BREAKPOINTS, ", ".join(".".join(map(str, s.path)) for s in dropped))
        return splice(body, "messages", written_parts(request, body["messages"], request.positions(values=True), jsonbody.dumps))

    @staticmethod
    def _summary_path(body: dict[str, Any]) -> tuple[Any, ...] | None:
        """The summary block's breakpoint: the first block of the first message when the proxy put
        it there (its cache_control is the summary's own object)."""
        msgs = body.get("messages") or []
        first = msgs[0].get("content") if msgs else None
        if isinstance(first, list) and first and isinstance(first[0], dict) and first[0].get("cache_control") is not None:
            return ("messages", 0, 0)
        return None

    # -- edits ---------------------------------------------------------------------------------
    def with_output(self, envelope: Envelope, item: int, text: str) -> Envelope:
        value = dict(envelope.value)
        content = list(blocks(value.get("content")))
        content[item] = with_note(content[item], text)
        value["content"] = content
        items = list(envelope.items)
        items[item] = replace(items[item], text=text, plain=True, raw=content[item])
        return Envelope(tuple(items), envelope.turn, envelope.cut_before, value, kind=envelope.kind)

    def inject(self, conv: Conversation, cut: int, summary: str, annotation: str) -> Injected:
        """The system envelope with the annotation as one more block, the summary (with a cache
        breakpoint: the compacted prefix is read from the cache from the next request on) as the
        first user message, merged into the first kept message when that is a user message."""
        envs = conv.envelopes
        n_system = conv.n_system
        system = envs[0].value[_SYSTEM] if n_system else None
        head = [self._system_envelope({_SYSTEM: with_annotation(system, annotation)})]
        kept = envs[cut:]
        done = self._kept_slots([e.value for e in kept])
        block = summary_block(summary, breakpoints.ttl_after(done))
        merged = with_summary([e.value for e in kept[:1]], block)
        first = self._envelope_like(merged[0], kept[0].turn if kept else 1)
        if kept and kept[0].value.get("role") == "user":
            return Injected([*head, first, *kept[1:]], 2, cut + 1)
        return Injected([*head, first, *kept], 2, cut)

    def _kept_slots(self, values: list[Any]) -> list[Any]:
        """The breakpoints of the messages an inject keeps: those of an earlier inject's that start
        with the same message (a request carrying the previous one's record, or its prepared one)
        for the messages at the same places, the others read. MAX_KEPT lists held (the last
        conversations'; a thread reads the tuple once and puts a new one)."""
        held = self._kept
        before = next((k for k in held if values and k[0] and k[0][0] is values[0]), ((), ()))
        done = read_on(before, values, breakpoints.message_slots)
        self._kept = (done, *(k for k in held if k is not before))[:MAX_KEPT]
        return done[1]

    def binds_reasoning(self, request: Request) -> bool:
        return binding.binds(request.model)

    def unbound(self, envelope: Envelope) -> Envelope | None:
        value = binding.without_thinking(envelope.value)
        if value is None:
            return None
        items = tuple(it for it in envelope.items
                      if not (isinstance(it.raw, dict) and it.raw.get("type") in binding.THINKING))
        items = items or tuple(_item(b, "assistant") for b in value["content"])
        return Envelope(items, envelope.turn, envelope.cut_before, value, kind=envelope.kind)

    def without_stale_reasoning(self, status: int, answer: bytes, data: bytes,
                                headers: Mapping[str, str]) -> tuple[bytes, dict[str, str]] | None:
        if not binding.is_stale_thinking(status, answer):
            return None
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        again = binding.dropping_stale(body, headers.get("anthropic-beta"))
        if again is None:
            return None
        return jsonbody.dumps(again[0]), {"anthropic-beta": again[1]}

    def _envelope_like(self, value: dict[str, Any], turn: int) -> Envelope:
        items = tuple(_item(b, value["role"]) for b in blocks(value.get("content")))
        return Envelope(items, turn, True, value, kind=_kind(value["role"], items))

    def count(self, envelope: Envelope, encoding: str, counter: TokenCounter) -> int:
        return self._count(envelope, encoding, counter, message_digest(envelope.value))

    def _count(self, envelope: Envelope, encoding: str, counter: TokenCounter, key: Any) -> int:
        if envelope.kind is Kind.SYSTEM:
            return self._count_system(envelope.value, encoding, counter, key)
        return count_message(counter, envelope.value, encoding, key)

    @staticmethod
    def _count_system(value: dict[str, Any], encoding: str, counter: TokenCounter, key: Any) -> int:
        """The system prompt, cached like a message (agents resend the same long one every turn)."""
        return counter.count_keyed(encoding, ("messages", _SYSTEM, key), lambda: count_system(counter, value, encoding))

    # -- the wire ------------------------------------------------------------------------------
    def is_overflow(self, status: int, body: bytes) -> bool:
        return is_prompt_too_long(status, body)

    def event_checker(self) -> MessagesEventChecker:
        return MessagesEventChecker()

    def answer_usage(self, answer: Any) -> Usage | None:
        return messages_usage(answer.get("usage")) if isinstance(answer, dict) else None

    def stream_usage(self, checker: Any) -> Usage | None:
        return messages_usage(checker.usage)

    # -- the proxy's own summarizer calls (summary.py) ------------------------------------------
    def upstream(self, cfg: Config) -> Any:
        return cfg.anthropic

    def riding_end(self, values: list[Any], first_kept: int, request: Request | None = None) -> int:
        body = request.body if request is not None else None
        return summary.riding_end(values, first_kept, isinstance(body, dict) and body.get("cache_control") is not None)

    def summary_request(self, call: SummaryCall, base_url: str) -> SummaryRequest:
        body = summary.summary_body(call.model, call.prompt, call.output_cap, call.system, call.prefix, call.tools,
                                    call.request.body if call.request is not None else None)
        return SummaryRequest(call, base_url, self.upstream_path, jsonbody.dumps(body),
                              {"anthropic-version": summary.DEFAULT_VERSION})

    def summary_text(self, status: int, answer: bytes, usage: dict[str, Any] | None = None) -> str:
        return summary.answer_text(answer, usage)
