"""A strict fake Google Gemini API on 127.0.0.1 (design.md § Gemini API).

- `POST /{v1,v1beta,v1alpha}/models/{model}:generateContent` and `:streamGenerateContent`
  (`?alt=sse`: `data:` events, each a GenerateContentResponse, the last with its finishReason;
  without it, one JSON array of them): the API's validation (validate.py: roles alternate, a
  function response turn right after its call turn with matching names and ids, the current
  turn's calls signed on Gemini 3 models, signatures bound to their prefix); 400
  INVALID_ARGUMENT "The input token count (N) exceeds the maximum number of tokens allowed (M)."
  above the window; `usageMetadata` with an implicit prefix cache (`cachedContentTokenCount`,
  from `cache_min_tokens` on); the key as `x-goog-api-key` or `?key=` (403 without one);
- `POST .../models/{model}:countTokens`: the same validation, `{"totalTokens": N}`;
- `POST /v1internal:{method}`: the same three as Code Assist calls them (code_assist.py);
- errors in Google's shape `{"error": {"code", "message", "status"}}`; a recording of every request.

Settings as FakeMessages' (window, model_windows, encoding, token_scale, reply, summarizer,
summarizer_marker, require_api_key, signing_key and the fault flags); also `call_ids` (the reply's
function calls carry an `id`, as Vertex's do; default False, as the Gemini API's).
Recording: requests (kind "gemini" | "summarizer" | "count_tokens" | "other")."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
from aiohttp import web

from proxy.fakes.chat_view import chat_view
from proxy.fakes.common import FakeError, Invalid, RecordedRequest, rand, split_text
from proxy.fakes.gemini import code_assist, validate
from proxy.fakes.messages.events import Reply, normalize_reply
from proxy.fakes.model_server import Failure, ModelFake
from proxy.fakes.prompt_cache import PrefixCache, segment_key
from proxy.fakes.summarizer_match import is_cached_history_request, summarizer_kind

_PATH = re.compile(r"^/v1(?:beta|alpha)?/models/([^/:]+):([A-Za-z]+)$")
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED",
           500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
_MESSAGES = {429: "Resource has been exhausted (e.g. check quota).", 500: "An internal error has occurred.",
             503: "The model is overloaded. Please try again later.", 504: "Deadline expired before operation could "
             "complete."}
_NO_KEY = ("Method doesn't allow unregistered callers (callers without established identity). Please use API Key "
           "or other form of API consumer identity to call this API.")
_BROKEN_SSE = b'data: {"candidates": [{"content": {"role": "model", "parts": [{"text": \r\n\r\n'
MESSAGE_OVERHEAD = 3
MEDIA_TOKENS = 258


def google_error(status: int, message: str, headers: dict[str, str] | None = None) -> FakeError:
    return FakeError(status, {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}},
                     headers)


def part_text(p: dict[str, Any]) -> str:
    if "text" in p:
        return str(p["text"])
    if "functionCall" in p:
        return p["functionCall"]["name"] + orjson.dumps(p["functionCall"].get("args", {})).decode()
    if "functionResponse" in p:
        return p["functionResponse"]["name"] + orjson.dumps(p["functionResponse"].get("response", {})).decode()
    return ""


def view(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-shaped view a scripted reply reads (tool calls and responses as text)."""
    system = "\n".join(part_text(p) for p in (body.get("systemInstruction") or {}).get("parts") or []) or None
    turns = [("assistant" if validate.role(c) == "model" else "user", "\n".join(part_text(p) for p in c["parts"]))
             for c in body["contents"]]
    names = [str(f.get("name")) for t in body.get("tools") or [] if isinstance(t, dict)
             for f in t.get("functionDeclarations") or [] if isinstance(f, dict)]
    v = chat_view(body.get("model"), system, turns, names, body)
    v["calls"] = calls_view(body, system, names)
    return v


