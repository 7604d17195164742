"""Recall inside a Chat Completions event stream (design 13.3).

The client gets one stream. Text is relayed as it comes and stays; a recall call's deltas are held
back (a call's first delta names its tool, so each call is told apart from its first delta); the
round's finish chunk waits for the end of the round: a round of recall calls only is answered and
the continuation streams into the same response (its chunks carry the first round's id); client
tool calls are relayed with their indexes renumbered so the recall calls leave no gap. `usage`
chunks are held and one chunk with the sum of every round goes out before `[DONE]`.

`Rounds` is the pure part (events in, events out); `relay` does the I/O around it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

from proxy import errors
from proxy.forward import CLIENT_GONE, UPSTREAM_ERRORS, EventChecker, client_response_headers, is_event_stream, map_client_error
from proxy.recall.chat import add_usage, continuation
from proxy.recall.session import RecallSession

log = logging.getLogger("proxy.recall")

_EVENT_END = re.compile(rb"\r?\n\r?\n")
DONE = b"data: [DONE]\n\n"


@dataclass
class _Call:
    recall: bool
    index: int  # the client's index (client calls only)
    id: str = ""
    arguments: str = ""


def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _data(event: bytes) -> bytes | None:
    lines = [line[5:] for line in event.splitlines() if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(d[1:] if d.startswith(b" ") else d for d in lines)


@dataclass
class Rounds:
    """The filter over one client request's upstream streams, round after round."""

    name: str  # the recall tool's name
    first: dict[str, Any] | None = None  # id, created of the first chunk: every chunk carries them
    visible: bool = False  # something went to the client
    held: list[bytes] = field(default_factory=list)  # the opening role chunk, until something follows it
    next_index: int = 0  # the client's next tool call index
    usage: Any = None
    saw_usage: bool = False
    saw_done: bool = False
    _usage_chunk: dict[str, Any] = field(default_factory=dict)
    dropped: bool = False  # a recall call was dropped from a round that goes to the client
    # this round
    calls: dict[int, _Call] = field(default_factory=dict)
    text: list[str] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    round: int = 0

    def start(self) -> None:
        self.calls, self.text, self.finish = {}, [], None
        self.round += 1

    def feed(self, event: bytes) -> list[bytes]:
        """Events for the client now (possibly none) for one upstream event."""
        payload = _data(event)
        if payload is None:
            return [event] if self.visible else []  # keep-alive comments once the stream is open
        if payload.strip() == b"[DONE]":
            self.saw_done = True
            return []
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return [event]  # the checker already refused anything that matters
        if not isinstance(obj, dict):
            return [event]
        if self.first is None:
            self.first = {k: obj[k] for k in ("id", "created") if k in obj}
        choices = obj.get("choices")
        if "usage" in obj and obj["usage"] is not None and not choices:
            self.usage, self.saw_usage = add_usage(self.usage, obj["usage"]), True
            self._usage_chunk = obj
            return []
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return self._out(obj, event, changed=False)
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        changed = False
        if delta.get("tool_calls"):
            kept = []
            for tc in delta["tool_calls"]:
                call = self._call(tc)
                if call.recall:
                    changed = True
                    continue
                if tc.get("index") != call.index:
                    tc = {**tc, "index": call.index}
                    changed = True
                kept.append(tc)
            delta = {**delta, "tool_calls": kept} if kept else {k: v for k, v in delta.items() if k != "tool_calls"}
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
        if choice.get("finish_reason") is not None:
            self.finish = {**obj, "choices": [{**choice, "delta": delta}]}
            return []
        if changed:
            obj = {**obj, "choices": [{**choice, "delta": delta}, *choices[1:]]}
        if not any(delta.get(k) for k in ("content", "tool_calls", "refusal", "reasoning_content", "function_call")):
            # nothing to see: the opening role chunk is kept for when something follows
            if "role" in delta and not self.visible and not self.held and self.round == 1:
                self.held.append(_event(self._stamped(obj)))
            return []
        return self._out(obj, event, changed)

    def _call(self, tc: dict[str, Any]) -> _Call:
        idx = tc.get("index", 0)
        call = self.calls.get(idx)
        fn = tc.get("function") if isinstance(tc.get("function"), dict) else {}
        if call is None:
            recall = fn.get("name") == self.name
            call = self.calls[idx] = _Call(recall, -1 if recall else self.next_index)
            if not recall:
                self.next_index += 1
        if tc.get("id"):
            call.id = tc["id"]
        if isinstance(fn.get("arguments"), str):
            call.arguments += fn["arguments"]
        return call

    def _stamped(self, obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, **(self.first or {})}

    def _out(self, obj: dict[str, Any], event: bytes, changed: bool) -> list[bytes]:
        out = self.held
        self.held = []
        self.visible = True
        if changed or self.round > 1:
            out.append(_event(self._stamped(obj)))
        else:
            out.append(event if event.endswith(b"\n\n") else event + b"\n\n")
        return out

    # -- the end of a round --------------------------------------------------------------------
    def recall_calls(self) -> list[_Call]:
        return [c for c in self.calls.values() if c.recall]

    def continues(self, over: bool) -> bool:
        """Whether this round is answered here: recall calls only (`over`: no more rounds)."""
        recall = self.recall_calls()
        client = [c for c in self.calls.values() if not c.recall]
        if recall and (client or over):
            self.dropped = True
        return bool(recall) and not client and not over

    def assistant(self) -> dict[str, Any]:
        """The round's assistant message with its recall calls, for the continuation."""
        calls = [{"id": c.id, "type": "function", "function": {"name": self.name, "arguments": c.arguments}}
                 for c in self.recall_calls()]
        return {"content": "".join(self.text), "tool_calls": calls}

    def close(self) -> list[bytes]:
        """The last events: the finish chunk, the summed usage, [DONE]."""
        out = self.held
        self.held = []
        if self.finish is not None:
            fin = self.finish
            choice = fin["choices"][0]
            if self.dropped and self.next_index == 0 and choice.get("finish_reason") == "tool_calls":
                fin = {**fin, "choices": [{**choice, "finish_reason": "stop"}]}
            out.append(_event(self._stamped(fin)))
        if self.saw_usage:
            out.append(_event(self._stamped({**self._usage_chunk, "usage": self.usage})))
        if self.saw_done:
            out.append(DONE)
        self.visible = True
        return out


