"""A recording pass-through between the proxy and a real server (llama.cpp, or LiteLLM in front of it).

The proxy runs as a subprocess, so the tests cannot see what it forwards. The tap is a plain
aiohttp reverse proxy on 127.0.0.1 (in its own thread and event loop) that relays every request
to the real server byte for byte, streams the answer back chunk by chunk, and records each
exchange: the raw and parsed request body, its kind (the agent's request, the history or tool
summarizer, told apart by the proxy's own prompts as each protocol's fake upstream does), the real
server's status, and the response body.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from proxy.fakes.chat import FakeUpstream
from proxy.fakes.gemini import FakeGemini
from proxy.fakes.messages import FakeMessages
from proxy.fakes.responses import FakeResponses

# Hop-by-hop headers and the ones aiohttp recomputes; everything else goes through unchanged.
_DROP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class Exchange:
    # The agent's request: "chat" | "messages" | "responses" | "gemini"; the proxy's summarizer calls in any
    # protocol: "history" | "tool"; "count_tokens" | "compact" | "other".
    kind: str
    path: str
    body: Any  # the parsed JSON request body (None when not JSON)
    raw: bytes = b""  # the request body as the proxy sent it
    status: int = 0
    # Filled chunk by chunk *before* each chunk goes on: complete once the proxy has all of it.
    response: bytearray = field(default_factory=bytearray)

    def response_json(self) -> Any:
        return json.loads(self.response)


class Tap:
    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")  # e.g. http://127.0.0.1:8788 (no /v1)
        self.exchanges: list[Exchange] = []
        # Only their summarizer_kind(): each reads prompts/*.md as its protocol's fake upstream does.
        self._classifiers = {"chat": FakeUpstream(), "messages": FakeMessages(), "responses": FakeResponses(),
                             "gemini": FakeGemini()}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:  # what anthropic.base_url wants
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:  # what upstream.base_url (an OpenAI base URL) wants
        return f"{self.url}/v1"

    def of_kind(self, kind: str) -> list[Exchange]:
        return [e for e in self.exchanges if e.kind == kind]

    def _kind(self, path: str, body: Any) -> str:
        # Gemini's methods end the path (`/v1beta/models/{model}:generateContent`; the query apart)
        method = path.rpartition(":")[2] if "/models/" in path else ""
        if method == "countTokens":
            return "count_tokens"
        if method in ("generateContent", "streamGenerateContent"):
            return self._classifiers["gemini"].summarizer_kind(body) or "gemini"
        for suffix, kind in (("/messages/count_tokens", "count_tokens"), ("/responses/compact", "compact")):
            if path.endswith(suffix):
                return kind
        for suffix, kind in (("/chat/completions", "chat"), ("/messages", "messages"), ("/responses", "responses")):
            if path.endswith(suffix):
                return self._classifiers[kind].summarizer_kind(body) or kind
        return "other"

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        data = await request.read()
        try:
            body = json.loads(data) if data else None
        except ValueError:
            body = None
        ex = Exchange(self._kind(request.path, body), request.path, body, data)
        self.exchanges.append(ex)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        async with self._session.request(
            request.method, self.target + request.path_qs, data=data, headers=headers
        ) as up:
            ex.status = up.status
            resp = web.StreamResponse(
                status=up.status, headers={k: v for k, v in up.headers.items() if k.lower() not in _DROP}
            )
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                ex.response += chunk
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def _start(self) -> None:
        # No total timeout: a long summary or a prompt prefill on 2 cores can take minutes.
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        app = web.Application(client_max_size=1024**3)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def start(self) -> "Tap":
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._start())
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                return
            finally:
                ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="e2e-tap", daemon=True)
        self._thread.start()
        if not ready.wait(10) or failure:
            raise RuntimeError(f"tap failed to start: {failure[0] if failure else 'timeout'}")
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = self._thread = None
