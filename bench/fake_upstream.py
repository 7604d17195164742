"""A fast fake OpenAI upstream for load: a raw asyncio HTTP/1.1 server (uvloop when installed).

The test fake (tests/support/fake_upstream.py) validates every request strictly and is far too slow
to sit behind a load test; this one must never be the bottleneck, so it parses only the request
head and answers from precomputed bytes:

- `POST .../chat/completions`, non-streaming: one precomputed chat completion.
- the same with `"stream": true` in the body: an SSE stream in OpenAI's chunk shape, `chunks`
  events (the last one `data: [DONE]`) sent `chunk_delay_ms` apart as separate HTTP chunks. Request
  headers override the process defaults per request: `x-bench-chunks`, `x-bench-chunk-delay-ms`,
  and `x-bench-hold-s` (send the first event, then hold the stream open that long: idle streams).
- summarizer requests (the first system message starts with the first 40 characters of
  prompts/summarization-system.md or prompts/tool-result-summarizer.md): a valid summary with every
  heading the proxy requires. Only bodies that contain that text are parsed as JSON.
- `GET /bench/stats`: counters as JSON (requests, summarizer requests, streams open).
- anything else: 404.

Run it as its own process: `python bench/fake_upstream.py --port 9001 [--chunks 16] [--chunk-delay-ms 2]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "prompts"
SUMMARIZER_PROMPTS = ("summarization-system.md", "tool-result-summarizer.md")
MARKER_CHARS = 40
MAX_HEAD = 64 * 1024
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


def summarizer_markers(prompts_dir: Path = PROMPTS_DIR) -> list[bytes]:
    """How the start of each summarizer system prompt appears inside a JSON string."""
    out = []
    for name in SUMMARIZER_PROMPTS:
        text = (prompts_dir / name).read_text(encoding="utf-8").strip()[:MARKER_CHARS]
        out.append(orjson.dumps(text)[1:-1])
    return out


def is_summarizer_request(body: bytes, markers: list[bytes]) -> bool:
    """Cheap byte search first; only a body that contains a marker is parsed to confirm."""
    if not any(m in body for m in markers):
        return False
    try:
        first = orjson.loads(body)["messages"][0]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return False
    content = first.get("content") if isinstance(first, dict) else None
    if first.get("role") != "system" or not isinstance(content, str):
        return False
    return any(content.startswith(orjson.loads(b'"' + m + b'"')) for m in markers)


def wants_stream(body: bytes) -> bool:
    # A byte search instead of a JSON parse: inside a message the quotes would be escaped.
    return b'"stream":true' in body or b'"stream": true' in body


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
    body: bytes = b""
    keep_alive: bool = True


@dataclass
class Server:
    settings: Settings
    markers: list[bytes] = field(default_factory=summarizer_markers)
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        self.reply = fixed_response(completion_json("Hello from the bench upstream."))
        self.summary = fixed_response(completion_json(SUMMARY_TEXT))
        self.not_found = fixed_response(b'{"error":{"message":"not found","type":"invalid_request_error"}}', status="404 Not Found")
        self._events: dict[int, list[bytes]] = {}

    def events(self, count: int) -> list[bytes]:
        if count not in self._events:
            self._events[count] = [http_chunk(e) for e in sse_events(count)]
        return self._events[count]

    def protocol(self) -> "HttpProtocol":
        return HttpProtocol(self)


class HttpProtocol(asyncio.Protocol):
    """One client connection: parses requests one at a time (no pipelining while streaming)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.req: Request | None = None  # head parsed, body pending
        self.need = 0  # Content-Length bodies: bytes still expected
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

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.server.stats.bytes_in += len(data)
        self.process()

    def process(self) -> None:
        while self.transport is not None and self.stream_task is None:
            req = self._next_request()
            if req is None:
                return
            self.respond(req)

    def _next_request(self) -> Request | None:
        if self.req is None and not self._parse_head():
            return None
        assert self.req is not None
        if self.chunked is not None:
            body = self.chunked.feed(self.buf)
            if body is None:
                return None
            self.chunked = None
        else:
            if len(self.buf) < self.need:
                return None
            body = bytes(self.buf[: self.need])
            del self.buf[: self.need]
        req, self.req = self.req, None
        req.body = body
        return req

    def _parse_head(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_HEAD:
                self._close()
            return False
        lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[: end + 4]
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
        else:
            self._send(s.not_found, req)

    def _chat(self, req: Request) -> None:
        s = self.server
        if is_summarizer_request(req.body, s.markers):
            s.stats.summarizer += 1
            self._send(s.summary, req)
            return
        s.stats.chat += 1
        if not wants_stream(req.body):
            self._send(s.reply, req)
            return
        s.stats.streams += 1
        h = req.headers
        count = int(h.get("x-bench-chunks") or s.settings.chunks)
        delay = float(h.get("x-bench-chunk-delay-ms") or s.settings.chunk_delay_ms) / 1000
        hold = float(h.get("x-bench-hold-s") or 0)
        self.stream_task = asyncio.get_running_loop().create_task(self._stream(req, s.events(count), delay, hold))

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
                if self.transport is None:
                    return
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
        self.done = False

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
            del buf[: line_end + 2]
            if size == 0:
                if len(buf) < 2:  # the final CRLF; put the size line back until it arrives
                    buf[:0] = b"0\r\n"
                    return None
                del buf[:2]
                return bytes(self.body)
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
