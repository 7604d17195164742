"""Gemini Code Assist (Gemini CLI signed in with Google) as the pipeline sees it (design.md §
Gemini API): `POST /v1internal:generateContent`, `:streamGenerateContent` and
`:countTokens`, sent to `gemini.code_assist_base_url`. The body wraps a Gemini request:
`{"model", "project", "user_prompt_id"?, "request": {contents, systemInstruction, tools, ...}}`
(countTokens: `{"request": {"model": "models/...", "contents"}}`); an answer wraps a
GenerateContentResponse as `{"response": {...}, "traceId"}`, each streamed event too. The inner
request is compacted as the Gemini API's; every other field of the wrapper goes upstream as it
came. The credential is the OAuth `Authorization: Bearer` token. Recall is not offered: its rounds
read unwrapped events."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import orjson

from proxy import credentials, jsonbody, offload, reuse
from proxy.adapter import Request, SummaryCall, SummaryRequest, splice_value
from proxy.byheaders import ByHeaders, Caller
from proxy.config import Config
from proxy.errors import Uncompactable
from proxy.exchange import Usage
from proxy.forward import upstream_request_headers
from proxy.model import Conversation
from proxy.protocols.base import Protocol
from proxy.protocols.gemini import summary
from proxy.protocols.gemini.adapter import GeminiAdapter
from proxy.protocols.gemini.body import CONTENTS, unreadable, validate_body
from proxy.protocols.gemini.protocol import STREAMED
from proxy.protocols.gemini.recall_stream import Rounds
from proxy.protocols.gemini.stream import GeminiEventChecker, gemini_usage
from proxy.tokens import TokenCounter

CODE_ASSIST_URL = "https://cloudcode-pa.googleapis.com"  # Google's endpoint: the pass-through's
INNER = "request"
GENERATE_PATH = "/v1internal:generateContent"
# The caller's GCP project (the wrapper's `project`), for the proxy's own summarizer calls made
# while its request is handled: the Code Assist server bills and authorizes per project. A
# context variable, as the error shape: set in this request's task, seen by the tasks it starts.
PROJECT: ContextVar[Any] = ContextVar("code_assist_project", default=None)


def wrapped(answer: Any) -> Any:
    """The GenerateContentResponse a Code Assist answer carries (the answer itself if none)."""
    if isinstance(answer, dict) and isinstance(answer.get("response"), dict):
        return answer["response"]
    return answer


class CodeAssistEventChecker(GeminiEventChecker):
    answer = staticmethod(wrapped)  # type: ignore[assignment]


class CodeAssistAdapter(GeminiAdapter):
    protocol = "code_assist"
    dialect = None  # recall's stream filter reads the Gemini API's events, not these wrapped ones
    credential_headers = ("authorization",)
    envelope_field = f"{INNER}.{CONTENTS}"  # the array a body that grows shares, in its request (proxy/reuse.py)

    def parse(self, raw: bytes, counter: TokenCounter, cfg: Config, *, ratio: float | None = None,
              prior: Any = None, model: str | None = None) -> Request:
        """The inner request parsed as the Gemini API's (its first contents as `prior` had them);
        `raw` and the wrapper kept, to render back. A body with no `request` object is the
        upstream's to judge: forwarded as it came."""
        outer, prior = reuse.parse_body(parse_wrapper, raw, prior)
        inner = outer[INNER]
        named = outer.get("model") if isinstance(outer.get("model"), str) else None
        req = self.request_of(raw, inner, counter, cfg, ratio, named or inner.get("model"), prior)
        req.extra["wrapper"] = outer
        return req

    def render(self, request: Request, forwarded: Conversation) -> bytes:
        if forwarded is request.conversation:
            return request.raw
        return splice_value(request.extra["wrapper"], INNER, super().render(request, forwarded))

    def event_checker(self) -> GeminiEventChecker:
        return CodeAssistEventChecker()

    def answer_usage(self, answer: Any) -> Usage | None:
        return super().answer_usage(wrapped(answer))

    def upstream(self, cfg: Config) -> Any:
        return _upstream(cfg.gemini)

    def summary_request(self, call: SummaryCall, base_url: str) -> SummaryRequest:
        """Code Assist's generateContent: the Gemini API's summary body wrapped, under the
        caller's project (the one its request named)."""
        body = summary.summary_body(call.prompt, call.output_cap, call.system, call.prefix, call.tools)
        outer: dict[str, Any] = {"model": call.model.removeprefix("models/")}
        project = call.request.extra["wrapper"].get("project") if call.request is not None else PROJECT.get()
        if project is not None:
            outer["project"] = project
        outer[INNER] = body
        return SummaryRequest(call, base_url, GENERATE_PATH, orjson.dumps(outer))

    def summary_text(self, status: int, answer: bytes, usage: dict[str, Any] | None = None) -> str:
        try:
            inner = wrapped(orjson.loads(answer))
        except orjson.JSONDecodeError:
            inner = None
        return summary.answer_text(orjson.dumps(inner) if inner is not None else answer, usage)


