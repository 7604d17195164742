"""A strict fake OpenAI Responses API (design.md sections 8 and 11) on 127.0.0.1.

- `POST /v1/responses`: OpenAI's validation (proxy/fakes/responses/validate.py), JSON or SSE;
  a context window (400 `context_length_exceeded`, or with `overflow_as_failed_event` a stream
  that ends in `response.failed` with that code); stored responses for `previous_response_id`
  and `item_reference` (unless `store: false`); reasoning items whose `encrypted_content` the fake
  signs and checks (they must come back unchanged, right before the item they preceded), and a
  stored function_call the fake made after a reasoning item comes back (by its id) with it;
- WebSocket on `/v1/responses`: each `response.create` message is a request; the events come
  back as JSON text messages; errors as `{"type": "error", "status", "error": {...}}` and the
  socket stays open; one response at a time per socket, in order;
- `POST /v1/responses/compact`: the user messages plus one signed `compaction` item (or 404, as
  a server without it answers, when `serve_compact` is False);
- a recording of every request (each WebSocket message too) and a prefix cache reporting
  `usage.input_tokens_details.cached_tokens` as OpenAI does. OpenAI routes a request to a cache
  machine by a hash of its prefix combined with its `prompt_cache_key`: here a prefix is a hit
  only under the same key (or the same absence of one).

    async with FakeResponses(window=8000) as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-test")
        await client.responses.create(model="gpt-5", input="hi")
        fake.responses_requests[-1]["input"]

Settings (attributes, settable any time, or keyword arguments):
  prompts_dir, require_api_key      as FakeUpstream
  window, model_windows, encoding, token_scale   counting and the window (default 128000)
  overflow_as_failed_event  streams over the window: 200 and a `response.failed` event with
                      code context_length_exceeded (default False: HTTP 400 / a WebSocket error)
  reply               None: "ok: <last user text[:50]>" | str | dict ({"content", "reasoning":
                      summary text, "tool_calls": [{"name", "arguments"}], "custom_tool_calls":
                      [{"name", "input"}]}) | FakeError | callable(view) -> any of those, where
                      view is the chat-shaped view (proxy/fakes/chat_view.py; view["raw"] is the body)
  summarizer, summarizer_marker, summarizer_delay_s   as FakeUpstream (callables get the view)
  serve_compact       answer /v1/responses/compact (default True) or 404
  compaction_trigger  serve Codex's remote compaction v2 (default True): a request whose last input item
                      is `{"type": "compaction_trigger"}` is answered with one signed `compaction` output
                      item; False: the item type is unknown (400 invalid_value, as a server without it)
  compaction_item_tokens  what a compaction item counts for in later requests (default 200)
  stored_prompts      {prompt id: {"model": ...}}: a request whose `prompt` names one may leave out
                      `model` (the API takes it from the stored prompt); default none
  extra_item_types    item types accepted as opaque besides OpenAI's (default: none; OpenAI
                      rejects unknown types)
  signing_key         None: a random key per fake | bytes: the key of encrypted_content and compaction
                      tokens (recorded sessions carry tokens made with a known key)
  fault_target, fault_times, fail_status, retry_after, stall_before_headers_s, stall_mid_stream_s,
  reset_mid_response, malformed_json, broken_sse, chunk_delay_s, release_last_chunk
                      the shared fault flags (proxy/fakes/faults.py); on a WebSocket a fail_status is an
                      error event, a reset drops the connection without a close frame, a broken stream
                      sends a message that is not JSON and closes with 1011
Recording: requests (RecordedRequest; kind "responses" | "summarizer" | "compact" | "websocket"
(the handshake) | "other"; transport "websocket" for socket messages), responses_requests,
summarizer_requests, compact_requests (parsed bodies); sockets_open (WebSocket connections now).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from proxy.fakes.chat.validate import parse_error
from proxy.fakes.common import FakeError, Invalid, RecordedRequest, rand
from proxy.fakes.prompt_cache import PrefixCache, openai_cached_tokens, segment_key
from proxy.fakes.responses import events as ev
from proxy.fakes.responses.items import input_items, item_tokens, item_type, parts_text, view
from proxy.fakes.responses.validate import TRIGGER, Context, check_request, follow_descriptor
from proxy.fakes.model_server import Failure, ModelFake
from proxy.fakes.openai_errors import key_error, status_error
from proxy.fakes.server import ABORTED_KEY, RESP_KEY
from proxy.fakes.summarizer_match import is_cached_history_request, summarizer_kind



class FakeResponses(ModelFake):
    thread_name = "fake-responses"
    model_kinds = ("responses", "summarizer", "compact")
    agent_kind = "responses"
    default_encoding = "o200k_base"

    def __init__(self, **settings: Any) -> None:
        self._init_model_settings()
        self.overflow_as_failed_event: bool = False
        self.serve_compact: bool = True
        self.compaction_trigger: bool = True
        self.compaction_item_tokens: int = 200
        self.extra_item_types: set[str] = set()
        self.stored_prompts: dict[str, dict[str, Any]] = {}
        self.sockets_open = 0  # WebSocket connections open now
        super().__init__(**settings)
        self._prefix_cache = PrefixCache()
        self._responses: dict[str, list[Any]] = {}  # stored response id -> its input + output items
        self._items: dict[str, dict[str, Any]] = {}
        self._next: dict[str, list[Any]] = {}
        self._call_reasoning: dict[str, str] = {}  # stored function_call id -> the reasoning before it

    # ---- recordings --------------------------------------------------------------------------

    @property
    def responses_requests(self) -> list[Any]:
        return [r.json for r in self.requests if r.kind == "responses"]

    @property
    def compact_requests(self) -> list[Any]:
        return [r.json for r in self.requests if r.kind == "compact"]

    def clear_requests(self) -> None:
        super().clear_requests()
        self._prefix_cache.clear()

    def reasoning_token(self, rs_id: str, following: dict[str, Any]) -> str:
        """The encrypted_content this fake gives a reasoning item that precedes `following`."""
        return self.signer.sign("reasoning", {"id": rs_id, "next": follow_descriptor(following)})

    # ---- counting ----------------------------------------------------------------------------

    def _compaction_tokens(self, item: Any) -> int:
        payload = self.signer.verify("compaction", item.get("encrypted_content")) or {}
        return int(payload.get("tokens", self.compaction_item_tokens))

    def count_input_tokens(self, body: dict[str, Any], items: list[Any]) -> int:
        n = self._count(body.get("instructions") or "")
        n += sum(item_tokens(it, self._count, self._compaction_tokens) for it in items)
        n += sum(self._count(orjson.dumps(t).decode()) for t in body.get("tools") or [])
        return int(n * self.token_scale)

    def _cached_tokens(self, body: dict[str, Any], items: list[Any]) -> int:
        head = [body.get("model"), body.get("instructions"), body.get("tools"), body.get("prompt_cache_key")]
        segments = [(segment_key(it), item_tokens(it, self._count, self._compaction_tokens)) for it in items]
        return openai_cached_tokens(int(self._prefix_cache.longest_seen(head, segments) * self.token_scale))

    # ---- classification ----------------------------------------------------------------------

    def summarizer_kind(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return None
        items = input_items(body)
        last = items[-1] if items else None
        if isinstance(last, dict) and item_type(last) == "message" and last.get("role") == "user" and \
                is_cached_history_request(self.prompts_dir, parts_text(last.get("content"))):
            return "history"  # the summary asked in the conversation's own request: its last item asks
        v = view(body, items)
        msgs = v["messages"]
        if not msgs or msgs[0]["role"] != "system":
            return None
        everything = "\n".join(m["content"] for m in msgs)
        return summarizer_kind(self.prompts_dir, msgs[0]["content"], everything, self.summarizer_marker)

    def _classify(self, rec: RecordedRequest) -> None:
        if rec.path == "/v1/responses" and rec.method == "GET":
            rec.kind = "websocket"
        elif rec.path == "/v1/responses/compact" and rec.method == "POST":
            rec.kind = "compact"
        elif rec.path == "/v1/responses" and rec.method == "POST":
            rec.summarizer_kind = self.summarizer_kind(rec.json)
            rec.kind = "summarizer" if rec.summarizer_kind else "responses"

    # ---- routing -----------------------------------------------------------------------------

    async def _route(self, request: web.Request, rec: RecordedRequest) -> web.StreamResponse:
        err = key_error(self.require_api_key, rec.headers)
        if err is not None:
            return self._error_response(rec, err)
        method, path = request.method, request.path
        if path == "/v1/responses" and method == "GET" and request.headers.get("upgrade", "").lower() == "websocket":
            return await self._websocket(request, rec)
        fault = self._take_fault(rec)
        if fault and self.stall_before_headers_s:
            await asyncio.sleep(self.stall_before_headers_s)
        if fault and self.fail_status:
            return self._error_response(rec, status_error(self.fail_status, self.retry_after))
        if path == "/v1/responses" and method == "POST":
            return await self._http_create(request, rec, fault)
        if path == "/v1/responses/compact" and method == "POST" and self.serve_compact:
            return await self._compact(request, rec, fault)
        return self._error_response(rec, FakeError.openai(404, f"Invalid URL ({method} {path})"))

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"x-request-id": "req_" + rand(32), "openai-version": "2020-10-01", "openai-processing-ms": "5",
                **(extra or {})}

    def _error_response(self, rec: RecordedRequest, err: FakeError) -> web.Response:
        rec.status = err.status
        return web.Response(status=err.status, body=orjson.dumps(err.body, option=orjson.OPT_INDENT_2),
                            headers=self._headers({"Content-Type": "application/json", **(err.headers or {})}))

    # ---- the model call, shared by HTTP and WebSocket ------------------------------------------

    def _context(self, websocket: bool, local: dict[str, list[Any]] | None = None) -> Context:
        def find(rid: str) -> Any:
            if local is not None and rid in local:
                return local[rid]
            return self._responses.get(rid)

        return Context(signer=self.signer, stored_items=self._items, stored_next=self._next, find_response=find,
                       call_reasoning=self._call_reasoning, extra_item_types=frozenset(self.extra_item_types),
                       compaction_trigger=self.compaction_trigger, websocket=websocket)

    def _with_prompt_model(self, body: Any) -> Any:
        """A body without `model` whose `prompt` names a stored prompt, with that prompt's model (as
        the API answers it); any other body as it is."""
        prompt = body.get("prompt") if isinstance(body, dict) and "model" not in body else None
        stored = self.stored_prompts.get(prompt.get("id")) if isinstance(prompt, dict) else None
        return {**body, "model": stored["model"]} if stored is not None else body

    async def _answer(self, body: Any, rec: RecordedRequest, ctx: Context, stream: bool,
                      local: dict[str, list[Any]] | None = None) -> list[dict[str, Any]]:
        """The response's events (the last one carries the final response). Raises Failure."""
        if body is None:
            raise Failure(parse_error())
        body = self._with_prompt_model(body)
        try:
            items = check_request(body, ctx)
        except Invalid as e:
            raise Failure(FakeError.openai(400, e.message, "invalid_request_error", e.code, e.param)) from None
        rid = "resp_" + rand(40)
        model = body["model"]
        window = self.window_for(model)
        rec.prompt_tokens = tokens = self.count_input_tokens(body, items)
        if tokens > window:
            message = ("Your input exceeds the context window of this model. Please adjust your input and try "
                       "again.")
            if stream and self.overflow_as_failed_event:
                final = ev.response_object(rid, body, "failed", [], None,
                                           error={"code": "context_length_exceeded", "message": message})
                return ev.failed_events(final)
            raise Failure(FakeError.openai(400, message, "invalid_request_error", "context_length_exceeded",
                                            "input"))
        rec.cached_tokens = cached = self._cached_tokens(body, items)
        if body.get("generate") is False:  # a WebSocket warm-up: state prepared, no output
            final = ev.response_object(rid, body, "completed", [], ev.usage(tokens, cached, 0))
            self._store(body, rid, items, [], local)
            return ev.stream_events(final)
        if items and item_type(items[-1]) == TRIGGER:
            output = [self._compaction_item(tokens)]
            used = ev.usage(tokens, cached, self.compaction_item_tokens)
            final = ev.response_object(rid, body, "completed", output, used)
            self._store(body, rid, items, output, local)
            return ev.stream_events(final)
        reply = await self._reply(body, items, rec)
        include = body.get("include") or []

        def reasoning_token(rs_id: str, following: dict[str, Any]) -> str | None:
            nxt = follow_descriptor(following)
            self._next[rs_id] = nxt
            if "reasoning.encrypted_content" not in include:
                return None
            return self.reasoning_token(rs_id, following)

        output = ev.output_items(reply, reasoning_token)
        status, incomplete = "completed", None
        out_tokens = sum(self._count(ev_text(it)) for it in output)
        limit = body.get("max_output_tokens")
        if limit and out_tokens > limit:
            status, incomplete, out_tokens = "incomplete", {"reason": "max_output_tokens"}, limit
        reasoning_tokens = self._count(reply.reasoning or "")
        final = ev.response_object(rid, body, status, output, ev.usage(tokens, cached, out_tokens, reasoning_tokens),
                                   incomplete=incomplete)
        self._store(body, rid, items, output, local)
        return ev.stream_events(final)

    def _store(self, body: dict[str, Any], rid: str, items: list[Any], output: list[Any],
               local: dict[str, list[Any]] | None) -> None:
        if local is not None:  # a socket keeps its latest response for chaining, stored or not
            local.clear()
            local[rid] = items + output
        if body.get("store") is False:
            return
        self._responses[rid] = items + output
        reasoning = None
        for it in output:
            self._items[it["id"]] = it
            if it["type"] == "reasoning":
                reasoning = it["id"]
            elif it["type"] == "function_call" and reasoning is not None:
                self._call_reasoning[it["id"]] = reasoning

    async def _reply(self, body: dict[str, Any], items: list[Any], rec: RecordedRequest) -> ev.Reply:
        return await self._scripted(view(body, items), rec, ev.normalize_reply, lambda m: FakeError.openai(500, m))

    # ---- HTTP --------------------------------------------------------------------------------

    async def _http_create(self, request: web.Request, rec: RecordedRequest, fault: bool) -> web.StreamResponse:
        body = rec.json
        stream = isinstance(body, dict) and body.get("stream") is True
        try:
            events = await self._answer(body, rec, self._context(False), stream)
        except Failure as f:
            return self._error_response(rec, f.err)
        if not stream:
            return await self._json(request, rec, events[-1]["response"], fault)
        numbered = ev.numbered(events)
        chunks = [(ev.sse(e), i == len(numbered) - 1) for i, e in enumerate(numbered)]
        headers = self._headers({"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
        return await self._send_stream(request, rec, chunks, headers=headers, fault=fault, broken=_BROKEN_SSE)

    async def _json(self, request: web.Request, rec: RecordedRequest, payload: Any, fault: bool) -> web.StreamResponse:
        data = orjson.dumps(payload, option=orjson.OPT_INDENT_2)
        headers = self._headers({"Content-Type": "application/json"})
        return await self._send_body(request, rec, data, status=200, headers=headers, fault=fault)

    async def _compact(self, request: web.Request, rec: RecordedRequest, fault: bool) -> web.StreamResponse:
        """OpenAI's /responses/compact: all user messages, then one opaque compaction item."""
        body = rec.json
        if body is None:
            return self._error_response(rec, parse_error())
        try:
            items = check_request(body, self._context(False), compact=True)
        except Invalid as e:
            return self._error_response(rec, FakeError.openai(400, e.message, "invalid_request_error", e.code,
                                                              e.param))
        tokens = self.count_input_tokens(body, items)
        if tokens > self.window_for(body["model"]):
            return self._error_response(rec, FakeError.openai(
                400, "Your input exceeds the context window of this model. Please adjust your input and try again.",
                "invalid_request_error", "context_length_exceeded", "input"))
        rec.prompt_tokens = tokens
        users = [{"id": "msg_" + rand(24), "type": "message", "status": "completed", "role": "user",
                  "content": [{"type": "input_text", "text": m["content"]}] if isinstance(m.get("content"), str)
                  else m["content"]}
                 for m in items if item_type(m) == "message" and m.get("role") == "user"]
        out = users + [self._compaction_item(tokens)]
        payload = {"id": "resp_" + rand(40), "object": "response.compaction", "created_at": int(time.time()),
                   "output": out, "usage": ev.usage(tokens, 0, self.compaction_item_tokens)}
        return await self._json(request, rec, payload, fault)

    def _compaction_item(self, covered: int) -> dict[str, Any]:
        """One opaque compaction item standing for `covered` tokens of history."""
        token = self.signer.sign("compaction", {"id": "cmp_" + rand(24), "tokens": self.compaction_item_tokens,
                                                "covered": covered})
        return {"id": "cmp_" + rand(24), "type": "compaction", "encrypted_content": token,
                "created_by": "fake-responses"}

    # ---- WebSocket ---------------------------------------------------------------------------

    async def _websocket(self, request: web.Request, handshake: RecordedRequest) -> web.StreamResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        request[RESP_KEY] = ws
        self.sockets_open += 1
        try:
            return await self._socket(request, handshake, ws)
        finally:
            self.sockets_open -= 1

    async def _socket(self, request: web.Request, handshake: RecordedRequest,
                      ws: web.WebSocketResponse) -> web.WebSocketResponse:
        handshake.status = 101
        local: dict[str, list[Any]] = {}
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                await ws.send_str(_ws_error(400, FakeError.openai(400, "Binary WebSocket messages are not supported.",
                                                                  code="invalid_message")))
                continue
            if msg.type != WSMsgType.TEXT:
                continue
            rec = RecordedRequest(method="WS", path="/v1/responses", raw_path=request.raw_path, query={},
                                  query_string="", headers=handshake.headers, body=msg.data.encode(), json=None,
                                  transport="websocket")
            self.requests.append(rec)
            body = _ws_body(msg.data)
            if isinstance(body, FakeError):
                await ws.send_str(_ws_error(400, body))
                continue
            if await self._ws_turn(request, ws, rec, body, local):
                return ws
        return ws

    async def _ws_turn(self, request: web.Request, ws: web.WebSocketResponse, rec: RecordedRequest,
                       body: dict[str, Any], local: dict[str, list[Any]]) -> bool:
        """One `response.create` over the socket, answered (or refused) on it; True when the fault
        played ended the connection."""
        rec.json = body
        rec.summarizer_kind = self.summarizer_kind(body)
        rec.kind = "summarizer" if rec.summarizer_kind else "responses"
        fault = self._take_fault(rec)
        if fault and self.stall_before_headers_s:
            await asyncio.sleep(self.stall_before_headers_s)
        if fault and self.fail_status:
            rec.status = self.fail_status
            await ws.send_str(_ws_error(self.fail_status, status_error(self.fail_status, self.retry_after)))
            return False
        try:
            events = await self._answer(body, rec, self._context(True, local), True, local)
        except Failure as f:
            rec.status = f.err.status
            await ws.send_str(_ws_error(f.err.status, f.err))
            return False
        rec.status = 200
        numbered = ev.numbered(events)
        if "stream_id" in body:  # the lane's events echo it
            numbered = [{**e, "stream_id": body["stream_id"]} for e in numbered]
        chunks = [(orjson.dumps(e), i == len(numbered) - 1) for i, e in enumerate(numbered)]

        async def write(data: bytes) -> None:
            await ws.send_str(data.decode())

        async def abort() -> None:  # no close frame
            request[ABORTED_KEY] = True
            if request.transport is not None:
                request.transport.abort()

        outcome = await self._play(rec, chunks, fault, write, abort, _BROKEN_WS)
        if outcome == "broken":
            await ws.close(code=1011)
        return outcome in ("reset", "broken")


def _ws_body(data: str) -> dict[str, Any] | FakeError:
    """The request body of a `response.create` message (`stream` is implicit over a socket), or
    OpenAI's error for any other message."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return parse_error()
    if not isinstance(event, dict) or event.get("type") != "response.create":
        got = event.get("type") if isinstance(event, dict) else None
        return FakeError.openai(400, f"Invalid value: '{got}'. Supported values are: 'response.create'.",
                                code="invalid_value", param="type")
    body = {k: v for k, v in event.items() if k != "type"}
    body.pop("stream", None)  # implicit over a socket
    return body


_BROKEN_SSE = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":\n\n'
_BROKEN_WS = b'{"type":"response.output_text.delta","delta":'


def ev_text(item: dict[str, Any]) -> str:
    if item["type"] == "message":
        return "".join(p.get("text", "") for p in item["content"])
    return item.get("arguments") or item.get("input") or ""


def _ws_error(status: int, err: FakeError) -> str:
    """OpenAI's WebSocket error event: the HTTP status and the error object."""
    error = err.body.get("error") if isinstance(err.body, dict) else {"message": str(err.body)}
    return orjson.dumps({"type": "error", "status": status, "error": error}).decode()

