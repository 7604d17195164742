"""A fast fake OpenAI upstream for load: a raw asyncio HTTP/1.1 server (uvloop when installed).

The test fake (proxy/fakes/chat/server.py) validates every request strictly and is far too slow
to sit behind a load test; this one must never be the bottleneck, so it parses only the request
head and answers from precomputed bytes:

- `POST .../chat/completions`, non-streaming: one precomputed chat completion.
- the same with `"stream": true` in the body: an SSE stream in OpenAI's chunk shape, `chunks`
  events (the last one `data: [DONE]`) sent `chunk_delay_ms` apart as separate HTTP chunks. Request
  headers override the process defaults per request: `x-bench-chunks`, `x-bench-chunk-delay-ms`,
  and `x-bench-hold-s` (send the first event, then hold the stream open that long: idle streams).
- summarizer requests on every route (the system text, chat's first system message, Messages'
  `system` or Responses' `instructions`, starts with the first 40 characters of
  prompts/summarization-system.md or prompts/tool-result-summarizer.md; or the last message holds
  prompts/compaction-cached-summary.md's, the call riding the conversation's cache): a valid
  summary with every heading the proxy requires, in the route's shape. Only bodies that contain
  that text near their ends are parsed as JSON.
- `POST /v1/messages` (Anthropic Messages): one precomputed Messages answer, or with
  `"stream": true` Anthropic's event stream (message_start ... message_stop, `event:` names).
- `POST .../responses` (OpenAI Responses): one precomputed response object, or with
  `"stream": true` its event stream (response.created ... response.completed, no `[DONE]`).
- `POST /v1beta/models/{model}:generateContent` (Google Gemini): one precomputed
  GenerateContentResponse; `:streamGenerateContent?alt=sse` its `data:` events (text pieces, the
  last with its finishReason and usageMetadata), as the API and Gemini CLI stream them.
- `GET /bench/stats`: counters as JSON (requests, summarizer requests, streams open).
- anything else: 404.

Run it as its own process: `python bench/fake_upstream.py --port 9001 [--chunks 16] [--chunk-delay-ms 2]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from proxy.fakes.chat.replies import content_text  # the text of a message content, as the strict fakes read it

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
SUMMARIZER_PROMPTS = ("summarization-system.md", "tool-result-summarizer.md")
MARKER_CHARS = 40
HEAD_SCAN = 4096  # bytes at each end of a body searched for markers
MAX_HEAD = 64 * 1024
GEMINI_MODELS = ("/v1beta/models/", "/v1/models/")
CREATED = 1_700_000_000

SUMMARY_TEXT = """## Active Task
Continue the benchmark conversation.

## Goal
Measure the proxy.

## Constraints & Preferences
- (none recorded)

## Progress
### Done
- [x] Reviewed the earlier conversation

### In Progress
- [ ] Continue the active task

### Blocked
- (none)

## Key Decisions
- **Keep going**: the benchmark is on track

## Answered Questions
- (none)

## Next Steps
1. Continue the active task

## Critical Context
- bench-summary
"""


def completion_json(content: str, model: str = "bench-model") -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "system_fingerprint": "fp_bench",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112},
        }
    )


def message_json(text: str, model: str = "bench-model") -> bytes:
    """A Messages answer (anthropic/types/message.py) with a fixed usage."""
    return orjson.dumps({"id": "msg_bench", "type": "message", "role": "assistant", "model": model,
                         "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                         "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 8}})


def response_json(text: str, model: str = "bench-model") -> dict[str, Any]:
    """A Responses answer (openai/types/responses/response.py) with a fixed usage."""
    return {"id": "resp_bench", "object": "response", "created_at": CREATED, "status": "completed", "model": model,
            "output": [{"id": "msg_bench", "type": "message", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None,
            "incomplete_details": None, "instructions": None, "metadata": {}, "temperature": 1.0, "top_p": 1.0,
            "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 8,
                      "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 20}}


def gemini_json(text: str, finish: str | None = "STOP", usage: bool = True) -> bytes:
    """A GenerateContentResponse (the Gemini API's) with a fixed usageMetadata."""
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    meta = {"promptTokenCount": 12, "totalTokenCount": 20}
    if usage:
        meta["candidatesTokenCount"] = 8
    return orjson.dumps({"candidates": [candidate], "usageMetadata": meta, "modelVersion": "bench-model",
                         "responseId": "bench-response"})


def gemini_events(count: int) -> list[bytes]:
    """`count` Gemini stream events (at least 1): text pieces, the last with its finishReason."""
    count = max(1, count)
    return [b"data: " + gemini_json(f"tok{i} ", "STOP" if i == count - 1 else None, i == count - 1) + b"\r\n\r\n"
            for i in range(count)]


def _named(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **payload}) + b"\n\n"