def parse_wrapper(raw: bytes, *, before: list[Any] | None = None) -> dict[str, Any]:
    """The wrapper, its request checked as the Gemini API's. `before`: contents parsed (and
    checked) already, cut out of the front of the request's array (proxy/reuse.py). The contents
    are written, and so checked, by the adapter; the rest of the body here."""
    try:
        outer = jsonbody.load_request(raw)
        inner = outer.get(INNER) if isinstance(outer, dict) else None
        if not isinstance(inner, dict):
            raise Uncompactable(400, 'The Code Assist body has no "request" object.')
        known = 0
        if before is not None and isinstance(inner.get(CONTENTS), list):
            inner[CONTENTS] = [*before, *inner[CONTENTS]]
            known = len(before)
        validate_body(inner, start=known)
        jsonbody.check_fields_writable(raw, {**outer, INNER: {k: v for k, v in inner.items() if k != CONTENTS}})
    except jsonbody.Unreadable as e:
        raise unreadable(e) from None
    return outer


def _upstream(section: Any) -> Any:
    """gemini's section with Code Assist's URL as its base."""
    return section.model_copy(update={"base_url": section.code_assist_base_url or CODE_ASSIST_URL})


CODE_ASSIST = CodeAssistAdapter()


def _caller(headers: Any, scope_secret: bytes) -> Caller:
    creds = credentials.resolve(headers, scope_secret, None, CODE_ASSIST.credential_headers)
    return Caller.of(headers, creds, upstream_request_headers(headers, None, identity_encoding=True))


CALLERS = ByHeaders(_caller)  # what the headers say (the OAuth token's scope ...), once per header list


def caller_of(request: Any, state: Any) -> Caller:
    return CALLERS.of(request, (state.scope_secret,))


async def parse(state: Any, incoming: Any) -> Request:
    """The body by itself (a count of one that goes as it came)."""
    req = await offload.sized(len(incoming.raw), CODE_ASSIST.parse, incoming.raw, state.counter, state.cfg)
    return _noted(req, incoming)


async def read(state: Any, incoming: Any, scope: Any) -> Request:
    """The body parsed with what the conversation's previous body shared (reuse.parse)."""
    return _noted(await reuse.parse(CODE_ASSIST, incoming.raw, state.counter, state.cfg, scope), incoming)


def _noted(req: Request, incoming: Any) -> Request:
    """Whether it streams (the method in the path), and the caller's project for the proxy's own calls."""
    req.stream = incoming.path.endswith(STREAMED)
    PROJECT.set(req.extra["wrapper"].get("project"))
    return req


PROTOCOL = Protocol(CODE_ASSIST, None, rounds=Rounds, read=read, parse=parse, caller_of=caller_of)
