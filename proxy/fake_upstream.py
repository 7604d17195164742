"""A fake OpenAI API (design.md section 8) that the proxy under test forwards to.

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

Use it in the test's event loop::

    async with FakeUpstream(window=8000) as fake:
        client = AsyncOpenAI(base_url=fake.base_url, api_key="sk-test")
        ...
        assert fake.chat_requests[-1]["messages"][0]["role"] == "system"

or through the `fake_upstream` fixture below (`from proxy.fake_upstream import fake_upstream` in a
test module; tests/conftest.py has an equivalent `upstream` fixture), or from
synchronous code with `with FakeUpstream() as fake:` (runs its own loop in a thread).
Every public attribute can be changed at any time, also while the server runs; each request
reads them when it arrives. See the FakeUpstream docstring for the list.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import re
import secrets
import struct
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Union

import orjson
from aiohttp import web

from proxy.fakes.common import (
    FakeError,
    Invalid as _Invalid,
    RecordedRequest,
    count_text_tokens,
    rand as _rand,
    resolve as _resolve,
    split_args as _split_args,
    split_text as _split_text,
    truncate_to_tokens as _truncate_to_tokens,
    type_phrase as _type_phrase,
    utf8_or_none as _utf8_or_none,
)
from proxy.fakes.prompt_cache import PrefixCache, openai_cached_tokens, segment_key
from proxy.fakes.faults import FaultInjection
from proxy.fakes.server import FakeServer
from proxy.fakes.summarizer_match import (  # noqa: F401 (the prompt file names stay importable from here)
    HISTORY_PROMPT_FILE,
    PROMPT_MATCH_CHARS,
    TOOL_OUTPUT_BEGIN,
    TOOL_OUTPUT_END,
    TOOL_PROMPT_FILE,
    is_cached_history_request,
    summarizer_kind as _summarizer_kind,
)
from proxy.prompts import SUMMARY_HEADINGS, default_dir

log = logging.getLogger(__name__)

ROLES = ("system", "developer", "user", "assistant", "tool")
IMAGE_TOKENS = 765  # fixed estimate per image part (a 512x512 high-detail image)
SYSTEM_FINGERPRINT = "fp_fake0000"

# The format our summarizer prompts ask for: the fake's default summaries are valid ones.
HISTORY_SUMMARY_HEADINGS = SUMMARY_HEADINGS


# --------------------------------------------------------------------------------------------
# Scripted errors


def status_error(status: int, retry_after: float | int | None = None) -> FakeError:
    """The error OpenAI sends for a status (what `fail_status` returns)."""
    headers = {"Retry-After": _fmt_num(retry_after)} if retry_after is not None else None
    if status == 401:
        return FakeError.openai(
            401,
            "Incorrect API key provided: sk-****. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            code="invalid_api_key",
            headers=headers,
        )
    if status == 429:
        return FakeError.openai(
            429,
            "Rate limit reached for requests. Please try again later.",
            type="requests",
            code="rate_limit_exceeded",
            headers=headers,
        )
    if status == 503:
        return FakeError.openai(503, "The engine is currently overloaded, please try again later.", headers=headers)
    if status >= 500:
        return FakeError.openai(
            status,
            "The server had an error while processing your request. Sorry about that!",
            headers=headers,
        )
    return FakeError.openai(status, f"Fake upstream error (HTTP {status}).", headers=headers)


def _fmt_num(x: float | int) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


# --------------------------------------------------------------------------------------------
# Helpers on chat bodies


def content_text(content: Any) -> str:
    """The text of a message content: a string, or the text parts of a list joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def last_user_text(body: dict[str, Any]) -> str:
    for m in reversed(body.get("messages") or []):
        if isinstance(m, dict) and m.get("role") == "user":
            return content_text(m.get("content"))
    return ""


def default_reply(body: dict[str, Any]) -> str:
    """What the fake answers when `reply` is None: "ok: " + first 50 chars of the last user text."""
    return "ok: " + last_user_text(body)[:50]


