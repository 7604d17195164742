"""The Responses API (`POST /v1/responses`, WebSocket `response.create`) as the neutral model,
and back (design.md § Responses API).

An envelope is an input item (proxy/protocols/responses/items.py classifies them, pairs calls with their
outputs by call id, and marks the cuts). `instructions` plays the system prompt's part: it is the
first envelope of the conversation, a SYSTEM one whose value is an `_Instructions` (a dict no
client JSON can make), so the stages see it (counted, annotated, never summarized) and `render` writes it back to
the `instructions` field instead of `input`. The summary goes in as a user message item after the
leading system/developer items (merged into the first kept user message, as in chat, so
templates that refuse two user turns in a row still work).

Stateful requests (`previous_response_id`, `conversation`) and those asking for native compaction
(`context_management`) are marked for the flow: the first are forwarded untouched, the second get
tool-result notes but no history compaction.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from proxy import jsonbody
from proxy.rendered import value_written, written_parts
from proxy.adapter import (BUILT, OPENAI_CACHE_FIELDS, Adapter, Request, SummaryCall, SummaryRequest, built_before,
                           repeated_fields, splice)
from proxy.protocols.chat.adapter import ChatAdapter
from proxy import reuse as prefix
from proxy.reuse import Prior
from proxy.config import Config
from proxy.credentials import OPENAI_HEADERS
from proxy.sse import EventChecker, Read
from proxy.hashing import message_digest
from proxy.model import Conversation, Envelope, Injected, Item, Kind, named
from proxy.exchange import Usage
from proxy.protocols.responses import items as ri
from proxy.protocols.responses.body import parse_responses_body, too_deep
from proxy.protocols.responses.stream import ResponsesEventChecker, read_preamble, responses_usage
from proxy.tokens import TokenCounter, encoding_name_for
from proxy.upstream import SummarizerError, is_context_overflow
from proxy.protocols.responses.recall import RESPONSES as DIALECT

ITEM_OVERHEAD = 4  # framing per input item, like a chat message's
MIN_OUTPUT_TOKENS = 16  # the Responses API refuses a smaller max_output_tokens
_KINDS = {ri.SYSTEM: Kind.SYSTEM, ri.USER: Kind.USER, ri.ASSISTANT: Kind.ASSISTANT, ri.TOOL_CALL: Kind.TOOL_CALL,
          ri.TOOL_RESULT: Kind.TOOL_RESULT, ri.OPAQUE: Kind.OPAQUE}


class _Instructions(dict):  # type: ignore[type-arg]
    """The instructions envelope's value, {"instructions": text}: JSON like any value (so it is
    digested and counted the same in every process), told apart from input items by its class."""


def _instructions_value(text: str) -> _Instructions:
    return _Instructions(instructions=text)


_Built = tuple[list[Envelope], ri.Grown, dict[str, Item]]  # envelopes, their parse, the calls after them


def _is_instructions(value: Any) -> bool:
    return isinstance(value, _Instructions)


def _plain_output(output: Any) -> bool:
    """A tool output a note may replace: text only."""
    return isinstance(output, str) or (isinstance(output, list) and all(
        isinstance(p, dict) and p.get("type") in ("input_text", "output_text") for p in output))


class ResponsesAdapter(Adapter):
    protocol = "responses"
    dialect = DIALECT
    upstream_path = "/responses"
    credential_headers = OPENAI_HEADERS

    # -- the body ------------------------------------------------------------------------------
    envelope_field = "input"  # the array whose items a body that grows shares (proxy/reuse.py)

    def parse(self, raw: bytes, counter: TokenCounter, cfg: Config, *, ratio: float | None = None,
              prior: Prior | None = None) -> Request:
        body, prior = prefix.parse_body(parse_responses_body, raw, prior, whole=False)
        return self.request_of(raw, body, counter, cfg, ratio=ratio, prior=prior)

    def request_of(self, raw: bytes, body: dict[str, Any], counter: TokenCounter, cfg: Config, *,
                   ratio: float | None = None, extra: dict[str, Any] | None = None,
                   prior: Prior | None = None) -> Request:
        """A parsed body as a Request (the WebSocket's `response.create` comes parsed already);
        the first input items as `prior` had them (written, keyed and counted there). Each item
        is written once, here; the envelopes are made when a stage first reads them."""
        model = body["model"]
        settings = cfg.model_settings(model)
        encoding = settings.encoding or encoding_name_for(model)
        inp = body.get("input")
        # the body's own list when it is one (read only here; values is a list of its own)
        items: list[Any] = inp if isinstance(inp, list) else ri.input_items(body)
        instructions = body.get("instructions")
        lead: list[Any] = [_instructions_value(instructions)] if isinstance(instructions, str) else []
        values = [*lead, *items]
        try:
            written, keys = prefix.written_and_keys(lead, items, prior)
        except orjson.JSONEncodeError:  # parsed JSON fails to write for one reason only: nesting
            raise too_deep() from None
        counted = prior.tokens_for(encoding) if prior is not None else None
        tokens = [self._count(v, encoding, counter, k) for v, k in zip(lead, keys)]
        tokens += counted if counted is not None else []
        tokens += [self._count(values[i], encoding, counter, keys[i]) for i in range(len(tokens), len(values))]
        n_system = len(lead)
        while n_system < len(values) and ri.item_type(values[n_system]) == "message" \
                and values[n_system].get("role") in ri.SYSTEM_ROLES:
            n_system += 1
        tools = body.get("tools")
        built: dict[str, Any] = {}  # the envelopes once made, and where their making stopped
        after = built_before(prior)
        # (positional, in Request's order: keywords cost every request ~5k instructions)
        return Request(raw, body, model, bool(body.get("stream")),
                       Conversation(None, tokens, lambda: self.envelopes(values, after=after, built=built), values, n_system),
                       keys, written, encoding, settings.token_ratio if ratio is None else ratio,
                       prefix.tools_tokens(counter, tools, encoding, prior), tools,
                       ri.stateful(body) is not None, ri.native_compaction(body), {**(extra or {}), BUILT: built})

    def envelopes(self, values: list[Any], *, after: _Built | None = None,
                  built: dict[str, Any] | None = None) -> list[Envelope]:
        """`after`: the envelopes of the first input items, their parse and the calls their making
        ended with (the previous request's, for the items it shared): only the new items are
        made, and the shared ones whose cut moved (ri.grown); `built` gets this making's."""
        lead = 1 if values and _is_instructions(values[0]) else 0
        made, before, calls = after if after is not None else ([], None, {})
        parsed = ri.grown(values[lead:], before)
        kept = parsed.kept if made else 0
        calls = dict(calls) if kept else {}  # call id -> its latest call (model.name_results)
        out = [e if e.cut_before is cut else Envelope(e.items, e.turn, cut, e.value)
               for e, cut in zip(made[:kept], parsed.cuts)]
        for e in parsed.entries[len(out):]:
            out.append(Envelope((named(self._item(e), calls),), e.turn, parsed.cuts[e.index], e.raw))
        if built is not None:
            built["state"] = (out, parsed, calls)
        if lead:
            return [Envelope((Item(Kind.SYSTEM, values[0]["instructions"], raw=values[0]),), 0, False, values[0]), *out]
        return out

    def _item(self, e: ri.Entry) -> Item:
        kind = _KINDS[e.kind]
        if kind is Kind.TOOL_CALL:
            raw = e.raw
            args = raw.get("arguments", raw.get("input", "")) if isinstance(raw, dict) else ""
            return Item(kind, e.text, call_id=e.call_id, name=e.name, args=args if isinstance(args, str) else
                        jsonbody.dumps(args).decode(), raw=e.raw)
        if kind is Kind.TOOL_RESULT:
            output = e.raw.get("output") if isinstance(e.raw, dict) else None
            plain = e.type in ri.TEXT_OUTPUTS and _plain_output(output)
            return Item(kind, e.text, call_id=e.call_id, name=e.name, plain=plain, raw=e.raw)
        return Item(kind, e.text, raw=e.raw)

    def render(self, request: Request, forwarded: Conversation) -> bytes:
        original = request.conversation
        if forwarded is original:
            return request.raw
        envs = forwarded.envelopes
        written = written_parts(request, envs, request.positions(), value_written, lambda e: _is_instructions(e.value))
        out = dict(request.body)
        if instructions := [e for e, w in zip(envs, written) if w is None]:  # (not in the array: the field)
            out["instructions"] = instructions[-1].value["instructions"]
        return splice(out, "input", [w for w in written if w is not None])

    # -- edits ---------------------------------------------------------------------------------
    def with_output(self, envelope: Envelope, item: int, text: str) -> Envelope:
        value = dict(envelope.value)
        value["output"] = text
        items = list(envelope.items)
        items[item] = replace(items[item], text=text, plain=True, raw=value)
        return Envelope(tuple(items), envelope.turn, envelope.cut_before, value)

    def inject(self, conv: Conversation, cut: int, summary: str, annotation: str) -> Injected:
        """Instructions (annotated; made of the annotation when there were none) + the other
        leading system/developer items + the summary as a user message + the items from `cut` on."""
        envs = conv.envelopes
        n_system = conv.n_system
        if envs and _is_instructions(envs[0].value):
            text = envs[0].value["instructions"]
            annotated = _instructions_value(f"{text}\n\n{annotation}" if text else annotation)
            rest = list(envs[1:n_system])
        else:
            annotated = _instructions_value(annotation)
            rest = list(envs[:n_system])
        head = [Envelope((Item(Kind.SYSTEM, annotated["instructions"], raw=annotated),), 0, False, annotated), *rest]
        kept = envs[cut:]
        first = kept[0].value if kept else None
        if isinstance(first, dict) and ri.item_type(first) == "message" and first.get("role") == "user":
            merged = dict(first)
            merged["content"] = _prepend_parts(first.get("content"), summary)
            head.append(self._single(merged, kept[0].turn, True))
            return Injected([*head, *kept[1:]], len(head), cut + 1)
        message = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": summary}]}
        head.append(self._single(message, kept[0].turn if kept else 0, True))
        return Injected([*head, *kept], len(head), cut)

    def _single(self, value: dict[str, Any], turn: int, cut_before: bool) -> Envelope:
        (entry,) = ri.parse_items([value])
        return Envelope((self._item(entry),), turn, cut_before, value)

    def count(self, envelope: Envelope, encoding: str, counter: TokenCounter) -> int:
        return self._count(envelope.value, encoding, counter, message_digest(envelope.value))

    def _count(self, value: Any, encoding: str, counter: TokenCounter, key: Any) -> int:
        key = ("responses", key)
        n = counter.cached(encoding, key)  # (looked up first: no counting closure made for a count known)
        return n if n is not None else counter.count_keyed(encoding, key, lambda: self._count_uncached(value, encoding, counter))

    def _count_uncached(self, value: Any, encoding: str, counter: TokenCounter) -> int:
        if _is_instructions(value):
            return counter.count_text(value["instructions"], encoding)
        t = ri.item_type(value)
        if t == "message":
            return ITEM_OVERHEAD + counter.count_text(str(value.get("role", "")), encoding) + counter.count_content(
                value.get("content"), encoding)
        # (the item's text is its classification's: pairing, turns and cuts, which parse_items
        # adds, do not change it, and each new call and output of every request is counted here)
        return ITEM_OVERHEAD + counter.count_text(ri.classify(value, 0).text, encoding)

    # -- the wire ------------------------------------------------------------------------------
    def is_overflow(self, status: int, body: bytes) -> bool:
        return is_context_overflow(status, body)

    def event_checker(self) -> EventChecker:
        return ResponsesEventChecker()

    async def stream_preamble(self, upstream: Any, *, hold: bool = True) -> tuple[bytes, bool, Read | None]:
        """Up to the first event past the preamble: a stream that fails for length before any
        output may still be retried. Without `hold` the first bytes go on as they came (holding
        `response.created` until the model's first output would only delay it)."""
        if not hold:
            return await upstream.content.readany(), False, None
        held, read = await read_preamble(upstream)
        return held, read.checker.overflow, read

    def answer_usage(self, answer: Any) -> Usage | None:
        return responses_usage(answer.get("usage")) if isinstance(answer, dict) else None

    def stream_usage(self, checker: EventChecker) -> Usage | None:
        return responses_usage(checker.usage)

    # -- the proxy's own summarizer calls -------------------------------------------------------
    def summarizer(self, cfg: Config) -> Adapter:
        """Chat completions when the upstream offers only those (`responses.summarizer_api`)."""
        return CHAT if cfg.responses.summarizer_api == "chat" else self

    def summary_request(self, call: SummaryCall, base_url: str) -> SummaryRequest:
        """A Responses call, non-streaming with `store: false` (nothing of it kept upstream): the
        instructions as `instructions`, the prompt as a user message item; riding the cache, the
        forwarded items as they were (the instructions envelope as `instructions`), the tools
        declared with tool_choice none, then the prompt."""
        prompt = {"type": "message", "role": "user", "content": call.prompt}
        body: dict[str, Any] = {"model": call.model}
        if call.prefix is not None:
            items = list(call.prefix)
            if items and _is_instructions(items[0]):
                body["instructions"] = items.pop(0)["instructions"]
            body["input"] = [*items, prompt]
            if call.tools:
                body.update(tools=call.tools, tool_choice="none")
            body.update(repeated_fields(call.request.body if call.request is not None else None, OPENAI_CACHE_FIELDS))
        else:
            body.update(instructions=call.system, input=[prompt])
        body.update(store=False, stream=False, max_output_tokens=max(MIN_OUTPUT_TOKENS, call.output_cap))
        return SummaryRequest(call, base_url, self.upstream_path, jsonbody.dumps(body))

    def summary_text(self, status: int, answer: bytes, usage: dict[str, Any] | None = None) -> str:
        """The text of the answer's message items (output_text parts)."""
        try:
            data = orjson.loads(answer)
            output = data["output"]
            if not isinstance(output, list):
                raise TypeError
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise SummarizerError("invalid", "the upstream's answer is not a Responses response") from None
        u = data.get("usage")
        if usage is not None and isinstance(u, dict):
            # Both spellings: the bill and the metrics read the chat names.
            usage.update(u)
            usage.setdefault("prompt_tokens", u.get("input_tokens"))
            usage.setdefault("completion_tokens", u.get("output_tokens"))
            details = u.get("input_tokens_details")
            if isinstance(details, dict) and "prompt_tokens_details" not in usage:
                usage["prompt_tokens_details"] = {"cached_tokens": details.get("cached_tokens") or 0}
        texts = []
        calls = False
        for item in output:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "message":
                for part in item.get("content") or []:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        texts.append(part["text"])
            elif item.get("type") in ("function_call", "custom_tool_call"):
                calls = True
        if not texts and calls:
            raise SummarizerError("invalid", "the answer is a tool call, not a summary", reason="tool_call")
        if not texts:
            raise SummarizerError("invalid", "the upstream's answer has no text")
        return "".join(texts)


CHAT = ChatAdapter()  # the summarizer calls' protocol when the upstream speaks only chat


def _prepend_parts(content: Any, text: str) -> Any:
    part = {"type": "input_text", "text": text}
    if isinstance(content, list):
        return [part, *content]
    if isinstance(content, str) and content:
        return [part, {"type": "input_text", "text": content}]
    return [part]
