"""Recall inside a Messages event stream (design.md § Recall): the filter proxy/recall/relay.py runs.

The client gets one message: one `message_start` (the first round's, relayed at once, as are the
upstream's `ping`s: the client sees the stream the upstream sent, minus the recall calls and the
later rounds' message_start / message_delta / message_stop), every round's content blocks under
consecutive `index`es, then one `message_delta` (the last round's stop reason, `end_turn` when only
dropped recall calls made it `tool_use`; the usage of every round, as totals, which the SDK takes
over message_start's) and one `message_stop`. A recall `tool_use` block is told apart by its
`content_block_start` and held back whole; thinking blocks go out (signed, valid to send back),
but for a later round's on a model that binds thinking to its prefix (invalid in the one message).
Each round's blocks are rebuilt from their deltas for the continuation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy import errors
from proxy.sse import event_fields
from proxy.recall.answers import Call, add_usage
from proxy.protocols.messages import binding
from proxy.protocols.messages.recall import USAGE_KEYS, continuation, is_client_call, is_recall, later_thinking, stop_reason


def sse(payload: dict[str, Any]) -> bytes:
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@dataclass
class _Block:
    block: dict[str, Any]  # rebuilt from its deltas
    index: int = -1  # the client's index; -1: held back (a recall call)
    partial: str = ""  # a tool_use's input JSON so far


def _applied(b: _Block, delta: Any) -> None:
    if not isinstance(delta, dict):
        return
    t, blk = delta.get("type"), b.block
    if t == "text_delta":
        blk["text"] = blk.get("text", "") + str(delta.get("text", ""))
    elif t == "thinking_delta":
        blk["thinking"] = blk.get("thinking", "") + str(delta.get("thinking", ""))
    elif t == "signature_delta":
        blk["signature"] = delta.get("signature")
    elif t == "input_json_delta":
        b.partial += str(delta.get("partial_json", ""))
    elif t == "citations_delta":
        blk.setdefault("citations", []).append(delta.get("citation"))


def _finished(b: _Block) -> dict[str, Any]:
    blk = dict(b.block)
    if blk.get("type") in ("tool_use", "server_tool_use") and b.partial:
        try:
            blk["input"] = orjson.loads(b.partial)
        except orjson.JSONDecodeError:
            blk["input"] = {}
    return blk


@dataclass
class Rounds:
    name: str
    opened: bool = False  # the client got an event
    next_index: int = 0
    usage: Any = None  # every finished round's usage
    dropped: bool = False
    # this round
    blocks: dict[int, _Block] = field(default_factory=dict)
    round_usage: dict[str, Any] = field(default_factory=dict)
    delta: dict[str, Any] | None = None  # the round's message_delta
    stopped: bool = False
    round: int = 0
    bound: bool = False  # the model binds thinking to its prefix: later rounds' thinking is held back

    def start(self) -> None:
        self.blocks, self.round_usage, self.delta, self.stopped = {}, {}, None, False
        self.round += 1

    def feed(self, event: bytes) -> list[bytes]:
        _, data = event_fields(event)
        if data is None:
            return [event] if self.opened else []
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return [event]
        t = payload.get("type") if isinstance(payload, dict) else None
        if t == "message_start":
            message = payload.get("message") if isinstance(payload.get("message"), dict) else {}
            if isinstance(message.get("usage"), dict):
                self.round_usage.update(message["usage"])
            if self.round == 1:
                self.opened = True
                self.bound = binding.binds(str(message.get("model", "")))
                return [event]
            return []
        if t == "ping":
            return [event]
        if t == "message_delta":
            if isinstance(payload.get("usage"), dict):
                self.round_usage.update({k: v for k, v in payload["usage"].items() if v is not None})
            self.delta = payload
            return []
        if t == "message_stop":
            self.stopped = True
            self.usage = add_usage(self.usage, {k: v for k, v in self.round_usage.items() if k in USAGE_KEYS})
            return []
        if t in ("content_block_start", "content_block_delta", "content_block_stop") and isinstance(
                payload.get("index"), int):
            return self._block(t, payload)
        self.opened = True
        return [event]  # an error event, or one the API adds later

    def _block(self, t: str, payload: dict[str, Any]) -> list[bytes]:
        i = payload["index"]
        if t == "content_block_start":
            cb = payload.get("content_block")
            b = self.blocks[i] = _Block(dict(cb) if isinstance(cb, dict) else {})
            if not is_recall(b.block, self.name) and not (self.round > 1 and self.bound and later_thinking(b.block)):
                b.index = self.next_index
                self.next_index += 1
        b = self.blocks.get(i)
        if b is None:
            return [sse(payload)]
        if t == "content_block_delta":
            _applied(b, payload.get("delta"))
        if b.index < 0:
            return []
        return [sse({**payload, "index": b.index})]

    # -- the end of a round --------------------------------------------------------------------
    def _content(self) -> list[dict[str, Any]]:
        return [_finished(self.blocks[i]) for i in sorted(self.blocks)]

    def recall_calls(self) -> list[Call]:
        return [Call(str(b.get("id")), orjson.dumps(b.get("input") or {}).decode()) for b in self._content()
                if is_recall(b, self.name)]

    def has_client_calls(self) -> bool:
        return any(is_client_call(b, self.name) for b in self._content())

    def continuation(self, body: dict[str, Any], results: list[str], *, last: bool) -> dict[str, Any]:
        return continuation(body, self._content(), self.recall_calls(), results, last=last)

    def error_event(self, err: errors.ProxyError) -> bytes:
        return err.event()

    def close(self) -> list[bytes]:
        out: list[bytes] = []
        if self.delta is not None:
            delta = dict(self.delta.get("delta") or {})
            delta["stop_reason"] = stop_reason(delta.get("stop_reason"), self._content(), self.name, self.dropped)
            usage = dict(self.delta.get("usage") or {})
            usage.update(self.usage or {})
            out.append(sse({**self.delta, "delta": delta, "usage": usage}))
        if self.stopped:
            out.append(sse({"type": "message_stop"}))
        return out