Post = Callable[[dict[str, Any]], Awaitable[aiohttp.ClientResponse]]


@dataclass
class StreamResult:
    response: web.StreamResponse
    usage: Any  # the sum of every round's usage (None when the upstream sent none)


async def relay(request: web.Request, upstream: aiohttp.ClientResponse, first: bytes, extra: dict[str, str],
                body: dict[str, Any], post: Post, session: RecallSession) -> StreamResult:
    """Relay a chat completion stream whose first bytes were read, answering recall rounds inside
    it (`post` sends a continuation upstream). The response headers go out with the first event
    the client gets, so `x-compaction-recalls` counts the recalls made before it (usually all of
    them: a model looks up before it writes)."""
    rounds = Rounds(session.name)
    resp: web.StreamResponse | None = None
    base_headers = client_response_headers(upstream.headers)

    async def write(events: list[bytes]) -> None:
        nonlocal resp
        if not events:
            return
        if resp is None:
            headers = base_headers.copy()
            headers.update(extra)
            headers["x-compaction-recalls"] = str(session.calls)
            resp = web.StreamResponse(status=200, headers=headers)
            await resp.prepare(request)
        await resp.write(b"".join(events))

    async def fail(err: errors.ProxyError) -> StreamResult:
        log.warning("upstream stream ended abnormally: %s", err.message)
        with contextlib.suppress(*CLIENT_GONE):
            await write([b"data: " + err.body() + b"\n\n"])
            assert resp is not None
            await resp.write_eof()
        return StreamResult(_done(resp), rounds.usage)

    current: aiohttp.ClientResponse = upstream
    chunk: bytes | None = first
    try:
        while True:
            rounds.start()
            checker = EventChecker()
            try:
                while True:
                    if chunk is None:
                        chunk = await current.content.readany()
                    if not chunk:
                        good, broken = checker.finish()
                        await _pass(good, rounds, write)
                        break
                    good, broken = checker.feed(chunk)
                    chunk = None
                    await _pass(good, rounds, write)
                    if broken is not None:
                        break
            except UPSTREAM_ERRORS as e:
                if isinstance(e, CLIENT_GONE):
                    raise
                current.close()
                return await fail(map_client_error(e))
            if broken is not None:
                current.close()
                return await fail(errors.upstream_bad_response(broken))
            if not rounds.continues(over=session.rounds > session.max_rounds):
                break
            last = session.exhausted
            recall = rounds.recall_calls()
            answers = await session.answer_calls([c.arguments for c in recall])
            body = continuation(body, rounds.assistant(), [(c.id, a) for c, a in zip(recall, answers)], last=last)
            if current is not upstream:
                current.release()
            try:
                current = await post(body)
            except UPSTREAM_ERRORS as e:
                return await fail(map_client_error(e))
            if current.status != 200 or not is_event_stream(current):
                why = await _error_text(current)
                return await fail(errors.upstream_bad_response(f"the upstream refused the request after a recall ({why})"))
            chunk = None
        await write(rounds.close() or [b""])
        assert resp is not None
        await resp.write_eof()
    except CLIENT_GONE:
        pass
    finally:
        if current is not upstream:
            current.close()
    return StreamResult(_done(resp), rounds.usage)


async def _pass(good: bytes, rounds: Rounds, write: Callable[[list[bytes]], Awaitable[None]]) -> None:
    if not good:
        return
    out: list[bytes] = []
    pos = 0
    for m in _EVENT_END.finditer(good):
        out += rounds.feed(good[pos:m.end()])
        pos = m.end()
    if pos < len(good):  # an unterminated last event (from finish())
        out += rounds.feed(good[pos:])
    await write(out)


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    try:
        raw = await asyncio.wait_for(resp.read(), 5)
    except UPSTREAM_ERRORS:
        return f"status {resp.status}"
    try:
        return f"status {resp.status}: {str(orjson.loads(raw)['error']['message'])[:300]}"
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"status {resp.status}"


def _done(resp: web.StreamResponse | None) -> web.StreamResponse:
    # None only when the client left before anything was written: nothing more goes to it.
    return resp if resp is not None else web.Response(status=499)
