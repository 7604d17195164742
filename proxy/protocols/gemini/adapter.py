"""Google's Gemini API (`models/{model}:generateContent`, `:streamGenerateContent`,
`:countTokens`) as the neutral model, and back (design.md § Gemini API).

An envelope is a content (one role's turn: cuts fall between contents, turns.py says where), plus
one SYSTEM envelope first for `systemInstruction` when there is one. Items are the content's
parts: text (USER / ASSISTANT), functionCall (TOOL_CALL), functionResponse (TOOL_RESULT, paired by
its `id`, or by name and order as the API pairs them), inlineData and fileData (the role's kind,
never edited), and OPAQUE for what the proxy never edits: thought parts, and parts of kinds it
does not read. A part's `thoughtSignature` stays on it byte for byte while its content is kept.
The model is not in the body but in the path: the route gives it to `parse`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from proxy import jsonbody
from proxy import reuse as prefix
from proxy.adapter import (
    BUILT, Adapter, Request, SummaryCall, SummaryRequest, built_before, counted_after, splice)
from proxy.config import Config
from proxy.errors import Uncompactable
from proxy.hashing import message_digest
from proxy.model import Conversation, Envelope, Injected, Item, Kind, named
from proxy.exchange import Usage
from proxy.recent_bodies import Prior
from proxy.rendered import value_written, written_parts
from proxy.protocols.gemini import summary, turns
from proxy.protocols.gemini.body import (
    CALL, CONTENTS, MEDIA, RESPONSE, parse_gemini_body, part_text, parts, role, system_text, too_deep)
from proxy.protocols.gemini.count import count_content
from proxy.protocols.gemini.recall import GEMINI_RECALL
from proxy.protocols.gemini.stream import GeminiEventChecker, gemini_usage, is_overflow
from proxy.tokens import TokenCounter, encoding_name_for

_ROLE_KIND = {"user": Kind.USER, "model": Kind.ASSISTANT}
_SYSTEM = summary.SYSTEM_KEY
CREDENTIAL_HEADERS = ("x-goog-api-key", "authorization")
# Models that sign their calls and check the signatures of the current turn (Gemini 3 on): a turn
# made under a prefix the compaction changed gives its signatures up (turns.unsigned).
SIGNING_MODELS = ("gemini-3",)


def _item(part: Any, role_: str, key: str | None) -> Item:
    if not isinstance(part, dict) or part.get("thought") is True:
        return Item(Kind.OPAQUE, raw=part)
    if "text" in part:
        return Item(_ROLE_KIND[role_], str(part["text"]), raw=part)
    if CALL in part:
        args = jsonbody.dumps(part[CALL].get("args", {})).decode()
        return Item(Kind.TOOL_CALL, args, call_id=key, name=str(part[CALL].get("name", "tool")), args=args, raw=part)
    if RESPONSE in part:
        return Item(Kind.TOOL_RESULT, part_text(part), call_id=key, name=str(part[RESPONSE].get("name", "tool")),
                    is_error=turns.is_error(part[RESPONSE]), plain=True, raw=part)
    for media in MEDIA:
        if media in part:
            return Item(_ROLE_KIND[role_], f"[{media}]", plain=False, raw=part)
    return Item(Kind.OPAQUE, raw=part)


def _kind(role_: str, items: tuple[Item, ...]) -> Kind:
    if role_ == "user":
        return Kind.TOOL_RESULT if any(it.kind is Kind.TOOL_RESULT for it in items) else Kind.USER
    return Kind.ASSISTANT


def _items(content: dict[str, Any]) -> tuple[Item, ...]:
    r = role(content)
    return tuple(_item(p, r, k) for p, k in zip(parts(content), turns.call_ids(content)))


_Built = tuple[list[Envelope], int, dict[str, Item]]  # envelopes, the turn and the calls after them


class GeminiAdapter(Adapter):
    protocol = "gemini"
    dialect = GEMINI_RECALL
    upstream_path = ""  # the client's own path (the model is in it), under gemini.base_url
    credential_headers = CREDENTIAL_HEADERS

    # -- the body ------------------------------------------------------------------------------
    envelope_field: str | None = CONTENTS  # the array whose contents a body that grows shares (proxy/reuse.py)

    def parse(self, raw: bytes, counter: TokenCounter, cfg: Config, *, ratio: float | None = None,
              prior: Prior | None = None, model: str | None = None) -> Request:
        """The body checked and counted; `model` from the path (a body that names its own, as
        Code Assist's, may leave it out); the first contents as `prior` had them (parsed, checked,
        written, keyed and counted there)."""
        body, prior = prefix.parse_body(parse_gemini_body, raw, prior, whole=False)
        return self.request_of(raw, body, counter, cfg, ratio, model, prior)

    def request_of(self, raw: bytes, body: dict[str, Any], counter: TokenCounter, cfg: Config, ratio: float | None,
                   model: str | None, prior: Prior | None = None) -> Request:
        """The Request of a checked `body` (`raw`: the bytes to forward when nothing changes)."""
        model = model or body.get("model")
        if not isinstance(model, str) or not model:
            raise Uncompactable(400, "The model is not named in the request path.")
        model = model.removeprefix("models/")
        settings = cfg.model_settings(model)
        encoding = settings.encoding or encoding_name_for(model)
        system = [{_SYSTEM: body[_SYSTEM]}] if body.get(_SYSTEM) is not None else []
        values = [*system, *body[CONTENTS]]
        try:
            written, keys = prefix.written_and_keys(system, body[CONTENTS], prior)
        except orjson.JSONEncodeError:  # parsed JSON fails to write for one reason only: nesting
            raise too_deep() from None
        tokens = counted_after([self._count_value(v, encoding, counter, k) for v, k in zip(system, keys)], prior,
                               encoding, len(values), lambda i: count_content(counter, values[i], encoding, keys[i]))
        tools = body.get("tools")
        has_system = bool(system)
        built: dict[str, Any] = {}  # the envelopes once made, and where their making stopped
        after = built_before(prior)
        # (stream: the route says, from the method in the path; positional, as Messages' parse)
        return Request(raw, body, model, False,
                       Conversation(None, tokens, lambda: self.envelopes(values, has_system, after=after, built=built),
                                    values, len(system)),
                       keys, written, encoding, settings.token_ratio if ratio is None else ratio,
                       prefix.tools_tokens(counter, tools, encoding, prior), tools, False, False, {BUILT: built})

    def envelopes(self, values: list[Any], has_system: bool, *, after: _Built | None = None,
                  built: dict[str, Any] | None = None) -> list[Envelope]:
        """`values`: the system envelope's value first when `has_system`, then the contents. A
        tool result is named after the latest call with its key before it (model.name_results).
        `after`: the envelopes of the first contents and the turn and calls their making ended
        with (the previous request's, for the contents it shared); `built` gets this making's."""
        contents = values[1:] if has_system else values
        out: list[Envelope] = list(after[0]) if after is not None else []
        turn = after[1] if after is not None else 0
        calls: dict[str, Item] = dict(after[2]) if after is not None else {}
        for i in range(len(out), len(contents)):
            c = contents[i]
            items = tuple(named(it, calls) for it in _items(c))
            if role(c) == "user" and not any(it.kind is Kind.TOOL_RESULT for it in items):
                turn += 1
            out.append(Envelope(items, turn, turns.cut_allowed_at(contents, i), c, kind=_kind(role(c), items)))
        if built is not None:
            built["state"] = (out, turn, calls)
        return [self._system_envelope(values[0]), *out] if has_system else out

    @staticmethod
    def _system_envelope(value: dict[str, Any]) -> Envelope:
        return Envelope((Item(Kind.SYSTEM, system_text(value[_SYSTEM]), raw=value[_SYSTEM]),), 0, False, value)

    def render(self, request: Request, forwarded: Conversation) -> bytes:
        if forwarded is request.conversation:
            return request.raw
        body = dict(request.body)
        envs = forwarded.envelopes
        if envs and envs[0].kind is Kind.SYSTEM:
            body = {_SYSTEM: envs[0].value[_SYSTEM], **{k: v for k, v in body.items() if k != _SYSTEM}}
            envs = envs[1:]
        else:
            body.pop(_SYSTEM, None)
        at = request.positions(values=True)
        return splice(body, "contents", written_parts(request, envs, lambda e: at(e.value), value_written))

    # -- edits ---------------------------------------------------------------------------------
    def with_output(self, envelope: Envelope, item: int, text: str) -> Envelope:
        value = dict(envelope.value)
        ps = list(parts(value))
        ps[item] = turns.with_note(ps[item], text, envelope.items[item].is_error)
        value["parts"] = ps
        items = list(envelope.items)
        items[item] = replace(items[item], text=text, plain=True, raw=ps[item])
        return Envelope(tuple(items), envelope.turn, envelope.cut_before, value, kind=envelope.kind)

    def inject(self, conv: Conversation, cut: int, summary_text: str, annotation: str) -> Injected:
        """The annotation as one more part of systemInstruction, the summary as the first user
        content, merged into the first kept content when that is a user content."""
        envs = conv.envelopes
        system = envs[0].value[_SYSTEM] if conv.n_system else None
        head = [self._system_envelope({_SYSTEM: turns.with_annotation(system, annotation)})]
        kept = envs[cut:]
        merged = turns.with_summary([e.value for e in kept[:1]], summary_text)
        first = self._envelope_like(merged[0], kept[0].turn if kept else 1)
        if kept and role(kept[0].value) == "user":
            return Injected([*head, first, *kept[1:]], 2, cut + 1)
        return Injected([*head, first, *kept], 2, cut)

    def _envelope_like(self, value: dict[str, Any], turn: int) -> Envelope:
        items = _items(value)
        return Envelope(items, turn, True, value, kind=_kind(role(value), items))

    def binds_reasoning(self, request: Request) -> bool:
        return request.model.startswith(SIGNING_MODELS)

    def unbound(self, envelope: Envelope) -> Envelope | None:
        if envelope.kind is Kind.SYSTEM or role(envelope.value) != "model":
            return None
        value = turns.unsigned(envelope.value)
        if value is None:
            return None
        items = _items(value)
        calls = iter(it for it in envelope.items if it.kind is Kind.TOOL_CALL)
        items = tuple(replace(it, call_id=next(calls).call_id) if it.kind is Kind.TOOL_CALL else it for it in items)
        return Envelope(items, envelope.turn, envelope.cut_before, value, kind=envelope.kind)

    def count(self, envelope: Envelope, encoding: str, counter: TokenCounter) -> int:
        return self._count_value(envelope.value, encoding, counter, message_digest(envelope.value))

    @staticmethod
    def _count_value(value: dict[str, Any], encoding: str, counter: TokenCounter, key: Any) -> int:
        if _SYSTEM in value:
            return counter.count_keyed(encoding, ("gemini", _SYSTEM, key),
                                       lambda: counter.count_text(system_text(value[_SYSTEM]), encoding))
        return count_content(counter, value, encoding, key)

    # -- the wire ------------------------------------------------------------------------------
    def is_overflow(self, status: int, body: bytes) -> bool:
        return is_overflow(status, body)

    def event_checker(self) -> GeminiEventChecker:
        return GeminiEventChecker()

    def answer_usage(self, answer: Any) -> Usage | None:
        return gemini_usage(answer.get("usageMetadata")) if isinstance(answer, dict) else None

    def stream_usage(self, checker: Any) -> Usage | None:
        return gemini_usage(checker.usage)

    # -- the proxy's own summarizer calls (summary.py) ------------------------------------------
    def upstream(self, cfg: Config) -> Any:
        return cfg.gemini

    def riding_end(self, values: list[Any], first_kept: int, request: Request | None = None) -> int:
        return summary.riding_end(values, first_kept)

    def summary_request(self, call: SummaryCall, base_url: str) -> SummaryRequest:
        body = summary.summary_body(call.prompt, call.output_cap, call.system, call.prefix, call.tools)
        return SummaryRequest(call, base_url, summary.path(call.model), orjson.dumps(body))

    def summary_text(self, status: int, answer: bytes, usage: dict[str, Any] | None = None) -> str:
        return summary.answer_text(answer, usage)


GEMINI = GeminiAdapter()