_LABEL_RE = re.compile(r"\n\[(?:User|Assistant|System|Tool call|Tool result[^\]\n]*)\]:|</conversation>")


def _last_block(text: str, label: str) -> str | None:
    i = text.rfind(label)
    if i < 0:
        return None
    rest = text[i + len(label) :]
    m = _LABEL_RE.search(rest)
    return (rest[: m.start()] if m else rest).strip()


def default_history_summary(body: dict[str, Any]) -> str:
    """A valid history summary (every required heading), deterministic for the same input.

    The Critical Context line carries `fake-summary-<hash of the summarizer's user message>` so a
    test can tell which summary ended up in a forwarded request. About 200 tokens.
    """
    convo = last_user_text(body)
    digest = hashlib.sha256(convo.encode("utf-8")).hexdigest()[:12]
    task = _last_block(convo, "[User]:") or "(no user request found)"
    if len(task) > 300:
        task = task[:300] + " ..."
    update = "<previous-summary>" in convo
    return (
        "## Active Task\n"
        f"{task}\n\n"
        "## Goal\n"
        "Complete the user's request described in the conversation.\n\n"
        "## Constraints & Preferences\n"
        "- (none recorded)\n\n"
        "## Progress\n"
        "### Done\n"
        f"- [x] {'Updated the previous summary with newer messages' if update else 'Reviewed the earlier conversation'}\n\n"
        "### In Progress\n"
        "- [ ] Continue the active task\n\n"
        "### Blocked\n"
        "- (none)\n\n"
        "## Key Decisions\n"
        "- **Keep going**: the conversation so far is on track\n\n"
        "## Answered Questions\n"
        "- (none)\n\n"
        "## Next Steps\n"
        "1. Continue the active task\n\n"
        "## Critical Context\n"
        f"- fake-summary-{digest}\n"
    )


_TOOL_NAME_RES = (
    re.compile(r"\[Summary of ([\w.\-]+) output\]"),
    re.compile(r"(?im)^\W*tool(?:[ _-]?name)?\W*[:=]\s*[`'\"*]*([\w.\-]+)"),
    re.compile(r"<tool(?:_name)?>\s*([\w.\-]+)\s*</tool(?:_name)?>"),
    re.compile(r"(?i)\btool\s+[`'\"]([\w.\-]+)[`'\"]"),
)


def tool_output_payload(text: str) -> str | None:
    """The raw tool output between the BEGIN/END marker lines, or None."""
    i = text.find(TOOL_OUTPUT_BEGIN)
    j = text.rfind(TOOL_OUTPUT_END)
    if i < 0 or j < i:
        return None
    return text[i + len(TOOL_OUTPUT_BEGIN) : j].strip("\n")


def default_tool_summary(body: dict[str, Any]) -> str:
    """A short tool-result summary: `[Summary of <tool> output]`, `## Key facts`, `## Original size`.

    The tool name is guessed from the request ("Tool: name", "tool name: name", "<tool>name</tool>",
    "tool `name`"; else "tool"). About 60-90 tokens, so keep test payloads bigger than that.
    """
    text = "\n".join(content_text(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict))
    user = last_user_text(body)
    payload = tool_output_payload(user)
    if payload is None:
        payload = tool_output_payload(text) or ""
    outside = user.replace(payload, "") if payload else user
    name = "tool"
    for rx in _TOOL_NAME_RES:
        m = rx.search(outside)
        if m:
            name = m.group(1)
            break
    lines = payload.splitlines() or [""]
    first, last = lines[0].strip()[:80], lines[-1].strip()[:80]
    return (
        f"[Summary of {name} output]\n"
        f"Fake summary of a {len(lines)}-line tool output.\n\n"
        "## Key facts\n"
        f"- First line: {first}\n"
        f"- Last line: {last}\n\n"
        "## Original size\n"
        f"{len(payload)} characters, {len(lines)} lines\n"
    )


