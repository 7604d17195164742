"""A fake OpenAI API (design.md § How it is tested) that the proxy under test forwards to.

The real upstream is out of reach in tests, so this is a real aiohttp server on 127.0.0.1 that
behaves like the parts of the OpenAI API the proxy touches, strictly enough that a proxy bug
(a broken tool-call pairing, an oversized request, a mangled stream) fails the test the way it
would fail against OpenAI:

- `POST /v1/chat/completions`: OpenAI's validation (roles, content types, tool-call pairing),
  a context window with a `context_length_exceeded` error, scripted answers, non-streaming JSON
  and SSE streams in OpenAI's exact shapes, and a separate scripted summarizer for the proxy's
  own summarization calls (recognized by their system prompt);
- `GET /v1/models`, `GET /v1/models/{id}`, `POST /v1/embeddings`: OpenAI shapes;
- any other `/v1/...` request: echoed back as JSON with `x-upstream-echo: 1`, so pass-through
  tests can compare exactly what arrived;
- fault flags for reliability tests, and a recording of every request.

This module is the server and its settings; beside it are OpenAI's validation of a chat request
(validate.py), the default answers and their shaping (replies.py), the stream and body of an answer
(events.py), the prompt count (counting.py) and the other endpoints (endpoints.py).

Use it in the test's event loop::

    async with FakeUpstream(window=8000) as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-test")
        ...
        assert fake.chat_requests[-1]["messages"][0]["role"] == "system"

or through tests/conftest.py's `upstream` fixture, or from synchronous code with
`with FakeUpstream() as fake:` (runs its own loop in a thread).
Every public attribute can be changed at any time, also while the server runs; each request
reads them when it arrives. See the FakeUpstream docstring for the list.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any, Awaitable, Callable, Union

import orjson
from aiohttp import web

from proxy.fakes.chat import endpoints
from proxy.fakes.chat.counting import message_tokens, prompt_tokens
from proxy.fakes.chat.events import Reply, completion, sse_events, usage
from proxy.fakes.chat.replies import content_text, default_history_summary, default_tool_summary, shape_reply
from proxy.fakes.chat.validate import llama_rejection, parse_error, validation_error
from proxy.fakes.common import FakeError, RecordedRequest, count_text_tokens, rand, resolve, truncate_to_tokens
from proxy.fakes.faults import FaultInjection
from proxy.fakes.openai_errors import context_length_error, key_error, status_error
from proxy.fakes.prompt_cache import PrefixCache, openai_cached_tokens, segment_key
from proxy.fakes.server import FakeServer
from proxy.fakes.summarizer_match import is_cached_history_request, summarizer_kind as _summarizer_kind
from proxy.prompts import default_dir

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# What a test scripts (the `reply` and `summarizer` settings)


Scripted = Union[str, dict, FakeError, None]
ReplySpec = Union[str, dict, FakeError, None, Callable[[dict], Union[Scripted, Awaitable[Scripted]]]]
SummarizerSpec = Union[str, FakeError, None, Callable[[dict], Union[str, FakeError, None, Awaitable[Any]]]]


# --------------------------------------------------------------------------------------------


class FakeUpstream(FakeServer, FaultInjection):
    """A fake OpenAI API server on 127.0.0.1 (random port). Attributes (settable any time, or as
    keyword arguments of the constructor):

    Server
      base_url            "http://127.0.0.1:PORT/v1" (after start)
      port, loop          the bound port; the event loop the server runs in
      prompts_dir         where the proxy's prompts live (default: the package's own), read per request
      require_api_key     None (accept any) | "sk-..": other/missing Bearer key -> 401 invalid_api_key

    Chat completions
      window              context window in tokens (default 128000); above it -> 400
                          context_length_exceeded
      model_windows       {model: window} overrides for particular models
      encoding            tiktoken encoding used to count (default "cl100k_base")
      token_scale         multiply prompt counts by this (default 1.0): imitates a model whose
                          tokenizer counts more/less than tiktoken; affects the window and usage
      reject_param        None | "max_tokens" | "max_completion_tokens": 400 unsupported_parameter
      reject_consecutive_user  400 on two user messages in a row (some open-model chat templates)
      reject_null_content_with_tool_calls  500 on an assistant message with `content: null` next to
                          its tool_calls, as llama.cpp's server answers it (OpenAI accepts it; "" passes)
      empty_stream_on_overflow  a streaming request over the window gets 200, text/event-stream and
                          an empty body (no event, no [DONE]), as llama.cpp's server answers it: the
                          error is raised after the headers went out (non-streaming ones: the 400)
      empty_stream_on_llama_error  the same empty stream for a streaming request that fails one of
                          llama.cpp's own checks (reject_null_content_with_tool_calls): its server
                          starts the stream before it validates, whatever the size of the request
      close_after_empty_stream_s  None | seconds: then close that connection, without a
                          `Connection: close` header, as the real server does at once; a delay
                          makes a client's reuse of the pooled connection fail for certain
      truncate_to_max_tokens   (default True) cut the content at max_completion_tokens/max_tokens
                          with finish_reason "length", as OpenAI does
      reply               None: "ok: <last user text[:50]>" | str | dict assistant message
                          ({"content": .., "tool_calls": [..], "finish_reason": ..}; tool calls in
                          OpenAI form or shorthand {"name", "arguments": str|dict}, ids generated
                          when missing) | FakeError | callable(body) returning any of those
                          (None -> default), sync or async
      chunk_delay_s       sleep before every stream chunk after the first (default 0)
      release_last_chunk  None | asyncio.Event: streams (not summarizer ones) park before their
                          final (finish_reason) chunk until it is set, and set
      last_chunk_waiting  asyncio.Event the fake sets when a stream is parked there (never cleared
                          by the fake)

    Summarizer (requests whose first message is a system/developer message starting with the
    first 60 characters, whitespace-collapsed, of prompts/summarization-system.md ["history"] or
    prompts/tool-result-summarizer.md ["tool"], or containing `summarizer_marker`; for the
    marker, kind is "tool" when the request carries "--- BEGIN TOOL OUTPUT ---")
      summarizer_marker   None | str
      summarizer          None: default_history_summary / default_tool_summary | str | FakeError |
                          callable(body) -> str | FakeError | None (None -> default), sync or async
      summarizer_delay_s  sleep before answering a summarizer request (default 0)
      endless_summary     summarizer answers a huge text (`endless_summary_chars`, default 1e6
                          chars, repeated valid summary) and ignores max tokens

    Faults (apply to requests selected by fault_target, for fault_times requests)
      fault_target        "all" (default; every endpoint) | "completions" | "chat" | "summarizer"
      fault_times         None: forever | n: only the next n selected requests
      fail_status         answer with this status and OpenAI's error body for it
      retry_after         with fail_status: value of a Retry-After header
      stall_before_headers_s  sleep this long before sending anything
      stall_mid_stream_s  send about half of the body / stream, sleep, then send the rest
      reset_mid_response  send about half of the body / stream, then abort the connection
      malformed_json      non-streaming JSON answers: 200 with a truncated (invalid) JSON body
      broken_sse          streams: after about half of the chunks send a data line with invalid
                          JSON and end without [DONE]

    Other endpoints
      models              ids listed by GET /v1/models
      embedding_dimensions  default vector length of POST /v1/embeddings (8)

    Recording
      requests            every RecordedRequest, in arrival order
      chat_requests       parsed bodies of non-summarizer chat completion requests (valid or not)
      summarizer_requests parsed bodies of summarizer requests (also history_/tool_summarizer_requests)
      disconnects         how many requests the client abandoned before the answer was complete
      errors              exceptions raised by scripted callables (they are answered with a 500)
    """

    def __init__(self, **settings: Any) -> None:
        self.prompts_dir: Any = default_dir()  # a path, or the package's Traversable
        self.require_api_key: str | None = None

        self.window: int = 128000
        self.model_windows: dict[str, int] = {}
        self.encoding: str = "cl100k_base"
        self.token_scale: float = 1.0
        self.reject_param: str | None = None
        self.reject_consecutive_user: bool = False
        self.reject_null_content_with_tool_calls: bool = False
        self.empty_stream_on_overflow: bool = False
        self.empty_stream_on_llama_error: bool = False
        self.close_after_empty_stream_s: float | None = None
        self.truncate_to_max_tokens: bool = True
        self.reply: ReplySpec = None

        self.summarizer_marker: str | None = None
        self.summarizer: SummarizerSpec = None
        self.summarizer_delay_s: float = 0.0
        self.endless_summary: bool = False
        self.endless_summary_chars: int = 1_000_000

        self._init_faults()  # fault flags, chunk_delay_s, release_last_chunk (proxy/fakes/faults.py)

        self.models: list[str] = ["gpt-4o-mini", "gpt-4o", "gpt-4.1", "gpt-3.5-turbo", "text-embedding-3-small"]
        self.embedding_dimensions: int = 8

        super().__init__(**settings)
        self._prefix_cache = PrefixCache()

    # ---- recordings --------------------------------------------------------------------------

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        return [r.json for r in self.requests if r.kind == "chat"]

    @property
    def summarizer_requests(self) -> list[dict[str, Any]]:
        return [r.json for r in self.requests if r.kind == "summarizer"]

    @property
    def history_summarizer_requests(self) -> list[dict[str, Any]]:
        return [r.json for r in self.requests if r.summarizer_kind == "history"]

    @property
    def tool_summarizer_requests(self) -> list[dict[str, Any]]:
        return [r.json for r in self.requests if r.summarizer_kind == "tool"]

    def clear_requests(self) -> None:
        """Forget the recordings and the simulated prompt cache (settings stay)."""
        super().clear_requests()
        self._prefix_cache.clear()

    # ---- summarizer recognition ----------------------------------------------------------------

    def summarizer_kind(self, body: Any) -> str | None:
        """"history" | "tool" for a summarizer request, else None."""
        if not isinstance(body, dict):
            return None
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not isinstance(msgs[0], dict):
            return None
        last = msgs[-1]
        if isinstance(last, dict) and last.get("role") == "user" and \
                is_cached_history_request(self.prompts_dir, content_text(last.get("content"))):
            return "history"
        if msgs[0].get("role") not in ("system", "developer"):
            return None
        system = content_text(msgs[0].get("content"))
        everything = "\n".join(content_text(m.get("content")) for m in msgs if isinstance(m, dict))
        return _summarizer_kind(self.prompts_dir, system, everything, self.summarizer_marker)

    def is_summarizer_request(self, body: Any) -> bool:
        return self.summarizer_kind(body) is not None

    # ---- token counting ----------------------------------------------------------------------

    def window_for(self, model: str) -> int:
        return self.model_windows.get(model, self.window)

    def _count(self, text: str) -> int:
        return count_text_tokens(text, self.encoding)

    def _truncate(self, text: str, limit: int) -> str:
        return truncate_to_tokens(text, limit, self.encoding)

    def message_tokens(self, m: dict[str, Any]) -> int:
        """~3 per message + role + content (+ name) + tool call names and arguments."""
        return message_tokens(m, self._count)

    def count_prompt_tokens(self, body: dict[str, Any]) -> int:
        """The fake's prompt token count (window check and usage.prompt_tokens)."""
        return prompt_tokens(body, self._count, self.token_scale)

    def _cached_tokens(self, body: dict[str, Any]) -> int:
        """Simulated prompt cache: tokens of the longest message prefix (same model and tools)
        that an earlier request already sent, counted as OpenAI does: nothing under 1024 tokens,
        then in steps of 128 (1024, 1152, 1280 ...)."""
        msgs = [m for m in body.get("messages") or []]
        segments = [(segment_key(m), self.message_tokens(m) if isinstance(m, dict) else 0) for m in msgs]
        cached = self._prefix_cache.longest_seen([body.get("model"), body.get("tools")], segments)
        return openai_cached_tokens(int(cached * self.token_scale))

    # ---- validation --------------------------------------------------------------------------

    def validate_chat(self, body: Any) -> FakeError | None:
        """OpenAI's 400 for an invalid chat completion request, or None when it is valid."""
        return validation_error(body, reject_param=self.reject_param, reject_consecutive_user=self.reject_consecutive_user)

    # ---- request handling --------------------------------------------------------------------

    def _classify(self, rec: RecordedRequest) -> None:
        if rec.method == "POST" and rec.path == "/v1/chat/completions" and isinstance(rec.json, dict):
            rec.summarizer_kind = self.summarizer_kind(rec.json)
            rec.kind = "summarizer" if rec.summarizer_kind else "chat"

    model_kinds = ("chat", "summarizer")
    agent_kind = "chat"

    def _is_model_call(self, rec: RecordedRequest) -> bool:
        return rec.method == "POST" and rec.path == "/v1/chat/completions"

    async def _route(self, request: web.Request, rec: RecordedRequest) -> web.StreamResponse:
        fault = self._take_fault(rec)
        if fault and self.stall_before_headers_s:
            await asyncio.sleep(self.stall_before_headers_s)
        err = key_error(self.require_api_key, rec.headers)
        if err is None and fault and self.fail_status:
            err = status_error(self.fail_status, self.retry_after)
        if err is not None:
            return await self._send_error(request, rec, err)
        return await self._endpoint(request, rec, fault)

    async def _endpoint(self, request: web.Request, rec: RecordedRequest, fault: bool) -> web.StreamResponse:
        method, path = request.method, request.path
        if method == "POST" and path == "/v1/chat/completions":
            return await self._chat(request, rec, fault)
        if method == "POST" and path == "/v1/embeddings":
            answer = endpoints.embeddings_answer(rec.json, self.embedding_dimensions, self._count)
        elif method == "GET" and (path == "/v1/models" or path.startswith("/v1/models/")):
            answer = endpoints.model_answer(path, self.models)
        elif path.startswith("/v1/"):
            echo = endpoints.echo(method, path, request.raw_path, request.query_string, rec)
            return await self._send_json(request, rec, echo, headers={"x-upstream-echo": "1"}, fault=fault)
        else:
            answer = FakeError.openai(404, f"Invalid URL ({method} {path})")
        if isinstance(answer, FakeError):
            return await self._send_error(request, rec, answer)
        return await self._send_json(request, rec, answer, fault=fault)

    # ---- chat completions --------------------------------------------------------------------

    async def _chat(self, request: web.Request, rec: RecordedRequest, fault: bool) -> web.StreamResponse:
        body = rec.json
        refused = await self._refuse(request, rec, body)
        if refused is not None:
            return refused
        rec.cached_tokens = self._cached_tokens(body)
        try:
            reply, huge = await self._scripted(rec, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken scripted callable: make it visible, not a hang
            self.errors.append(exc)
            log.exception("fake upstream: scripted answer failed")
            return await self._send_error(request, rec, FakeError.openai(500, f"fake upstream: scripted answer failed: {exc!r}"))
        if isinstance(reply, FakeError):
            return await self._send_error(request, rec, reply)
        return await self._answer(request, rec, body, reply, huge, fault)

    async def _refuse(self, request: web.Request, rec: RecordedRequest, body: Any) -> web.StreamResponse | None:
        """OpenAI's refusal of an invalid request or of one over the window (llama.cpp's empty stream
        when the fake plays it); None for a request the model answers. Sets rec.prompt_tokens."""
        if body is None:
            return await self._send_error(request, rec, parse_error())
        err = self.validate_chat(body)
        if err is None and self.reject_null_content_with_tool_calls and (err := llama_rejection(body)) is not None:
            if self.empty_stream_on_llama_error and body.get("stream"):
                return await self._empty_stream(request, rec)
        if err is not None:
            return await self._send_error(request, rec, err)
        window = self.window_for(body["model"])
        rec.prompt_tokens = tokens = self.count_prompt_tokens(body)
        if tokens > window and self.empty_stream_on_overflow and body.get("stream"):
            return await self._empty_stream(request, rec)
        if tokens > window:
            return await self._send_error(request, rec, context_length_error(window, tokens))
        return None

    async def _scripted(self, rec: RecordedRequest, body: dict[str, Any]) -> tuple[Reply | FakeError, bool]:
        """The scripted answer (a summary for the proxy's summarizer calls, else `reply`) and whether it
        is an endless summary (never cut at max tokens, counted by its characters)."""
        if rec.kind == "summarizer":
            result, huge = await self._summary(rec, body)
        else:
            result, huge = await resolve(self.reply, body), False
        if isinstance(result, FakeError):
            return result, huge
        cut = self.truncate_to_max_tokens and not huge
        limit = body.get("max_completion_tokens") or body.get("max_tokens") if cut else None
        return shape_reply(result, body, limit, self._truncate, self._count), huge

    async def _summary(self, rec: RecordedRequest, body: dict[str, Any]) -> tuple[Any, bool]:
        if self.summarizer_delay_s:
            await asyncio.sleep(self.summarizer_delay_s)
        result: Any = await resolve(self.summarizer, body)
        if result is None:
            default = default_tool_summary if rec.summarizer_kind == "tool" else default_history_summary
            result = default(body)
        if not (self.endless_summary and isinstance(result, str)):
            return result, False
        unit = result + "\n"
        return (unit * (self.endless_summary_chars // len(unit) + 1))[: self.endless_summary_chars], True

    async def _answer(self, request: web.Request, rec: RecordedRequest, body: dict[str, Any], reply: Reply,
                      huge: bool, fault: bool) -> web.StreamResponse:
        """The completion, as a stream or as one JSON body, with its usage."""
        text = reply.content or ""
        rec.completion_tokens = (len(text) // 4 if huge else self._count(text)) + sum(
            self._count(tc["function"]["name"]) + self._count(tc["function"]["arguments"]) for tc in reply.tool_calls)
        used = usage(rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens)
        model, cid, created = body["model"], "chatcmpl-" + rand(29), int(time.time())
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = sse_events(cid, created, model, reply, used if include_usage else None)
            return await self._stream(request, rec, events, fault)
        return await self._send_json(request, rec, completion(cid, created, model, reply, used), fault=fault)

    # ---- writing answers -----------------------------------------------------------------------

    def _headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {"x-request-id": "req_" + secrets.token_hex(16), "openai-version": "2020-10-01",
             "openai-processing-ms": "5"}
        h.update(extra or {})
        return h

    async def _send_error(self, request: web.Request, rec: RecordedRequest, err: FakeError) -> web.StreamResponse:
        if isinstance(err.body, (bytes, str)):
            data = err.body.encode() if isinstance(err.body, str) else err.body
            ctype = "text/plain; charset=utf-8"
        else:
            data = orjson.dumps(err.body, option=orjson.OPT_INDENT_2)
            ctype = "application/json"
        rec.status = err.status
        return web.Response(status=err.status, body=data, headers=self._headers({"Content-Type": ctype, **(err.headers or {})}))

    async def _send_json(self, request: web.Request, rec: RecordedRequest, payload: Any, *, status: int = 200,
                         headers: dict[str, str] | None = None, fault: bool = False) -> web.StreamResponse:
        data = orjson.dumps(payload, option=orjson.OPT_INDENT_2)  # OpenAI pretty-prints JSON answers
        hdrs = self._headers({"Content-Type": "application/json", **(headers or {})})
        return await self._send_body(request, rec, data, status=status, headers=hdrs, fault=fault)

    async def _stream(self, request: web.Request, rec: RecordedRequest, events: list[tuple[bytes, bool]],
                      fault: bool) -> web.StreamResponse:
        headers = self._headers({"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
        broken = b'data: {"id":"chatcmpl-broken","object":"chat.completion.chunk","choices":[{"delta":\n\n'
        return await self._send_stream(request, rec, events, headers=headers, fault=fault, broken=broken)

    async def _empty_stream(self, request: web.Request, rec: RecordedRequest) -> web.StreamResponse:
        """llama.cpp's server: 200, no event at all, a clean end of the chunked body; its server
        (uvicorn) then closes the connection. A request the client sent on it meanwhile is lost."""
        transport = request.transport  # the request lets go of it once the answer is complete
        resp = await self._stream(request, rec, [], fault=False)
        if self.close_after_empty_stream_s is not None and transport is not None:
            await asyncio.sleep(self.close_after_empty_stream_s)
            transport.close()
        return resp