def messages_events(count: int) -> list[bytes]:
    """`count` Anthropic stream events (at least 5): message_start, a text block's start, deltas
    and stop, message_delta with the usage, message_stop."""
    count = max(5, count)
    start = {"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench-model", "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 12, "output_tokens": 1}}
    events = [_named("message_start", {"message": start}),
              _named("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})]
    events += [_named("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"tok{i} "}})
               for i in range(count - 5)]
    events += [_named("content_block_stop", {"index": 0}),
               _named("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                        "usage": {"output_tokens": 8}}),
               _named("message_stop", {})]
    return events


def responses_events(count: int) -> list[bytes]:
    """`count` Responses stream events (at least 3): response.created, text deltas, response.completed."""
    count = max(3, count)
    created = {**response_json(""), "status": "in_progress", "output": [], "usage": None}
    events = [_named("response.created", {"sequence_number": 0, "response": created})]
    events += [_named("response.output_text.delta", {"sequence_number": i + 1, "item_id": "msg_bench",
                                                     "output_index": 0, "content_index": 0, "delta": f"tok{i} "})
               for i in range(count - 2)]
    events.append(_named("response.completed", {"sequence_number": count - 1, "response": response_json("tok")}))
    return events


def _chunk_event(delta: dict[str, Any], finish: str | None) -> bytes:
    payload = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": "bench-model",
        "system_fingerprint": "fp_bench",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def sse_events(count: int) -> list[bytes]:
    """`count` SSE events (at least 3): role, content pieces, finish, then `data: [DONE]`."""
    count = max(3, count)
    events = [_chunk_event({"role": "assistant", "content": ""}, None)]
    events += [_chunk_event({"content": f"tok{i} "}, None) for i in range(count - 3)]
    events += [_chunk_event({}, "stop"), b"data: [DONE]\n\n"]
    return events


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def response_head(status: str, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def fixed_response(body: bytes, content_type: str = "application/json", status: str = "200 OK") -> bytes:
    return response_head(status, {"Content-Type": content_type, "Content-Length": str(len(body))}) + body


@dataclass(frozen=True)
class Marker:
    prefix: str  # the start of a summarizer's system prompt
    needle: bytes  # the same text as it appears inside a JSON string


def summarizer_markers(prompts_dir: Path = PROMPTS_DIR) -> list[Marker]:
    out = []
    for name in SUMMARIZER_PROMPTS:
        text = (prompts_dir / name).read_text(encoding="utf-8").strip()[:MARKER_CHARS]
        out.append(Marker(text, orjson.dumps(text)[1:-1]))
    return out


RIDING_PROMPT = "compaction-cached-summary.md"  # the proxy's summary call riding the conversation's cache
RIDING_SCAN = 64 * 1024  # its last message holds the prompt: searched for near a body's end


def riding_marker(prompts_dir: Path = PROMPTS_DIR) -> Marker:
    text = (prompts_dir / RIDING_PROMPT).read_text(encoding="utf-8").strip()[:MARKER_CHARS]
    return Marker(text, orjson.dumps(text)[1:-1])


def is_summary_call(body: bytes | memoryview, markers: list[Marker], riding: Marker) -> bool:
    """Any protocol's summary call: a summarizer's prompt starting the system text (chat's first
    system message, Messages' `system`, Responses' `instructions`), or the riding call's prompt in
    the last message. A byte search near the ends first; only a body that has one is parsed."""
    lead = any(m.needle in bytes(body[:HEAD_SCAN]) for m in markers)
    ride = riding.needle in bytes(body[-RIDING_SCAN:])
    if not (lead or ride):
        return False
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(doc, dict):
        return False
    if lead and any(_system_text(doc).startswith(m.prefix) for m in markers):
        return True
    return ride and riding.prefix in _last_text(doc)


def _system_text(doc: dict[str, Any]) -> str:
    msgs = doc.get("messages")
    if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict) and msgs[0].get("role") == "system":
        return content_text(msgs[0].get("content"))
    gemini = doc.get("systemInstruction")
    return (content_text(doc.get("system")) or content_text(doc.get("instructions"))
            or (content_text(gemini.get("parts")) if isinstance(gemini, dict) else ""))


def _last_text(doc: dict[str, Any]) -> str:
    items = doc.get("messages") or doc.get("input") or doc.get("contents")
    if not (isinstance(items, list) and items and isinstance(items[-1], dict)):
        return ""
    last = items[-1]
    return content_text(last["parts"] if "contents" in doc else last.get("content"))


def wants_stream(body: bytes | memoryview) -> bool:
    """`"stream": true` at the top level, looked for only in the first and last bytes of the body.

    A full parse (or scan) of a multi-megabyte body would make this fake the bottleneck; the
    benchmark's clients put `stream` before `messages`, and the openai SDK puts it after them.
    """
    ends = (bytes(body[:HEAD_SCAN]), bytes(body[-HEAD_SCAN:]))
    return any(b'"stream":true' in part or b'"stream": true' in part for part in ends)


@dataclass
class Settings:
    chunks: int = 16
    chunk_delay_ms: float = 2.0


@dataclass
class Stats:
    requests: int = 0
    chat: int = 0
    streams: int = 0
    summarizer: int = 0
    open_streams: int = 0
    connections: int = 0
    bytes_in: int = 0

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes | memoryview = b""  # a view into the receive buffer, valid while the request is handled
    keep_alive: bool = True


@dataclass
class Server:
    settings: Settings
    markers: list[Marker] = field(default_factory=summarizer_markers)
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        self.reply = fixed_response(completion_json("Hello from the bench upstream."))
        self.summary = fixed_response(completion_json(SUMMARY_TEXT))
        self.message_summary = fixed_response(message_json(SUMMARY_TEXT))
        self.response_summary = fixed_response(orjson.dumps(response_json(SUMMARY_TEXT)))
        self.riding = riding_marker()
        self.message = fixed_response(message_json("Hello from the bench upstream."))
        self.response = fixed_response(orjson.dumps(response_json("Hello from the bench upstream.")))
        self.gemini = fixed_response(gemini_json("Hello from the bench upstream."))
        self.gemini_summary = fixed_response(gemini_json(SUMMARY_TEXT))
        self.not_found = fixed_response(b'{"error":{"message":"not found","type":"invalid_request_error"}}', status="404 Not Found")
        self._events: dict[tuple[str, int], list[bytes]] = {}

    def events(self, count: int, make: Any = sse_events) -> list[bytes]:
        key = (make.__name__, count)
        if key not in self._events:
            self._events[key] = [http_chunk(e) for e in make(count)]
        return self._events[key]

    def protocol(self) -> "HttpProtocol":
        return HttpProtocol(self)


class RecvBuffer:
    """A receive buffer the transport reads straight into, reused for every request on a connection.

    Appending each read to a bytes/bytearray costs a fresh multi-megabyte allocation (and its page
    faults) per read and per copy: ten times the cost of the transfer itself for large bodies.
    """

    MIN_FREE = 16 * 1024

    def __init__(self) -> None:
        self.data = bytearray(self.MIN_FREE)
        self.start = 0  # unread bytes are data[start:end]
        self.end = 0

    def __len__(self) -> int:
        return self.end - self.start

    def writable(self) -> memoryview:
        """Free space at the end (compacting or growing the buffer first when short of it)."""
        if len(self.data) - self.end < self.MIN_FREE:
            pending = len(self)
            size = len(self.data)
            while size - pending < max(self.MIN_FREE, size // 4):
                size *= 2
            target = self.data if size == len(self.data) else bytearray(size)
            memoryview(target)[:pending] = memoryview(self.data)[self.start:self.end]  # memmove
            self.data, self.start, self.end = target, 0, pending
        return memoryview(self.data)[self.end:]

    def view(self, n: int) -> memoryview:
        return memoryview(self.data)[self.start:self.start + n]

    def find(self, sub: bytes) -> int:
        i = self.data.find(sub, self.start, self.end)
        return i - self.start if i >= 0 else -1

    def consume(self, n: int) -> None:
        self.start += n
        if self.start >= self.end:
            self.start = self.end = 0


class HttpProtocol(asyncio.BufferedProtocol):
    """One client connection: parses requests one at a time (no pipelining while streaming)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = RecvBuffer()
        self.transport: asyncio.Transport | None = None
        self.req: Request | None = None  # head parsed, body pending
        self.need = 0  # a Content-Length body's length (0 for chunked bodies, decoded into a copy)
        self.chunked: ChunkedDecoder | None = None
        self.stream_task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.stats.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.stats.connections -= 1
        if self.stream_task is not None:
            self.stream_task.cancel()
        self.transport = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buf.writable()

    def buffer_updated(self, nbytes: int) -> None:
        self.buf.end += nbytes
        self.server.stats.bytes_in += nbytes
        self.process()

    def process(self) -> None:
        while self.transport is not None and self.stream_task is None:
            if self.req is None and not self._parse_head():
                return
            if not self._take_body():
                return
            req, self.req = self.req, None
            assert req is not None
            self.respond(req)
            self.buf.consume(self.need)  # a Content-Length body is a view into the buffer: released only now
            self.need = 0

    def _take_body(self) -> bool:
        """Attach the request body once it is complete; False while bytes are still missing."""
        assert self.req is not None
        if self.chunked is None:
            if len(self.buf) < self.need:
                return False
            self.req.body = self.buf.view(self.need)
            return True
        pending = bytearray(self.buf.view(len(self.buf)))  # chunked requests are rare: copying is fine
        body = self.chunked.feed(pending)
        self.buf.consume(len(self.buf) - len(pending))
        if body is None:
            return False
        self.chunked = None
        self.req.body = body
        return True

    def _parse_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD:
                self._close()
            return False
        lines = bytes(self.buf.view(end)).decode("latin-1").split("\r\n")
        self.buf.consume(end + 4)
        method, path, version = (lines[0].split(" ") + ["", ""])[:3]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        conn = headers.get("connection", "").lower()
        keep = conn != "close" and (version == "HTTP/1.1" or conn == "keep-alive")
        self.req = Request(method, path, headers, keep_alive=keep)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.chunked = ChunkedDecoder()
        else:
            self.need = int(headers.get("content-length") or 0)
        return True

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _send(self, data: bytes, req: Request) -> None:
        assert self.transport is not None
        self.transport.write(data)
        if not req.keep_alive:
            self._close()

    def respond(self, req: Request) -> None:
        s = self.server
        s.stats.requests += 1
        if req.method == "GET" and req.path == "/bench/stats":
            self._send(fixed_response(s.stats.to_json()), req)
        elif req.method == "POST" and req.path.endswith("/chat/completions"):
            self._chat(req)
        elif req.method == "POST" and req.path == "/v1/messages":
            self._answer(req, s.message, messages_events, s.message_summary)
        elif req.method == "POST" and req.path.endswith("/responses"):
            self._answer(req, s.response, responses_events, s.response_summary)
        elif req.method == "POST" and req.path.startswith(GEMINI_MODELS) and ":" in req.path:
            self._gemini(req)
        else:
            self._send(s.not_found, req)

    def _chat(self, req: Request) -> None:
        s = self.server
        self._answer(req, s.reply, sse_events, s.summary)

    def _gemini(self, req: Request) -> None:
        """generateContent, or streamGenerateContent with alt=sse (a stream by its path, not its body)."""
        s = self.server
        method, _, query = req.path.partition(":")[2].partition("?")
        if method == "generateContent":
            self._answer(req, s.gemini, gemini_events, s.gemini_summary, stream=False)
        elif method == "streamGenerateContent" and "alt=sse" in query.split("&"):
            self._answer(req, s.gemini, gemini_events, s.gemini_summary, stream=True)
        else:
            self._send(s.not_found, req)

    def _answer(self, req: Request, whole: bytes, events: Any, summary: bytes, stream: bool | None = None) -> None:
        """The precomputed answer, or the event stream `events(count)` makes when streaming; a
        summary (in the route's shape) to the proxy's summary calls."""
        s = self.server
        if is_summary_call(req.body, s.markers, s.riding):
            s.stats.summarizer += 1
            self._send(summary, req)
            return
        s.stats.chat += 1
        if not (wants_stream(req.body) if stream is None else stream):
            self._send(whole, req)
            return
        s.stats.streams += 1
        h = req.headers
        count = int(h.get("x-bench-chunks") or s.settings.chunks)
        delay = float(h.get("x-bench-chunk-delay-ms") or s.settings.chunk_delay_ms) / 1000
        hold = float(h.get("x-bench-hold-s") or 0)
        self.stream_task = asyncio.get_running_loop().create_task(self._stream(req, s.events(count, events), delay, hold))

    async def _stream(self, req: Request, events: list[bytes], delay: float, hold: float) -> None:
        s = self.server
        s.stats.open_streams += 1
        head = response_head(
            "200 OK",
            {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Transfer-Encoding": "chunked",
             "x-bench-events": str(len(events))},
        )
        try:
            assert self.transport is not None
            self.transport.write(head + events[0])
            if hold:
                await asyncio.sleep(hold)
            for ev in events[1:]:
                if delay:
                    await asyncio.sleep(delay)
                self.transport.write(ev)
            self._send(b"0\r\n\r\n", req)
        finally:
            s.stats.open_streams -= 1
            self.stream_task = None
        # The next pipelined request, if any, waited for this stream to end.
        asyncio.get_running_loop().call_soon(self.process)


class ChunkedDecoder:
    """Incremental `Transfer-Encoding: chunked` body decoder (no trailers expected)."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.remaining = 0  # bytes left in the current chunk, plus its CRLF

    def feed(self, buf: bytearray) -> bytes | None:
        """Consume what it can from `buf`; the whole body once the last chunk arrived, else None."""
        while True:
            if self.remaining:
                take = min(self.remaining, len(buf))
                self.body += buf[:take]
                del buf[:take]
                self.remaining -= take
                if self.remaining:
                    return None
                del self.body[-2:]  # the CRLF after the chunk data
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                return None
            size = int(bytes(buf[:line_end]).split(b";")[0], 16)
            if size == 0:
                if len(buf) < line_end + 4:  # the last chunk's CRLF has not arrived yet
                    return None
                del buf[: line_end + 4]
                return bytes(self.body)
            del buf[: line_end + 2]
            self.remaining = size + 2


def install_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(host: str, port: int, settings: Settings) -> None:
    server = Server(settings)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(server.protocol, host, port, backlog=4096, reuse_address=True)
    async with srv:
        await srv.serve_forever()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--chunks", type=int, default=Settings.chunks, help="SSE events per stream, [DONE] included")
    p.add_argument("--chunk-delay-ms", type=float, default=Settings.chunk_delay_ms)
    args = p.parse_args(argv)
    install_uvloop()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, Settings(args.chunks, args.chunk_delay_ms)))


if __name__ == "__main__":
    main()
