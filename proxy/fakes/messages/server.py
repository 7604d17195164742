"""A strict fake Anthropic Messages API (design.md sections 8 and 12) on 127.0.0.1.

- `POST /v1/messages`: Anthropic's validation (proxy/fakes/messages/validate.py): roles alternate
  (an assistant message may come first), every `tool_use` answered by `tool_result` blocks at the
  beginning of the very next user message, thinking / redacted_thinking blocks carrying the fake's
  own signature unchanged, at most 4 `cache_control` breakpoints (ephemeral, 5m or 1h, no 1h after
  a 5m), no prefill ending in whitespace, no forced tool_choice with thinking; 400 "prompt is too
  long" above its window; JSON or SSE; `x-api-key` (or `Authorization: Bearer`) and
  `anthropic-version` required as the API requires them;
- `POST /v1/messages/count_tokens`: the same validation, `{"input_tokens": N}`;
- a prompt cache that honours breakpoints (proxy/fakes/messages/cache.py) and reports
  cache_read_input_tokens / cache_creation_input_tokens; a recording of every request.

    async with FakeMessages(window=20000) as fake:
        client = AsyncAnthropic(base_url=fake.base_url, api_key="sk-ant-test")
        await client.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=[...])

Settings (attributes, settable any time, or keyword arguments):
  prompts_dir, require_api_key  as FakeUpstream (the key may come as x-api-key or Bearer)
  window, model_windows, encoding, token_scale   counting and the window (default 200000)
  reply               None: "ok: <last user text[:50]>" | str | dict ({"content", "thinking":
                      text, "redacted_thinking": bool, "tool_calls"/"tool_uses": [{"name",
                      "input"}]}) | FakeError | callable(view) (the chat-shaped view, view["raw"]
                      is the body). Thinking blocks come only when the request enables thinking.
  summarizer, summarizer_marker, summarizer_delay_s   as FakeUpstream
  merge_consecutive_roles  merge same-role turns as the API documents, instead of the 400
                      (default False: the fake insists on alternation)
  on_demand_compaction  serve the `compaction` parameter (beta compact-2026-09-04, asked in anthropic-beta;
                      default True): the answer is one `compaction` block signed by the fake, stop_reason
                      "compaction"; a signed block that comes back is checked. False: a server without it
                      (the parameter an extra input, the block an unknown tag)
  extra_block_types   block types accepted as opaque in either role (default none)
  cache_min_tokens    None: the model's minimum cacheable length | int
  prefix_check        None: thinking is bound to its prefix on the models that run the check
                      (proxy/fakes/messages/binding.py) | True | False: on every model, on none
  signing_key         None: a random key per fake | bytes: the key of thinking signatures and
                      redacted_thinking data (recorded sessions carry signatures made with a known key)
  fault_target, fault_times, fail_status, retry_after, stall_before_headers_s, stall_mid_stream_s,
  reset_mid_response, malformed_json, broken_sse, chunk_delay_s, release_last_chunk
                      the shared fault flags (proxy/fakes/faults.py), errors in Anthropic's shape
  error_mid_stream    None | an error type ("overloaded_error"): streams send Anthropic's `error`
                      event halfway and end (a fault flag too: fault_target and fault_times apply)
Recording: requests (kind "messages" | "summarizer" | "count_tokens" | "other"),
messages_requests, summarizer_requests, count_requests (parsed bodies).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from proxy.fakes.common import FakeError, Invalid, RecordedRequest, rand
from proxy.fakes.messages import events as ev
from proxy.fakes.messages.blocks import (
    MESSAGE_OVERHEAD,
    block_text,
    block_tokens,
    cache_segments,
    content_blocks,
    has_breakpoint,
    system_blocks,
    view,
)
from proxy.fakes.messages.cache import BreakpointCache
from proxy.fakes.messages import binding
from proxy.fakes.messages.validate import (
    Context,
    bound_prefix,
    check_request,
    compaction_signature,
    thinking_enabled,
    thinking_signature,
)
from proxy.fakes.model_server import Failure, ModelFake
from proxy.fakes.summarizer_match import is_cached_history_request, summarizer_kind


# 402 and 504: the defaults of BillingError and GatewayTimeoutError in the API reference's shared models.
_MESSAGES = {401: "invalid x-api-key", 402: "Billing error",
             403: "Your API key does not have permission to use the specified resource.",
             404: "Not found", 429: "Number of request tokens has exceeded your per-minute rate limit",
             500: "Internal server error", 504: "Request timeout", 529: "Overloaded"}


_BROKEN_SSE = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":\n\n'


class FakeMessages(ModelFake):
    model_kinds = ("messages", "summarizer")
    agent_kind = "messages"
    default_window = 200000
    base_path = ""  # the anthropic client's base_url has no /v1
    thread_name = "fake-messages"

    def __init__(self, **settings: Any) -> None:
        self._init_model_settings()
        self.merge_consecutive_roles: bool = False
        self.extra_block_types: set[str] = set()
        self.cache_min_tokens: int | None = None
        self.error_mid_stream: str | None = None
        self.prefix_check: bool | None = None
        self.on_demand_compaction: bool = True
        super().__init__(**settings)
        self._cache = BreakpointCache()

    # ---- recordings --------------------------------------------------------------------------

    @property
    def messages_requests(self) -> list[Any]:
        return [r.json for r in self.requests if r.kind == "messages"]

    @property
    def count_requests(self) -> list[Any]:
        return [r.json for r in self.requests if r.kind == "count_tokens"]

    def clear_requests(self) -> None:
        super().clear_requests()
        self._cache.clear()

    # ---- helpers for tests -------------------------------------------------------------------

    def sign_thinking(self, thinking: str, prefix: str | None = None) -> str:
        """A signature this fake accepts for that thinking text (for recorded sessions); bound to
        `prefix` (binding.prefix_digest) when given."""
        return thinking_signature(self.signer, thinking, prefix)

    def redacted_data(self, prefix: str | None = None) -> str:
        payload: dict[str, Any] = {"n": rand(8)}
        if prefix is not None:
            payload["prefix"] = prefix
        return self.signer.sign("redacted_thinking", payload)

    # ---- counting ----------------------------------------------------------------------------

    def _segment_tokens(self, body: dict[str, Any]) -> tuple[list[Any], list[int]]:
        segs = cache_segments(body)
        toks = []
        for kind, obj in segs:
            if kind == "tool":
                toks.append(self._count(orjson.dumps(obj).decode()))
            else:
                toks.append(block_tokens(obj, self._count) + (MESSAGE_OVERHEAD if kind in ("user", "assistant")
                                                                else 0))
        return segs, toks

    def count_input_tokens(self, body: dict[str, Any]) -> int:
        _, toks = self._segment_tokens(body)
        return int(sum(toks) * self.token_scale)

    def _usage(self, body: dict[str, Any], total: int) -> dict[str, int]:
        segs, toks = self._segment_tokens(body)
        toks = [int(n * self.token_scale) for n in toks]
        bps = [i for i, (_, obj) in enumerate(segs) if has_breakpoint(obj) or (
            isinstance(obj, dict) and obj.get("type") == "tool_result"
            and any(has_breakpoint(x) for x in content_blocks(obj.get("content"))
                    if isinstance(obj.get("content"), list)))]
        if body.get("cache_control") is not None and segs:
            bps.append(len(segs) - 1)
        u = self._cache.account(body["model"], segs, toks, sorted(set(bps)), total, self.cache_min_tokens)
        return {"input_tokens": u.input_tokens, "cache_creation_input_tokens": u.cache_creation_input_tokens,
                "cache_read_input_tokens": u.cache_read_input_tokens}

    # ---- classification ----------------------------------------------------------------------

    def summarizer_kind(self, body: Any) -> str | None:
        if not isinstance(body, dict):
            return None
        msgs = body.get("messages")
        last = msgs[-1] if isinstance(msgs, list) and msgs else None
        if isinstance(last, dict) and last.get("role") == "user":
            # The summary asked in the conversation's own request: its last block asks for it.
            tail = (content_blocks(last.get("content")) or [None])[-1]
            if is_cached_history_request(self.prompts_dir, block_text(tail)):
                return "history"
        system = "\n\n".join(block_text(b) for b in system_blocks(body))
        if not system:
            return None
        everything = "\n".join(block_text(b) for m in body.get("messages") or [] if isinstance(m, dict)
                               for b in content_blocks(m.get("content")))
        return summarizer_kind(self.prompts_dir, system, everything, self.summarizer_marker)

    def _classify(self, rec: RecordedRequest) -> None:
        if rec.method == "POST" and rec.path == "/v1/messages/count_tokens":
            rec.kind = "count_tokens"
        elif rec.method == "POST" and rec.path == "/v1/messages":
            rec.summarizer_kind = self.summarizer_kind(rec.json)
            rec.kind = "summarizer" if rec.summarizer_kind else "messages"

    # ---- routing -----------------------------------------------------------------------------

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        return {"request-id": "req_" + rand(24), "anthropic-organization-id": "00000000-fake-fake-fake-000000000000",
                **(extra or {})}

    def _error_response(self, rec: RecordedRequest, err: FakeError) -> web.Response:
        rec.status = err.status
        return web.Response(status=err.status, body=orjson.dumps(err.body),
                            headers=self._headers({"Content-Type": "application/json", **(err.headers or {})}))

    def _header_error(self, headers: dict[str, str]) -> FakeError | None:
        """The API's header checks: a key (x-api-key, or a Bearer token), then anthropic-version."""
        key = headers.get("x-api-key")
        auth = headers.get("authorization", "")
        bearer = auth[7:] if auth.lower().startswith("bearer ") else None
        if key is None and bearer is None:
            return FakeError.anthropic(401, "x-api-key header is required", "authentication_error")
        if self.require_api_key is not None and self.require_api_key not in (key, bearer):
            return FakeError.anthropic(401, "invalid x-api-key", "authentication_error")
        if "anthropic-version" not in headers:
            return FakeError.anthropic(400, "anthropic-version: header is required")
        return None

    def _fault_flags(self) -> tuple:
        return super()._fault_flags() + (self.error_mid_stream,)

    async def _route(self, request: web.Request, rec: RecordedRequest) -> web.StreamResponse:
        err = self._header_error(rec.headers)
        if err is not None:
            return self._error_response(rec, err)
        fault = self._take_fault(rec)
        if fault and self.stall_before_headers_s:
            await asyncio.sleep(self.stall_before_headers_s)
        if fault and self.fail_status:
            headers = {"retry-after": str(self.retry_after)} if self.retry_after is not None else None
            return self._error_response(rec, FakeError.anthropic(self.fail_status,
                                                                 _MESSAGES.get(self.fail_status, "Error"),
                                                                 headers=headers))
        if rec.kind == "count_tokens":
            return self._count_tokens(rec)
        if rec.kind in ("messages", "summarizer") or (request.method == "POST" and request.path == "/v1/messages"):
            return await self._create(request, rec, fault)
        return self._error_response(rec, FakeError.anthropic(404, "Not found", "not_found_error"))

    def _context(self, rec: RecordedRequest) -> Context:
        return Context(signer=self.signer, extra_block_types=frozenset(self.extra_block_types),
                       merge_consecutive_roles=self.merge_consecutive_roles, compaction=self.on_demand_compaction,
                       betas=rec.headers.get("anthropic-beta", ""))

    def _validate(self, rec: RecordedRequest, count_tokens: bool = False) -> dict[str, Any]:
        body = rec.json
        if body is None:
            raise Failure(FakeError.anthropic(400, "There was an error parsing the body of your request. Please "
                                                    "check the JSON format and try again."))
        try:
            check_request(body, self._context(rec), count_tokens=count_tokens)
        except Invalid as e:
            raise Failure(FakeError.anthropic(400, e.message)) from None
        return body

    def _count_tokens(self, rec: RecordedRequest) -> web.Response:
        try:
            body = self._validate(rec, count_tokens=True)
        except Failure as f:
            return self._error_response(rec, f.err)
        rec.prompt_tokens = n = self.count_input_tokens(body)
        rec.status = 200
        return web.Response(status=200, body=orjson.dumps({"input_tokens": n}),
                            headers=self._headers({"Content-Type": "application/json"}))

    async def _create(self, request: web.Request, rec: RecordedRequest, fault: bool) -> web.StreamResponse:
        transformations: list[dict[str, Any]] = []
        try:
            body = self._validate(rec)
            bound = binding.checks_prefix(body["model"]) if self.prefix_check is None else self.prefix_check
            if bound:
                try:
                    body, transformations = binding.check(body, lambda b: bound_prefix(self.signer, b),
                                                          rec.headers.get("anthropic-beta", ""))
                except Invalid as e:
                    raise Failure(FakeError.anthropic(400, e.message)) from None
            total = self.count_input_tokens(body)
            rec.prompt_tokens = total
            window = self.window_for(body["model"])
            if total > window:
                raise Failure(FakeError.anthropic(400, f"prompt is too long: {total} tokens > {window} maximum"))
            reply = await self._reply(body, rec) if "compaction" not in body else None
        except Failure as f:
            return self._error_response(rec, f.err)
        usage = self._usage(body, total)
        rec.cached_tokens = usage["cache_read_input_tokens"]
        prefix = binding.reply_prefix(body) if bound else None
        if reply is None:  # on-demand compaction: the one signed block, nothing sampled after it
            blocks, stop = [self._compaction_block(body, total)], "compaction"
        else:
            blocks = ev.content(reply, thinking_enabled(body) or (bound and body.get("thinking") is None),
                                lambda text: self.sign_thinking(text, prefix), lambda: self.redacted_data(prefix))
            stop = "tool_use" if reply.tool_uses else "end_turn"
        out_tokens = sum(block_tokens(b, self._count) for b in blocks)
        if out_tokens > body["max_tokens"]:
            stop, out_tokens = "max_tokens", body["max_tokens"]
        rec.completion_tokens = out_tokens
        final = ev.message_object("msg_01" + rand(22), body["model"], blocks, stop,
                                  {**usage, "output_tokens": out_tokens, "service_tier": "standard"})
        if transformations:
            final["input_transformations"] = transformations
        if not body.get("stream"):
            return await self._send_body(request, rec, orjson.dumps(final), status=200, fault=fault,
                                         headers=self._headers({"Content-Type": "application/json"}))
        events = ev.stream_events(final)
        if fault and self.error_mid_stream:
            events = events[: len(events) // 2] + [{"type": "error", "error": {
                "type": self.error_mid_stream, "message": _MESSAGES.get(529, "Error")
                if self.error_mid_stream == "overloaded_error" else "Internal server error"}}]
        chunks = [(ev.sse(e), i == len(events) - 1) for i, e in enumerate(events)]
        headers = self._headers({"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
        return await self._send_stream(request, rec, chunks, headers=headers, fault=fault, broken=_BROKEN_SSE)

    def _compaction_block(self, body: dict[str, Any], total: int) -> dict[str, Any]:
        """What the API's compaction answers: a summary (here one naming what it covered) and its signature."""
        content = f"Summary of {len(body['messages'])} messages ({total} tokens) by {body['model']}."
        return {"type": "compaction", "content": content, "signature": compaction_signature(self.signer, content)}

    async def _reply(self, body: dict[str, Any], rec: RecordedRequest) -> ev.Reply:
        return await self._scripted(view(body), rec, ev.normalize_reply, lambda m: FakeError.anthropic(500, m))
