"""Checking a Messages event stream on its way to the client (design.md § Messages API): Anthropic's SSE,
`event: <type>` then `data: <JSON whose type is that name>`; message_start first, then
content_block_start / _delta / _stop, ping, message_delta, and message_stop at the end, or an
`error` event. A stream that breaks this (bad JSON, a name that disagrees with its data, an end
without message_stop) is ended with an Anthropic `error` event by the relay, so the SDK raises
instead of returning half a message. Event types Anthropic adds later pass (its versioning
policy says clients must accept them)."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.sse import MAX_EVENT_BYTES, NamedEventChecker
from proxy.exchange import Usage


class MessagesEventChecker(NamedEventChecker):
    MARKED = frozenset({"message_start", "message_delta", "message_stop", "error"})  # (what `check` reads)

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        super().__init__(max_event_bytes)
        self.started = False  # message_start went by
        self.usage: dict[str, Any] = {}  # message_start's usage, updated by message_delta's

    def check(self, name: str | None, data: bytes) -> str | None:
        """An event's name (None: none given) and data: why it is broken, or None."""
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return "an event's data is not valid JSON"
        kind = payload.get("type") if type(payload) is dict else None
        if type(kind) is not str:
            return "an event's data has no type"
        if name is not None and name != kind:
            return f"an event named {name[:40]!r} carries a {kind[:40]!r}"
        if self.done:
            return f"a {kind[:40]!r} event came after the end of the message"
        if kind == "content_block_delta" and self.started:
            return None  # (most events: nothing to note)
        if kind == "message_start":
            message = payload.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self.started = self.flowing = True
            if isinstance(usage, dict):
                self.usage.update(usage)
        elif kind == "message_delta":
            if isinstance(payload.get("usage"), dict):
                self.usage.update({k: v for k, v in payload["usage"].items() if v is not None})
        elif kind in ("message_stop", "error"):
            self.done = True
        elif not self.started and kind != "ping":
            return f"a {kind[:40]!r} event came before message_start"
        return None

    def ended(self) -> str | None:
        return None if self.done else "the stream ended before message_stop"


def messages_usage(usage: Any) -> Usage | None:
    """An answer's usage as the bill counts it: the prompt is the uncached input plus what was
    read from and written to the cache."""
    if not isinstance(usage, dict):
        return None
    parts = [usage.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
    out = usage.get("output_tokens")
    if not isinstance(parts[0], int) or not isinstance(out, int):
        return None
    read = parts[1] if isinstance(parts[1], int) else 0
    made = parts[2] if isinstance(parts[2], int) else 0
    return Usage(parts[0] + read + made, read, out)
