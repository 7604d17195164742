"""Fault flags every fake shares, for reliability tests that run over every protocol: which
requests a fault applies to, and the writers that misbehave on purpose (a body cut in half, a
reset, a stall, a broken stream event, a stream parked before its last event).

A fake mixes in FaultInjection (after FakeServer, whose `_abort` it uses), calls `_init_faults()` among its settings, sets `model_kinds`
(the rec.kind values of its model calls) and `agent_kind` (the agent's own calls, not the
summarizer's), and answers through `_send_body` / `_send_stream` (or `_play` for a WebSocket).

Settings (attributes):
  fault_target        "all" (default; every endpoint) | "completions" (every model call) |
                      "chat" (the agent's model calls; the protocol's own kind name works too) |
                      "summarizer"
  fault_times         None: forever | n: only the next n selected requests
  fail_status         answer with this status and the protocol's error body for it
  retry_after         with fail_status: value of a Retry-After header
  stall_before_headers_s  sleep this long before sending anything
  stall_mid_stream_s  send about half of the body / stream, sleep, then send the rest
  reset_mid_response  send about half of the body / stream, then abort the connection
  malformed_json      JSON answers: the status with a truncated (invalid) JSON body
  broken_sse          streams: after about half of the events an event with invalid JSON, then the end
  chunk_delay_s       sleep before every stream event after the first
  release_last_chunk  None | asyncio.Event: agent streams park before their final event until it is set
  last_chunk_waiting  asyncio.Event the fake sets when a stream is parked there
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from aiohttp import web

from proxy.fakes.common import RecordedRequest
from proxy.fakes.server import RESP_KEY


class FaultInjection:
    model_kinds: tuple[str, ...] = ()
    agent_kind: str = ""

    def _init_faults(self) -> None:
        self.fault_target: str = "all"
        self.fault_times: int | None = None
        self.fail_status: int | None = None
        self.retry_after: float | int | None = None
        self.stall_before_headers_s: float = 0.0
        self.stall_mid_stream_s: float = 0.0
        self.reset_mid_response: bool = False
        self.malformed_json: bool = False
        self.broken_sse: bool = False
        self.chunk_delay_s: float = 0.0
        self.release_last_chunk: asyncio.Event | None = None
        self.last_chunk_waiting: asyncio.Event = asyncio.Event()

    def _is_model_call(self, rec: RecordedRequest) -> bool:
        return rec.kind in self.model_kinds

    def _fault_flags(self) -> tuple:
        return (self.fail_status, self.stall_before_headers_s, self.stall_mid_stream_s, self.reset_mid_response,
                self.malformed_json, self.broken_sse)

    def _take_fault(self, rec: RecordedRequest) -> bool:
        """Whether the fault flags apply to this request (consumes one of fault_times)."""
        if not any(self._fault_flags()):
            return False
        target = self.fault_target
        if target == "completions" and not self._is_model_call(rec):
            return False
        if target in ("chat", self.agent_kind) and rec.kind != self.agent_kind:
            return False
        if target == "summarizer" and rec.kind != "summarizer":
            return False
        if self.fault_times is not None:
            if self.fault_times <= 0:
                return False
            self.fault_times -= 1
        rec.faulted = True
        return True

    async def _send_body(self, request: web.Request, rec: RecordedRequest, data: bytes, *, status: int,
                         headers: dict[str, str], fault: bool) -> web.StreamResponse:
        rec.status = status
        if fault and self.malformed_json:
            return web.Response(status=status, body=data[: len(data) // 2], headers=headers)
        if fault and (self.reset_mid_response or self.stall_mid_stream_s):
            resp = web.StreamResponse(status=status, headers=headers)
            resp.content_length = len(data)
            await resp.prepare(request)
            request[RESP_KEY] = resp
            await resp.write(data[: len(data) // 2])
            if self.reset_mid_response:
                return await self._abort(request, resp)
            await asyncio.sleep(self.stall_mid_stream_s)
            await resp.write(data[len(data) // 2 :])
            await resp.write_eof()
            return resp
        return web.Response(status=status, body=data, headers=headers)

    async def _send_stream(self, request: web.Request, rec: RecordedRequest, events: list[tuple[bytes, bool]], *,
                           headers: dict[str, str], fault: bool, broken: bytes) -> web.StreamResponse:
        """A 200 event stream; `events` are (bytes, is the final event); `broken` is what a broken
        stream sends halfway (then it ends)."""
        resp = web.StreamResponse(status=200, headers=headers)
        rec.status = 200
        await resp.prepare(request)
        request[RESP_KEY] = resp

        async def abort() -> None:
            await self._abort(request, resp)

        if await self._play(rec, events, fault, resp.write, abort, broken) != "reset":
            await resp.write_eof()
        return resp

    async def _play(self, rec: RecordedRequest, events: list[tuple[bytes, bool]], fault: bool,
                    write: Callable[[bytes], Awaitable[None]], abort: Callable[[], Awaitable[None]],
                    broken: bytes) -> str:
        """Write the events with the faults that apply: "done" | "broken" | "reset"."""
        middle = max(1, len(events) // 2)
        for i, (data, final) in enumerate(events):
            if fault and i == middle:
                if self.broken_sse:
                    await write(broken)
                    return "broken"
                if self.reset_mid_response:
                    await abort()
                    return "reset"
                if self.stall_mid_stream_s:
                    await asyncio.sleep(self.stall_mid_stream_s)
            if final and self.release_last_chunk is not None and rec.kind != "summarizer":
                self.last_chunk_waiting.set()
                await self.release_last_chunk.wait()
            if self.chunk_delay_s and i > 0:
                await asyncio.sleep(self.chunk_delay_s)
            await write(data)
        return "done"
