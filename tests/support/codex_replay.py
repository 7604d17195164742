"""Replaying the recorded Codex session (tests/fixtures/sessions/codex-responses.json) through the
proxy as Codex sends it: the first requests as zstd-compressed HTTP bodies streamed back as SSE,
the rest as `response.create` messages on one WebSocket. Used by the replay test and by
bench/responses_replay.py (the figures).

    result = await replay_codex(proxy.base_url, http_requests=6)
    result.turns            # per model call: transport, x-compaction-status (HTTP only), end event
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import zstandard

from support.sessions import codex_requests

END = ("response.completed", "response.failed", "response.incomplete", "error")
HEADERS = {"Authorization": "Bearer sk-codex", "OpenAI-Beta": "responses=experimental", "originator": "codex_cli_rs"}


@dataclass
class Turn:
    transport: str  # "http" | "websocket"
    status: int | None  # HTTP status (None over the socket)
    compaction: str | None  # x-compaction-status: the header, or on the socket response.created's metadata
    end: str  # the last event's type
    events: int


@dataclass
class ReplayResult:
    turns: list[Turn] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)  # what the client sent


async def _http(session: aiohttp.ClientSession, base_url: str, body: dict[str, Any]) -> Turn:
    data = zstandard.ZstdCompressor(level=3).compress(json.dumps(body).encode())
    async with session.post(base_url + "/responses", data=data, headers={
            **HEADERS, "Content-Type": "application/json", "Content-Encoding": "zstd",
            "Accept": "text/event-stream"}) as r:
        text = (await r.read()).decode()
        events = [block for block in text.split("\n\n") if block.strip()]
        last = events[-1].split("data: ", 1)[-1] if events else "{}"
        end = json.loads(last).get("type", "?") if r.status == 200 else f"http {r.status}"
        return Turn("http", r.status, r.headers.get("x-compaction-status"), end, len(events))


async def _ws(ws: aiohttp.ClientWebSocketResponse, body: dict[str, Any]) -> Turn:
    event = {"type": "response.create", **{k: v for k, v in body.items() if k != "stream"}}
    await ws.send_str(json.dumps(event))
    n = 0
    status = None
    while True:
        msg = await ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            return Turn("websocket", None, status, f"socket {msg.type.name}", n)
        n += 1
        ev = json.loads(msg.data)
        if ev["type"] == "response.created":
            status = ((ev.get("response") or {}).get("metadata") or {}).get("x-compaction-status")
        if ev["type"] in END:
            return Turn("websocket", None, status, ev["type"], n)


async def replay_codex(base_url: str, *, http_requests: int) -> ReplayResult:
    out = ReplayResult()
    bodies = codex_requests()
    async with aiohttp.ClientSession() as session:
        for body in bodies[:http_requests]:
            out.bodies.append(body)
            out.turns.append(await _http(session, base_url, body))
        ws_url = base_url.replace("http://", "ws://") + "/responses"
        async with session.ws_connect(ws_url, headers=HEADERS, max_msg_size=0) as ws:
            for body in bodies[http_requests:]:
                out.bodies.append(body)
                out.turns.append(await _ws(ws, body))
    return out


def summary_items(forwarded: list[dict[str, Any]]) -> list[str]:
    """The summary message of each forwarded request (its JSON), or "" where it has none."""
    out = []
    for body in forwarded:
        found = [json.dumps(it, sort_keys=True) for it in body.get("input") or []
                 if isinstance(it, dict) and it.get("role") == "user" and "<summary>" in json.dumps(it)]
        out.append(found[0] if found else "")
    return out
