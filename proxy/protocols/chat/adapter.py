"""Chat Completions (`POST /v1/chat/completions`) as the neutral model, and back (design.md § Protocol adapters).

An envelope is a message. Its items: a system or developer message is one SYSTEM item, a user
message one USER item, an assistant message one ASSISTANT item (its text, maybe empty) and one
TOOL_CALL per entry of `tool_calls`, a `tool` (or legacy `function`) message one TOOL_RESULT. A cut
may fall before a user or an assistant message, so a call and its results always stay together.
A turn starts at each user message (turn 0: what comes before the first).

Each message is written to JSON once, at parse: those bytes key the caches and are what a
rendered body carries for every message the stages left alone.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import partial
from typing import Any

import orjson

from proxy import jsonbody
from proxy.adapter import (BUILT, OPENAI_CACHE_FIELDS, Adapter, Request, SummaryCall, SummaryRequest, built_before,
                           repeated_fields, splice)
from proxy import reuse as prefix
from proxy.reuse import Prior
from proxy.rendered import value_written, written_parts
from proxy.protocols.chat.body import SYSTEM_ROLES, parse_chat_body, too_deep, validate_message
from proxy.config import Config
from proxy.credentials import OPENAI_HEADERS
from proxy.hashing import message_digest
from proxy.model import Conversation, Envelope, Injected, Item, Kind
from proxy.tokens import TokenCounter, encoding_name_for
from proxy.upstream import SummarizerError, is_context_overflow
from proxy.protocols.chat.recall import CHAT as DIALECT

_KIND_OF_ROLE = {
    "system": Kind.SYSTEM, "developer": Kind.SYSTEM, "user": Kind.USER, "assistant": Kind.ASSISTANT,
    "tool": Kind.TOOL_RESULT, "function": Kind.TOOL_RESULT,
}
# Where the rendered body's messages go: a token no client can know, so no string it sent matches.
# The output cap of a summarizer call: OpenAI wants `max_completion_tokens` (its newer models reject
# `max_tokens`, and it rejects both at once), while several compatible servers (llama.cpp's among
# them) silently ignore `max_completion_tokens` and honour only `max_tokens`. So OpenAI's own hosts
# get the former, other servers the latter, either falls back to the other when refused, and what
# an upstream took is remembered per model.
CAP_PARAMS = ("max_completion_tokens", "max_tokens")
_REFUSAL = re.compile(r"unsupported|not supported|unrecognized|unknown|extra|invalid", re.I)
MAX_CAPS_KNOWN = 1024


class ChatAdapter(Adapter):
    protocol = "chat"
    dialect = DIALECT
    upstream_path = "/chat/completions"
    credential_headers = OPENAI_HEADERS
    empty_stream = ("the event stream ended before its first event (llama.cpp does this for a prompt over its "
                    "context window)")
    empty_stream_overflows = True

    def __init__(self) -> None:
        # What each upstream took as a summarizer call's output cap: (base URL, model) -> parameter.
        self._caps: dict[tuple[str, str], str] = {}

    # -- the body ------------------------------------------------------------------------------
    envelope_field = "messages"

    def parse(self, raw: bytes, counter: TokenCounter, cfg: Config, *, ratio: float | None = None,
              prior: Prior | None = None) -> Request:
        body, prior = prefix.parse_body(parse_chat_body, raw, prior)
        return self.request_of(body, raw, counter, cfg, ratio=ratio, prior=prior)

    def request_of(self, body: dict[str, Any], raw: bytes, counter: TokenCounter, cfg: Config, *,
                   ratio: float | None = None, prior: Prior | None = None) -> Request:
        """A checked chat body (its messages are checked here, once per distinct message) as the
        model; the first messages as `prior` had them."""
        model = body["model"]
        settings = cfg.model_settings(model)
        encoding = settings.encoding or encoding_name_for(model)
        messages = body["messages"]
        try:
            written, keys = prefix.written_and_keys([], messages, prior)
        except orjson.JSONEncodeError:  # parsed JSON fails to write for one reason only: nesting
            raise too_deep() from None
        tokens = list(prior.tokens_for(encoding) or ()) if prior is not None else []
        for i in range(len(tokens), len(messages)):
            m, k = messages[i], keys[i]
            n = counter.cached(encoding, k)
            if n is None:  # a message not seen before: checked once, then counted
                validate_message(m, f"messages[{i}]")
                n = counter.count_message(m, encoding, k)
            tokens.append(n)
        n_system = 0
        while n_system < len(messages) and messages[n_system].get("role") in SYSTEM_ROLES:
            n_system += 1
        built: dict[str, Any] = {}  # the envelopes once made, and where their making stopped
        after = built_before(prior)
        conv = Conversation(None, tokens, lambda: self.envelopes(messages, after=after, built=built), messages, n_system)
        tools = body.get("tools")
        # (positional, in Request's order: keywords cost every request ~5k instructions)
        return Request(raw, body, model, bool(body.get("stream")), conv, keys, written, encoding,
                       settings.token_ratio if ratio is None else ratio,
                       prefix.tools_tokens(counter, tools, encoding, prior), tools, False, False, {BUILT: built})

    def envelopes(self, messages: list[dict[str, Any]], *, after: _Built | None = None,
                  built: dict[str, Any] | None = None) -> list[Envelope]:
        """The messages as envelopes, their items made when first read; a tool result is named
        (and given the arguments of) the latest call with its id before it, as
        model.name_results does. `after`: the envelopes of the first messages and the state their
        making ended in (the previous request's, for the messages it shared); `built` gets this
        making's."""
        out: list[Envelope] = list(after[0]) if after is not None else []
        calls: dict[str, dict[str, Any]] = dict(after[2]) if after is not None else {}  # call id -> its latest call
        turn = after[1] if after is not None else 0
        for m in messages[len(out):]:
            role = m.get("role")
            kind = _KIND_OF_ROLE.get(role, Kind.OPAQUE)  # type: ignore[arg-type]
            if kind is Kind.USER:
                turn += 1
            elif kind is Kind.TOOL_RESULT:
                call_id = m.get("tool_call_id")
                out.append(Envelope(None, turn, False, m, kind=kind,
                                    make=partial(_result_items, m, calls.get(call_id) if isinstance(call_id, str) else None)))
                continue
            elif kind is Kind.ASSISTANT and m.get("tool_calls"):
                for c in m["tool_calls"]:
                    if isinstance(c, dict) and isinstance(c.get("id"), str):
                        calls[c["id"]] = c
            out.append(Envelope(None, turn, kind is Kind.USER or kind is Kind.ASSISTANT, m, kind=kind,
                                make=partial(_items, m, kind)))
        if built is not None:
            built["state"] = (out, turn, calls)
        return out

    def envelope(self, m: dict[str, Any], turn: int) -> Envelope:
        """One message (not a tool result) as an envelope, made now."""
        kind = _KIND_OF_ROLE.get(m.get("role"), Kind.OPAQUE)  # type: ignore[arg-type]
        return Envelope(_items(m, kind), turn, kind is Kind.USER or kind is Kind.ASSISTANT, m)

    def render(self, request: Request, forwarded: Conversation) -> bytes:
        original = request.conversation
        if forwarded is original:
            return request.raw
        parts = written_parts(request, forwarded.envelopes, request.positions(), value_written)
        return splice(dict(request.body), "messages", parts)

    # -- edits ---------------------------------------------------------------------------------
    def with_output(self, envelope: Envelope, item: int, text: str) -> Envelope:
        value = dict(envelope.value)
        value["content"] = text
        items = list(envelope.items)
        items[item] = replace(items[item], text=text, plain=True, raw=text)
        return Envelope(items, envelope.turn, envelope.cut_before, value)

    def inject(self, conv: Conversation, cut: int, summary: str, annotation: str) -> Injected:
        """Leading system messages (the first annotated) + the summary + messages[cut:]. When the
        first kept message is a user message the summary is merged into it, summary first, so roles
        still alternate (several open-model chat templates reject two user turns in a row)."""
        n_system = conv.n_system
        envs = conv.envelopes
        if n_system:
            first = dict(envs[0].value)
            first["content"] = _append_text(first.get("content"), annotation)
            head = [self.envelope(first, envs[0].turn), *envs[1:n_system]]
        else:
            head = [self.envelope({"role": "system", "content": annotation}, 0)]
        kept = envs[cut:]
        if kept and kept[0].value.get("role") == "user":
            merged = dict(kept[0].value)
            merged["content"] = _prepend_text(merged.get("content"), summary)
            head.append(self.envelope(merged, kept[0].turn))
            return Injected([*head, *kept[1:]], len(head), cut + 1)
        head.append(self.envelope({"role": "user", "content": summary}, kept[0].turn if kept else 0))
        return Injected([*head, *kept], len(head), cut)

    def count(self, envelope: Envelope, encoding: str, counter: TokenCounter) -> int:
        return counter.count_message(envelope.value, encoding, message_digest(envelope.value))

    # -- the wire ------------------------------------------------------------------------------
    def is_overflow(self, status: int, body: bytes) -> bool:
        return is_context_overflow(status, body)

    # -- the proxy's own summarizer calls -------------------------------------------------------
    def summary_request(self, call: SummaryCall, base_url: str) -> SummaryRequest:
        """A chat completion: the instructions and the prompt as two messages; riding the cache,
        the forwarded messages as they were, then the prompt (tools declared, tool_choice none)."""
        return self._summary(call, base_url, self._caps.get((base_url, call.model)) or default_cap_param(base_url))

    def _summary(self, call: SummaryCall, base_url: str, param: str) -> SummaryRequest:
        prompt = {"role": "user", "content": call.prompt}
        if call.prefix is not None:
            body: dict[str, Any] = {"model": call.model, "messages": [*call.prefix, prompt]}
            if call.tools:
                body.update(tools=call.tools, tool_choice="none")
            body.update(repeated_fields(call.request.body if call.request is not None else None, OPENAI_CACHE_FIELDS))
        else:
            body = {"model": call.model, "messages": [{"role": "system", "content": call.system}, prompt]}
        body.update({"stream": False, param: call.output_cap})
        return SummaryRequest(call, base_url, self.upstream_path, jsonbody.dumps(body), form=param)

    def summary_retry(self, sent: SummaryRequest, status: int, answer: bytes) -> SummaryRequest | None:
        """Refused for its output-cap parameter: the other one (and remembered for this upstream)."""
        param = sent.form
        text = answer[:4000].decode("utf-8", "replace")
        if status != 400 or param not in text or not _REFUSAL.search(text):
            return None
        other = CAP_PARAMS[1] if param == CAP_PARAMS[0] else CAP_PARAMS[0]
        if len(self._caps) >= MAX_CAPS_KNOWN:  # model names come from clients
            self._caps.clear()
        self._caps[(sent.base_url, sent.call.model)] = other
        return self._summary(sent.call, sent.base_url, other)

    def summary_text(self, status: int, answer: bytes, usage: dict[str, Any] | None = None) -> str:
        try:
            data = orjson.loads(answer)
            if usage is not None and isinstance(data.get("usage"), dict):
                usage.update(data["usage"])
            message = data["choices"][0]["message"]
            content = message.get("content")
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            raise SummarizerError("invalid", "the upstream's answer is not a chat completion") from None
        if message.get("tool_calls"):
            # The model carried the conversation on instead of summarizing it.
            raise SummarizerError("invalid", "the answer is a tool call, not a summary", reason="tool_call")
        if isinstance(content, list):  # some servers answer with content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise SummarizerError("invalid", "the upstream's answer has no text content")
        return content


def default_cap_param(base_url: str) -> str:
    host = base_url.split("://", 1)[-1].split("/", 1)[0].lower()
    return CAP_PARAMS[0] if host.endswith("openai.com") or host.endswith("openai.azure.com") else CAP_PARAMS[1]


_Built = tuple[list[Envelope], int, dict[str, dict[str, Any]]]  # envelopes, the turn and the calls after them


def _items(m: dict[str, Any], kind: Kind) -> tuple[Item, ...]:
    content = m.get("content")
    text = content if isinstance(content, str) else content_text(content)
    item = Item(kind, text, plain=_plain(content), raw=content)
    tool_calls = m.get("tool_calls") if kind is Kind.ASSISTANT else None
    if tool_calls:
        return (item, *(_call(c) for c in tool_calls if isinstance(c, dict)))
    return (item,)


def _result_items(m: dict[str, Any], call: dict[str, Any] | None) -> tuple[Item, ...]:
    """A tool result, named after `call` (the latest call with its id before it), else its own name."""
    content = m.get("content")
    text = content if isinstance(content, str) else content_text(content)
    call_id = m.get("tool_call_id")
    if call is not None:
        c = _call(call)
        name, args = c.name or "tool", c.args
    else:
        name, args = (m["name"] if isinstance(m.get("name"), str) else None), ""
    return (Item(Kind.TOOL_RESULT, text, call_id=call_id if isinstance(call_id, str) else None, name=name, args=args,
                 plain=_plain(content), raw=content),)


def _call(c: dict[str, Any]) -> Item:
    fn = c.get("function")
    name = str(fn.get("name", "tool")) if isinstance(fn, dict) else "tool"
    args = str(fn.get("arguments", "")) if isinstance(fn, dict) else ""
    call_id = c.get("id")
    return Item(Kind.TOOL_CALL, args, call_id=call_id if isinstance(call_id, str) else None, name=name, args=args, raw=c)


def content_text(content: Any) -> str:
    """Message content as text; images become [image], other non-text parts their type."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict):
                continue
            kind = p.get("type")
            if isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif kind == "refusal" and isinstance(p.get("refusal"), str):
                parts.append(p["refusal"])
            elif kind in ("image_url", "input_image", "image"):
                parts.append("[image]")
            else:
                parts.append(f"[{kind}]")
        return "\n".join(parts)
    return str(content)


def _plain(content: Any) -> bool:
    """Text only: a string, or parts that are all text (images and files are not ours to rewrite)."""
    return isinstance(content, str) or (
        isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content))


def _append_text(content: Any, text: str) -> Any:
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    if isinstance(content, str) and content:
        return content + "\n\n" + text
    return text


def _prepend_text(content: Any, text: str) -> Any:
    if isinstance(content, list):
        return [{"type": "text", "text": text}, *content]
    if isinstance(content, str) and content:
        return text + "\n\n" + content
    return text