@dataclass
class _Reply:
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str


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

    def message_tokens(self, m: dict[str, Any]) -> int:
        """~3 per message + role + content (+ name) + tool call names and arguments."""
        n = 3 + self._count(str(m.get("role", "")))
        content = m.get("content")
        if isinstance(content, str):
            n += self._count(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                if isinstance(part.get("text"), str):
                    n += self._count(part["text"])
                elif isinstance(part.get("refusal"), str):
                    n += self._count(part["refusal"])
                elif part.get("type") == "image_url":
                    n += IMAGE_TOKENS
                else:
                    n += self._count(orjson.dumps(part).decode())
        if isinstance(m.get("name"), str):
            n += self._count(m["name"]) + 1
        for tc in m.get("tool_calls") or []:
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict):
                n += 3 + self._count(str(fn.get("name", ""))) + self._count(str(fn.get("arguments", "")))
        return n

    def count_prompt_tokens(self, body: dict[str, Any]) -> int:
        """The fake's prompt token count (window check and usage.prompt_tokens)."""
        n = 3  # priming of the reply
        for m in body.get("messages") or []:
            if isinstance(m, dict):
                n += self.message_tokens(m)
        for tool in body.get("tools") or []:
            n += self._count(orjson.dumps(tool).decode())
        return int(n * self.token_scale)

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
        try:
            self._check_chat(body)
        except _Invalid as e:
            return FakeError.openai(400, e.message, "invalid_request_error", e.code, e.param)
        return None

    def _check_chat(self, body: Any) -> None:
        if not isinstance(body, dict):
            raise _Invalid(f"Invalid type for request body: expected an object, but got {_type_phrase(body)} instead.",
                           None, "invalid_type")
        model = body.get("model")
        if model is None:
            raise _Invalid("you must provide a model parameter")
        if not isinstance(model, str):
            raise _Invalid(f"Invalid type for 'model': expected a string, but got {_type_phrase(model)} instead.",
                           "model", "invalid_type")
        if self.reject_param and body.get(self.reject_param) is not None:
            other = "max_completion_tokens" if self.reject_param == "max_tokens" else "max_tokens"
            raise _Invalid(
                f"Unsupported parameter: '{self.reject_param}' is not supported with this model. Use '{other}' instead.",
                self.reject_param,
                "unsupported_parameter",
            )
        for p in ("max_tokens", "max_completion_tokens"):
            v = body.get(p)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool):
                raise _Invalid(f"Invalid type for '{p}': expected an integer, but got {_type_phrase(v)} instead.",
                               p, "invalid_type")
            if v < 1:
                raise _Invalid(f"Invalid '{p}': integer below minimum value. Expected a value >= 1, but got {v} instead.",
                               p, "integer_below_min_value")
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            raise _Invalid(f"Invalid type for 'stream': expected a boolean, but got {_type_phrase(stream)} instead.",
                           "stream", "invalid_type")
        if body.get("stream_options") is not None and not stream:
            raise _Invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
        self._check_tools(body.get("tools"))

        msgs = body.get("messages")
        if msgs is None:
            raise _Invalid("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
        if not isinstance(msgs, list):
            raise _Invalid(f"Invalid type for 'messages': expected an array, but got {_type_phrase(msgs)} instead.",
                           "messages", "invalid_type")
        if not msgs:
            raise _Invalid("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an "
                           "empty array instead.", "messages", "empty_array")
        for i, m in enumerate(msgs):
            self._check_message(i, m)
        self._check_tool_pairing(msgs)
        if self.reject_consecutive_user:
            for i in range(1, len(msgs)):
                if msgs[i]["role"] == "user" and msgs[i - 1]["role"] == "user":
                    raise _Invalid("Conversation roles must alternate user/assistant/user/assistant/...", "messages")

    def _llama_validation(self, body: dict[str, Any]) -> FakeError | None:
        """llama.cpp's server-only rejections that are switched on: a 500 with a pydantic message."""
        if not self.reject_null_content_with_tool_calls:
            return None
        for i, m in enumerate(body["messages"]):
            if m["role"] == "assistant" and m.get("tool_calls") and m.get("content") is None:
                return FakeError.openai(
                    500,
                    f"1 validation error:\n  {{'type': 'string_type', 'loc': ('body', 'messages', {i}, "
                    "'content'), 'msg': 'Input should be a valid string', 'input': None}",
                    "internal_server_error",
                )
        return None

    def _check_tools(self, tools: Any) -> None:
        if tools is None:
            return
        if not isinstance(tools, list):
            raise _Invalid(f"Invalid type for 'tools': expected an array, but got {_type_phrase(tools)} instead.",
                           "tools", "invalid_type")
        if not tools:
            raise _Invalid("Invalid 'tools': empty array. Expected an array with minimum length 1, but got an empty "
                           "array instead.", "tools", "empty_array")
        for j, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
                raise _Invalid(f"Invalid value for 'tools[{j}]': expected an object with type 'function' and a "
                               "'function' object.", f"tools[{j}]", "invalid_value")
            name = t["function"].get("name")
            if not isinstance(name, str):
                raise _Invalid(f"Missing required parameter: 'tools[{j}].function.name'.", f"tools[{j}].function.name",
                               "missing_required_parameter")
            if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name):
                raise _Invalid(f"Invalid 'tools[{j}].function.name': string does not match pattern. Expected a string "
                               "that matches the pattern '^[a-zA-Z0-9_-]+$'.", f"tools[{j}].function.name",
                               "invalid_value")

    def _check_message(self, i: int, m: Any) -> None:
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _Invalid(f"Invalid type for '{at}': expected an object, but got {_type_phrase(m)} instead.",
                           at, "invalid_type")
        role = m.get("role")
        if role is None:
            raise _Invalid(f"Missing required parameter: '{at}.role'.", f"{at}.role", "missing_required_parameter")
        if role not in ROLES:
            raise _Invalid(f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'tool', "
                           "and 'developer'.", f"{at}.role", "invalid_value")
        if m.get("name") is not None and not isinstance(m["name"], str):
            raise _Invalid(f"Invalid type for '{at}.name': expected a string, but got {_type_phrase(m['name'])} instead.",
                           f"{at}.name", "invalid_type")
        tool_calls = m.get("tool_calls")
        if tool_calls is not None and role == "assistant":
            self._check_tool_calls(at, tool_calls)

        content = m.get("content")
        if content is None:
            if role == "assistant":
                if not tool_calls and m.get("function_call") is None:
                    raise _Invalid("Invalid value for 'content': expected a string, got null.",
                                   f"messages.[{i}].content")
            elif "content" not in m:
                raise _Invalid(f"Missing required parameter: '{at}.content'.", f"{at}.content",
                               "missing_required_parameter")
            else:
                raise _Invalid(f"Invalid type for '{at}.content': expected one of a string or array of objects, but "
                               "got null instead.", f"{at}.content", "invalid_type")
        elif isinstance(content, list):
            self._check_parts(at, role, content)
        elif not isinstance(content, str):
            raise _Invalid(f"Invalid type for '{at}.content': expected one of a string or array of objects, but got "
                           f"{_type_phrase(content)} instead.", f"{at}.content", "invalid_type")
        if role == "tool":
            tcid = m.get("tool_call_id")
            if tcid is None:
                raise _Invalid(f"Missing required parameter: '{at}.tool_call_id'.", f"{at}.tool_call_id",
                               "missing_required_parameter")
            if not isinstance(tcid, str):
                raise _Invalid(f"Invalid type for '{at}.tool_call_id': expected a string, but got {_type_phrase(tcid)} "
                               "instead.", f"{at}.tool_call_id", "invalid_type")

    def _check_parts(self, at: str, role: str, parts: list) -> None:
        if not parts:
            raise _Invalid(f"Invalid '{at}.content': empty array. Expected an array with minimum length 1, but got an "
                           "empty array instead.", f"{at}.content", "empty_array")
        allowed = {
            "user": ("text", "image_url", "input_audio", "file"),
            "assistant": ("text", "refusal"),
        }.get(role, ("text",))
        for j, p in enumerate(parts):
            pat = f"{at}.content[{j}]"
            if not isinstance(p, dict):
                raise _Invalid(f"Invalid type for '{pat}': expected an object, but got {_type_phrase(p)} instead.",
                               pat, "invalid_type")
            ptype = p.get("type")
            if ptype is None:
                raise _Invalid(f"Missing required parameter: '{pat}.type'.", f"{pat}.type", "missing_required_parameter")
            if ptype not in allowed:
                supported = ", ".join(f"'{a}'" for a in allowed)
                raise _Invalid(f"Invalid value: '{ptype}'. Supported values are: {supported}.", f"{pat}.type",
                               "invalid_value")
            if ptype in ("text", "refusal") and not isinstance(p.get(ptype), str):
                if p.get(ptype) is None:
                    raise _Invalid(f"Missing required parameter: '{pat}.{ptype}'.", f"{pat}.{ptype}",
                                   "missing_required_parameter")
                raise _Invalid(f"Invalid type for '{pat}.{ptype}': expected a string, but got "
                               f"{_type_phrase(p.get(ptype))} instead.", f"{pat}.{ptype}", "invalid_type")
            if ptype == "image_url" and not (isinstance(p.get("image_url"), dict)
                                             and isinstance(p["image_url"].get("url"), str)):
                raise _Invalid(f"Missing required parameter: '{pat}.image_url.url'.", f"{pat}.image_url.url",
                               "missing_required_parameter")

    def _check_tool_calls(self, at: str, tool_calls: Any) -> None:
        if not isinstance(tool_calls, list):
            raise _Invalid(f"Invalid type for '{at}.tool_calls': expected an array, but got {_type_phrase(tool_calls)} "
                           "instead.", f"{at}.tool_calls", "invalid_type")
        if not tool_calls:
            raise _Invalid(f"Invalid '{at}.tool_calls': empty array. Expected an array with minimum length 1, but got "
                           "an empty array instead.", f"{at}.tool_calls", "empty_array")
        for j, tc in enumerate(tool_calls):
            tat = f"{at}.tool_calls[{j}]"
            if not isinstance(tc, dict):
                raise _Invalid(f"Invalid type for '{tat}': expected an object, but got {_type_phrase(tc)} instead.",
                               tat, "invalid_type")
            for key in ("id", "type", "function"):
                if tc.get(key) is None:
                    raise _Invalid(f"Missing required parameter: '{tat}.{key}'.", f"{tat}.{key}",
                                   "missing_required_parameter")
            if not isinstance(tc["id"], str):
                raise _Invalid(f"Invalid type for '{tat}.id': expected a string, but got {_type_phrase(tc['id'])} "
                               "instead.", f"{tat}.id", "invalid_type")
            if tc["type"] != "function":
                raise _Invalid(f"Invalid value: '{tc['type']}'. Supported values are: 'function'.", f"{tat}.type",
                               "invalid_value")
            fn = tc["function"]
            if not isinstance(fn, dict):
                raise _Invalid(f"Invalid type for '{tat}.function': expected an object, but got {_type_phrase(fn)} "
                               "instead.", f"{tat}.function", "invalid_type")
            for key in ("name", "arguments"):
                if fn.get(key) is None:
                    raise _Invalid(f"Missing required parameter: '{tat}.function.{key}'.", f"{tat}.function.{key}",
                                   "missing_required_parameter")
                if not isinstance(fn[key], str):
                    raise _Invalid(f"Invalid type for '{tat}.function.{key}': expected a string, but got "
                                   f"{_type_phrase(fn[key])} instead.", f"{tat}.function.{key}", "invalid_type")

    @staticmethod
    def _check_tool_pairing(msgs: list[dict[str, Any]]) -> None:
        """Each tool message answers a call of the assistant message right before its run of tool
        messages; each call of an assistant is answered before the next non-tool message."""
        owner: int | None = None  # index of the assistant whose tool results may follow
        ids: set[str] = set()
        pending: dict[str, None] = {}  # ordered set of unanswered ids

        def missing() -> _Invalid:
            return _Invalid(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                "'tool_call_id'. The following tool_call_ids did not have response messages: " + ", ".join(pending),
                f"messages.[{owner}].role",
            )

        for i, m in enumerate(msgs):
            if m["role"] == "tool":
                if owner is None:
                    raise _Invalid("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                                   "message with 'tool_calls'.", f"messages.[{i}].role")
                tcid = m["tool_call_id"]
                if tcid not in ids:
                    raise _Invalid(f"Invalid parameter: 'tool_call_id' of '{tcid}' not found in 'tool_calls' of "
                                   "previous message.", f"messages.[{i}].tool_call_id")
                pending.pop(tcid, None)
                continue
            if pending:
                raise missing()
            owner, ids, pending = None, set(), {}
            if m["role"] == "assistant" and m.get("tool_calls"):
                owner = i
                ids = {tc["id"] for tc in m["tool_calls"]}
                pending = dict.fromkeys(tc["id"] for tc in m["tool_calls"])
        if pending:
            raise missing()

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
        if self.require_api_key is not None and rec.headers.get("authorization") != f"Bearer {self.require_api_key}":
            if "authorization" not in rec.headers:
                err = FakeError.openai(401, "You didn't provide an API key. You need to provide your API key in an "
                                       "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
            else:
                err = status_error(401)
            return await self._send_error(request, rec, err)
        if fault and self.fail_status:
            return await self._send_error(request, rec, status_error(self.fail_status, self.retry_after))

        method, path = request.method, request.path
        if method == "POST" and path == "/v1/chat/completions":
            return await self._chat(request, rec, fault)
        if method == "GET" and path == "/v1/models":
            data = [self._model_obj(m) for m in self.models]
            return await self._send_json(request, rec, {"object": "list", "data": data}, fault=fault)
        if method == "GET" and path.startswith("/v1/models/"):
            model = path[len("/v1/models/"):]
            if model not in self.models:
                return await self._send_error(request, rec, FakeError.openai(
                    404, f"The model '{model}' does not exist", param="model", code="model_not_found"))
            return await self._send_json(request, rec, self._model_obj(model), fault=fault)
        if method == "POST" and path == "/v1/embeddings":
            return await self._embeddings(request, rec, fault)
        if path.startswith("/v1/"):
            echo = {
                "method": method,
                "path": path,
                "raw_path": request.raw_path,
                "query": request.query_string,
                "headers": rec.headers,
                "body_text": _utf8_or_none(rec.body),
                "body_b64": base64.b64encode(rec.body).decode(),
            }
            return await self._send_json(request, rec, echo, headers={"x-upstream-echo": "1"}, fault=fault)
        return await self._send_error(request, rec, FakeError.openai(404, f"Invalid URL ({method} {path})"))

    @staticmethod
    def _model_obj(model: str) -> dict[str, Any]:
        return {"id": model, "object": "model", "created": 1700000000, "owned_by": "system"}

    async def _embeddings(self, request: web.Request, rec: RecordedRequest, fault: bool) -> web.StreamResponse:
        body = rec.json
        if not isinstance(body, dict):
            return await self._send_error(request, rec, _parse_error())
        inp = body.get("input")
        if not isinstance(body.get("model"), str):
            return await self._send_error(request, rec, FakeError.openai(400, "you must provide a model parameter"))
        if isinstance(inp, str) or (isinstance(inp, list) and inp and all(isinstance(x, int) for x in inp)):
            inputs = [inp]
        elif isinstance(inp, list) and inp:
            inputs = inp
        else:
            return await self._send_error(request, rec, FakeError.openai(
                400, "'input' is a required property", param="input"))
        dims = body.get("dimensions") or self.embedding_dimensions
        b64 = body.get("encoding_format") == "base64"
        data, tokens = [], 0
        for i, x in enumerate(inputs):
            text = x if isinstance(x, str) else orjson.dumps(x).decode()
            tokens += self._count(text) if isinstance(x, str) else len(x)
            vec = _embed(text, dims)
            emb: Any = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode() if b64 else vec
            data.append({"object": "embedding", "index": i, "embedding": emb})
        payload = {"object": "list", "data": data, "model": body["model"],
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        return await self._send_json(request, rec, payload, fault=fault)

    async def _chat(self, request: web.Request, rec: RecordedRequest, fault: bool) -> web.StreamResponse:
        body = rec.json
        if body is None:
            return await self._send_error(request, rec, _parse_error())
        err = self.validate_chat(body)
        if err is None and (err := self._llama_validation(body)) is not None:
            if self.empty_stream_on_llama_error and body.get("stream"):
                return await self._empty_stream(request, rec)
        if err is not None:
            return await self._send_error(request, rec, err)
        model = body["model"]
        window = self.window_for(model)
        rec.prompt_tokens = prompt_tokens = self.count_prompt_tokens(body)
        if prompt_tokens > window and self.empty_stream_on_overflow and body.get("stream"):
            return await self._empty_stream(request, rec)
        if prompt_tokens > window:
            return await self._send_error(request, rec, FakeError.openai(
                400,
                f"This model's maximum context length is {window} tokens. However, your messages resulted in "
                f"{prompt_tokens} tokens. Please reduce the length of the messages.",
                "invalid_request_error", "context_length_exceeded", "messages"))
        rec.cached_tokens = cached = self._cached_tokens(body)

        huge = False
        try:
            if rec.kind == "summarizer":
                if self.summarizer_delay_s:
                    await asyncio.sleep(self.summarizer_delay_s)
                result: Any = await _resolve(self.summarizer, body)
                default = default_tool_summary if rec.summarizer_kind == "tool" else default_history_summary
                if result is None:
                    result = default(body)
                if self.endless_summary and isinstance(result, str):
                    unit = result + "\n"
                    result = (unit * (self.endless_summary_chars // len(unit) + 1))[: self.endless_summary_chars]
                    huge = True
            else:
                result = await _resolve(self.reply, body)
            if isinstance(result, FakeError):
                return await self._send_error(request, rec, result)
            reply = self._make_reply(result, body, truncate=not huge)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken scripted callable: make it visible, not a hang
            self.errors.append(exc)
            log.exception("fake upstream: scripted answer failed")
            return await self._send_error(request, rec, FakeError.openai(500, f"fake upstream: scripted answer failed: {exc!r}"))

        completion_tokens = (len(reply.content or "") // 4 if huge else self._count(reply.content or "")) + sum(
            self._count(tc["function"]["name"]) + self._count(tc["function"]["arguments"]) for tc in reply.tool_calls)
        rec.completion_tokens = completion_tokens
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
        }
        cid = "chatcmpl-" + _rand(29)
        created = int(time.time())
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = _sse_events(cid, created, model, reply, usage if include_usage else None)
            return await self._stream(request, rec, events, fault)
        message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None, "annotations": []}
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        payload = {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": reply.finish_reason}],
            "usage": usage,
            "service_tier": "default",
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }
        return await self._send_json(request, rec, payload, fault=fault)

    def _make_reply(self, result: Any, body: dict[str, Any], truncate: bool) -> _Reply:
        if result is None:
            result = default_reply(body)
        if isinstance(result, str):
            content, raw_calls, finish = result, [], None
        elif isinstance(result, dict):
            content, raw_calls, finish = result.get("content"), result.get("tool_calls") or [], result.get("finish_reason")
        else:
            raise TypeError(f"scripted reply must be str, dict, FakeError or None, not {type(result).__name__}")
        calls = []
        for tc in raw_calls:
            fn = tc.get("function") or {"name": tc.get("name"), "arguments": tc.get("arguments")}
            args = fn.get("arguments")
            if not isinstance(args, str):
                args = orjson.dumps(args if args is not None else {}).decode()
            calls.append({"id": tc.get("id") or "call_" + _rand(24), "type": "function",
                          "function": {"name": fn["name"], "arguments": args}})
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if truncate and self.truncate_to_max_tokens and limit and content and self._count(content) > limit:
            content, finish = _truncate_to_tokens(content, limit, self.encoding), "length"
        return _Reply(content, calls, finish or ("tool_calls" if calls else "stop"))

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



def _sse_events(cid: str, created: int, model: str, reply: _Reply, usage: dict | None) -> list[tuple[bytes, bool]]:
    """The stream of a reply as OpenAI sends it: (bytes of one `data:` event, is the finish chunk)."""
    base = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "service_tier": "default", "system_fingerprint": SYSTEM_FINGERPRINT}

    def event(obj: Any) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[bytes, bool]:
        obj = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if usage is not None:
            obj["usage"] = None  # with include_usage every chunk carries "usage": null
        return event(obj), finish is not None

    out: list[tuple[bytes, bool]] = []
    pieces = _split_text(reply.content) if reply.content else []
    calls = reply.tool_calls
    if calls and not pieces:  # a tool-call-only answer opens with the first call, content null
        first = {"role": "assistant", "content": None,
                 "tool_calls": [{"index": 0, "id": calls[0]["id"], "type": "function",
                                 "function": {"name": calls[0]["function"]["name"], "arguments": ""}}],
                 "refusal": None}
        out.append(chunk(first))
    else:
        out.append(chunk({"role": "assistant", "content": "", "refusal": None}))
    for p in pieces:
        out.append(chunk({"content": p}))
    for idx, tc in enumerate(calls):
        if idx > 0 or pieces:
            out.append(chunk({"tool_calls": [{"index": idx, "id": tc["id"], "type": "function",
                                              "function": {"name": tc["function"]["name"], "arguments": ""}}]}))
        for frag in _split_args(tc["function"]["arguments"]):
            out.append(chunk({"tool_calls": [{"index": idx, "function": {"arguments": frag}}]}))
    out.append(chunk({}, reply.finish_reason))
    if usage is not None:
        out.append((event({**base, "choices": [], "usage": usage}), False))
    out.append((b"data: [DONE]\n\n", False))
    return out


def _embed(text: str, dims: int) -> list[float]:
    """A deterministic unit vector from the text's hash (float32-exact values)."""
    raw = b""
    counter = 0
    while len(raw) < 2 * dims:
        raw += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    vals = [(int.from_bytes(raw[2 * k : 2 * k + 2], "big") - 32768) / 32768 for k in range(dims)]
    norm = sum(v * v for v in vals) ** 0.5 or 1.0
    return [struct.unpack("<f", struct.pack("<f", v / norm))[0] for v in vals]


def _parse_error() -> FakeError:
    return FakeError.openai(
        400,
        "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP "
        "library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have "
        "trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)",
    )


try:  # a ready-made fixture: `from proxy.fake_upstream import fake_upstream`
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def fake_upstream():
        """A started FakeUpstream in the test's event loop, stopped after the test."""
        async with FakeUpstream() as fake:
            yield fake

except ImportError:  # pragma: no cover - pytest-asyncio is part of the test extras
    pass
