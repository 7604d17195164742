"""Recall inside a Chat Completions event stream (design.md § Recall).

The client gets one stream. Text is relayed as it comes and stays; a recall call's deltas are held
back (a call's first delta names its tool, so each call is told apart from its first delta); the
round's finish chunk waits for the end of the round: a round of recall calls only is answered and
the continuation streams into the same response (its chunks carry the first round's id); client
tool calls are relayed with their indexes renumbered so the recall calls leave no gap. `usage`
chunks are held and one chunk with the sum of every round goes out before `[DONE]`.

`Rounds` is the pure part (events in, events out); proxy/recall/relay.py does the I/O around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy import errors
from proxy.recall import relay as recall_relay
from proxy.protocols.chat.recall import add_usage, continuation
from proxy.recall.relay import StreamResult
from proxy.recall.session import RecallSession

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

    def has_client_calls(self) -> bool:
        return any(not c.recall for c in self.calls.values())

    def assistant(self) -> dict[str, Any]:
        """The round's assistant message with its recall calls, for the continuation."""
        calls = [{"id": c.id, "type": "function", "function": {"name": self.name, "arguments": c.arguments}}
                 for c in self.recall_calls()]
        return {"content": "".join(self.text), "tool_calls": calls}

    def continuation(self, body: dict[str, Any], results: list[str], *, last: bool) -> dict[str, Any]:
        """The request once more with this round's recall calls and their `results`."""
        return continuation(body, self.assistant(), [(c.id, a) for c, a in zip(self.recall_calls(), results)], last=last)

    def error_event(self, err: errors.ProxyError) -> bytes:
        return b"data: " + err.body() + b"\n\n"

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




async def relay(request: web.Request, upstream: aiohttp.ClientResponse, first: bytes, extra: dict[str, str],
                body: dict[str, Any], post: recall_relay.Post, session: RecallSession, hooks: Any = None) -> StreamResult:
    """Relay a chat completion stream whose first bytes were read, answering recall rounds inside it."""
    return await recall_relay.relay(request, upstream, first, extra, body, post, session, Rounds(session.name),
                                    hooks=hooks)