def calls_view(body: dict[str, Any], system: str | None, names: list[str]) -> dict[str, Any]:
    """The request as a Chat Completions body, calls and responses kept apart (a functionCall as
    an assistant message's tool_call, a functionResponse as a `tool` message, paired by id or by
    name and order): a reply written for the chat fake reads a Gemini request through it."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    pending: dict[str, list[str]] = {}  # name -> ids of calls not yet answered, in order
    for n, c in enumerate(body["contents"]):
        texts = [str(p["text"]) for p in c["parts"] if "text" in p and not p.get("thought")]
        for r in (p["functionResponse"] for p in c["parts"] if "functionResponse" in p):
            queue = pending.get(r["name"]) or [r.get("id") or r["name"]]
            rid = r.get("id") if r.get("id") in queue else queue[0]
            queue.remove(rid) if rid in queue else None
            output = (r.get("response") or {}).get("output")
            messages.append({"role": "tool", "tool_call_id": rid,
                             "content": output if isinstance(output, str) else part_text({"functionResponse": r})})
        calls = [p["functionCall"] for p in c["parts"] if "functionCall" in p]
        if validate.role(c) == "model":
            msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = []
                for k, fc in enumerate(calls):
                    cid = fc.get("id") or f"{fc['name']}#{n}.{k}"
                    pending.setdefault(fc["name"], []).append(cid)
                    msg["tool_calls"].append({"id": cid, "type": "function", "function": {
                        "name": fc["name"], "arguments": orjson.dumps(fc.get("args", {})).decode()}})
            messages.append(msg)
        elif texts:
            messages.append({"role": "user", "content": "\n".join(texts)})
    tools = [{"type": "function", "function": {"name": n}} for n in names]
    return {"model": body.get("model"), "messages": messages, "tools": tools}


class FakeGemini(ModelFake):
    model_kinds = ("gemini", "summarizer")
    agent_kind = "gemini"
    default_window = 1_048_576
    base_path = ""  # google-genai's base_url has no version
    thread_name = "fake-gemini"

    def __init__(self, **settings: Any) -> None:
        self._init_model_settings()
        self.cache_min_tokens: int = 1024  # Gemini 2.5 Flash's implicit caching minimum
        self.call_ids: bool = False
        super().__init__(**settings)
        self._cache = PrefixCache()

    @property
    def gemini_requests(self) -> list[Any]:
        return [r.json for r in self.requests if r.kind == "gemini"]

    @property
    def count_requests(self) -> list[Any]:
        return [r.json for r in self.requests if r.kind == "count_tokens"]

    def clear_requests(self) -> None:
        super().clear_requests()
        self._cache.clear()

    def sign(self, body: dict[str, Any]) -> str:
        """The signature this fake gives a reply to `body` (bound to its whole prefix)."""
        return validate.sign(self.signer.key, validate.prefix_digest(body, len(body["contents"])))

    # ---- counting ----------------------------------------------------------------------------

    def _segments(self, body: dict[str, Any]) -> list[tuple[bytes, int]]:
        """(key, tokens) of the system instruction, the tools, then each content: the cache's units."""
        segs = []
        if body.get("systemInstruction") is not None:
            sys = body["systemInstruction"]
            segs.append((segment_key(sys), sum(self._count(part_text(p)) for p in sys.get("parts") or [])))
        if body.get("tools"):
            segs.append((segment_key(body["tools"]), self._count(orjson.dumps(body["tools"]).decode())))
        for c in body["contents"]:
            n = MESSAGE_OVERHEAD + sum(MEDIA_TOKENS if ("inlineData" in p or "fileData" in p) else self._count(part_text(p))
                                       for p in c["parts"])
            segs.append((segment_key(c), n))
        return [(k, int(n * self.token_scale)) for k, n in segs]

    def count_input_tokens(self, body: dict[str, Any]) -> int:
        return sum(n for _, n in self._segments(body))

    def _usage(self, body: dict[str, Any], model: str, total: int, out: int) -> dict[str, Any]:
        cached = self._cache.longest_seen(model, self._segments(body))
        meta: dict[str, Any] = {"promptTokenCount": total, "candidatesTokenCount": out, "totalTokenCount": total + out,
                                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": total}]}
        if cached >= self.cache_min_tokens:
            meta["cachedContentTokenCount"] = cached
        return meta

    # ---- classification ----------------------------------------------------------------------

    def summarizer_kind(self, body: Any) -> str | None:
        if not isinstance(body, dict) or not isinstance(body.get("contents"), list) or not body["contents"]:
            return None
        last = body["contents"][-1]
        lparts = last.get("parts") if isinstance(last, dict) else None
        if isinstance(lparts, list) and lparts and isinstance(lparts[-1], dict) and \
                is_cached_history_request(self.prompts_dir, str(lparts[-1].get("text", ""))):
            return "history"
        sys = body.get("systemInstruction")
        system = "\n".join(str(p.get("text", "")) for p in (sys.get("parts") or []) if isinstance(p, dict)) \
            if isinstance(sys, dict) else ""
        if not system:
            return None
        everything = "\n".join(str(p.get("text", "")) for c in body["contents"] if isinstance(c, dict)
                               for p in c.get("parts") or [] if isinstance(p, dict))
        return summarizer_kind(self.prompts_dir, system, everything, self.summarizer_marker)

    def _classify(self, rec: RecordedRequest) -> None:
        m = _PATH.match(rec.path) if rec.method == "POST" else None
        method = m.group(2) if m is not None else code_assist.unwrap(rec)
        if method is None:
            return
        if method == "countTokens":
            rec.kind = "count_tokens"
        elif method in ("generateContent", "streamGenerateContent"):
            rec.summarizer_kind = self.summarizer_kind(rec.json)
            rec.kind = "summarizer" if rec.summarizer_kind else "gemini"

    # ---- routing -----------------------------------------------------------------------------

    def _error_response(self, rec: RecordedRequest, err: FakeError) -> web.Response:
        rec.status = err.status
        return web.Response(status=err.status, body=orjson.dumps(err.body),
                            headers={"Content-Type": "application/json; charset=UTF-8", **(err.headers or {})})

    def _key_error(self, rec: RecordedRequest) -> FakeError | None:
        if rec.wrapper is not None:
            return google_error(401, code_assist.NO_TOKEN) if code_assist.token_missing(rec) else None
        key = rec.headers.get("x-goog-api-key") or rec.query.get("key")
        if not key:
            return google_error(403, _NO_KEY)
        if self.require_api_key is not None and key != self.require_api_key:
            return google_error(400, "API key not valid. Please pass a valid API key.")
        return None

    async def _route(self, request: web.Request, rec: RecordedRequest) -> web.StreamResponse:
        m = _PATH.match(rec.path)
        target = (m.group(1), m.group(2)) if m is not None else code_assist.target(rec)
        if rec.kind == "other" and (account := code_assist.account_answer(rec)) is not None:
            return self._account(rec, account)
        if rec.kind == "other" or target is None:
            return self._error_response(rec, google_error(404, f"Method not found: {rec.path}"))
        err = self._key_error(rec)
        if err is not None:
            return self._error_response(rec, err)
        fault = self._take_fault(rec)
        if fault and self.stall_before_headers_s:
            await asyncio.sleep(self.stall_before_headers_s)
        if fault and self.fail_status:
            headers = {"retry-after": str(self.retry_after)} if self.retry_after is not None else None
            return self._error_response(rec, google_error(self.fail_status, _MESSAGES.get(self.fail_status, "Error"),
                                                          headers))
        try:
            if rec.kind == "count_tokens" and isinstance(rec.json, dict) and "generateContentRequest" in rec.json:
                rec.json = rec.json["generateContentRequest"]  # countTokens may wrap a whole request
            if rec.wrapper is not None and (bad := code_assist.wrapper_error(rec, target[0])):
                raise Failure(google_error(400, bad))
            body = self._validate(rec, target[0])
            if rec.kind == "count_tokens":
                return self._count_tokens(rec, body)
            return await self._generate(request, rec, body, target[0], target[1], fault)
        except Failure as f:
            return self._error_response(rec, f.err)

    def _account(self, rec: RecordedRequest, answer: dict[str, Any]) -> web.Response:
        if code_assist.token_missing(rec):
            return self._error_response(rec, google_error(401, code_assist.NO_TOKEN))
        rec.status = 200
        return web.Response(status=200, body=orjson.dumps(answer), content_type="application/json")

    def _validate(self, rec: RecordedRequest, model: str) -> dict[str, Any]:
        if rec.json is None:
            raise Failure(google_error(400, "Invalid JSON payload received."))
        try:
            validate.check_request(rec.json, model, self.signer.key if rec.kind == "gemini" else None)
        except Invalid as e:
            raise Failure(google_error(400, e.message)) from None
        return rec.json

    def _count_tokens(self, rec: RecordedRequest, body: dict[str, Any]) -> web.Response:
        rec.prompt_tokens = n = self.count_input_tokens(body)
        rec.status = 200
        answer = {"totalTokens": n} if rec.wrapper is not None else {"totalTokens": n, "promptTokensDetails": [
            {"modality": "TEXT", "tokenCount": n}]}
        return web.Response(status=200, body=orjson.dumps(answer), headers={"Content-Type": "application/json; charset=UTF-8"})

    async def _generate(self, request: web.Request, rec: RecordedRequest, body: dict[str, Any], model: str,
                        method: str, fault: bool) -> web.StreamResponse:
        total = self.count_input_tokens(body)
        rec.prompt_tokens = total
        window = self.window_for(model)
        if total > window:
            raise Failure(google_error(400, f"The input token count ({total}) exceeds the maximum number of tokens "
                                            f"allowed ({window})."))
        reply = await self._scripted(view(body), rec, normalize_reply, lambda m: google_error(500, m))
        parts = self._parts(reply, body, model)
        out = sum(self._count(part_text(p)) for p in parts)
        cap = (body.get("generationConfig") or {}).get("maxOutputTokens")
        finish = "MAX_TOKENS" if isinstance(cap, int) and out > cap else "STOP"
        rec.completion_tokens = out
        usage = self._usage(body, model, total, out)
        rec.cached_tokens = usage.get("cachedContentTokenCount", 0)
        rid = rand(22)
        wrap = code_assist.wrap if rec.wrapper is not None else _same
        if method == "generateContent":
            answer = wrap(_response(parts, finish, usage, model, rid))
            return await self._send_body(request, rec, orjson.dumps(answer), status=200, fault=fault,
                                         headers={"Content-Type": "application/json; charset=UTF-8"})
        events = [wrap(e) for e in _events(parts, finish, usage, model, rid)]
        if request.query.get("alt") != "sse":
            return await self._send_body(request, rec, orjson.dumps(events), status=200, fault=fault,
                                         headers={"Content-Type": "application/json; charset=UTF-8"})
        chunks = [(b"data: " + orjson.dumps(e) + b"\r\n\r\n", i == len(events) - 1) for i, e in enumerate(events)]
        return await self._send_stream(request, rec, chunks, fault=fault, broken=_BROKEN_SSE,
                                       headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})

    def _parts(self, reply: Reply, body: dict[str, Any], model: str) -> list[dict[str, Any]]:
        """The reply's parts: its text, then its calls; on a signing model the first call (or the
        text, when there is none) carries the signature bound to this request's prefix."""
        parts: list[dict[str, Any]] = []
        if reply.text is not None or not reply.tool_uses:
            parts.append({"text": reply.text or ""})
        for u in reply.tool_uses:
            call = {"name": u["name"], "args": u["input"]}
            if self.call_ids:
                call["id"] = u["id"]
            parts.append({"functionCall": call})
        if model.startswith(validate.SIGNING_MODELS):
            at = next((i for i, p in enumerate(parts) if "functionCall" in p), 0)
            parts[at] = {**parts[at], "thoughtSignature": self.sign(body)}
        return parts


def _same(answer: dict[str, Any]) -> dict[str, Any]:
    return answer


def _response(parts: list[dict[str, Any]], finish: str | None, usage: dict[str, Any], model: str,
              rid: str) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": model, "responseId": rid}


def _events(parts: list[dict[str, Any]], finish: str, usage: dict[str, Any], model: str,
            rid: str) -> list[dict[str, Any]]:
    """The stream: the text in pieces, then the calls, the last event with the finishReason."""
    pieces: list[list[dict[str, Any]]] = []
    for p in parts:
        if "text" in p and len(p["text"]) > 40:
            chunks = split_text(p["text"], 40)
            pieces += [[{"text": c}] for c in chunks[:-1]] + [[{**p, "text": chunks[-1]}]]
        else:
            pieces.append([p])
    meta = {k: v for k, v in usage.items() if k != "candidatesTokenCount"}
    return [_response(ps, finish if i == len(pieces) - 1 else None,
                      usage if i == len(pieces) - 1 else meta, model, rid) for i, ps in enumerate(pieces)]
