"""Recall inside a Responses event stream (design.md § Recall): the filter proxy/recall/relay.py runs.

The client gets one response: the first round's `response.created` / `in_progress` (held until
the first event the client sees, so the headers count the lookups made before it), then every
round's output items under consecutive `output_index`es, then one end event (`response.completed`,
...) carrying the first round's id (the SDK holds a stream to one id), the output the client saw
and the usage of every round. Every event is renumbered (`sequence_number` from 0, no gaps).

An item is told apart by its `response.output_item.added`: a recall `function_call` is held back
whole; a reasoning item waits for the item after it (shown with it, or held back with a recall
call it preceded: sent back without that call, the upstream would refuse it); anything else goes
out at once. Continuation rounds' lifecycle events are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy import errors
from proxy.sse import event_fields
from proxy.recall.answers import Call, add_usage
from proxy.protocols.responses.recall import continuation, is_client_call, is_recall, without_tool
from proxy.protocols.responses.stream import END_EVENTS, PREAMBLE, error_event

SHOWN, HELD, HIDDEN = "shown", "held", "hidden"


@dataclass
class _Item:
    state: str  # shown | held (a reasoning item waiting for what follows) | hidden (recall, or its reasoning)
    index: int = -1  # the client's output_index (shown)
    events: list[dict[str, Any]] = field(default_factory=list)  # a held item's events
    added: Any = None  # the item as added


def sse(payload: dict[str, Any]) -> bytes:
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


@dataclass
class Rounds:
    name: str  # the recall tool's name
    seq: int = 0  # the client's next sequence_number
    first: dict[str, Any] | None = None  # id, created_at of the first response
    opened: bool = False  # the lifecycle events went out
    preamble: list[dict[str, Any]] = field(default_factory=list)  # held until the first event shown
    shown: dict[int, Any] = field(default_factory=dict)  # client index -> the item as done
    next_index: int = 0
    usage: Any = None
    dropped: bool = False
    end: dict[str, Any] | None = None  # the last round's end event
    # this round
    items: dict[int, _Item] = field(default_factory=dict)
    done: dict[int, Any] = field(default_factory=dict)  # upstream index -> the item as done
    last_added: int | None = None
    round: int = 0

    def start(self) -> None:
        self.items, self.done, self.last_added, self.end = {}, {}, None, None
        self.round += 1

    def _out(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """One event for the client, numbered (the held lifecycle events go first)."""
        head: list[dict[str, Any]] = []
        if not self.opened:
            self.opened = True
            head = [e for p in self.preamble for e in self._out(p)]
            self.preamble = []
        payload = {"type": payload["type"], "sequence_number": self.seq,
                   **{k: v for k, v in payload.items() if k not in ("type", "sequence_number")}}
        self.seq += 1
        return [*head, payload]

    def feed(self, event: bytes) -> list[bytes]:
        """One SSE event of the upstream's: the SSE events for the client now."""
        _, data = event_fields(event)
        if data is None:
            return [event] if self.opened else []
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            return [event]  # (the checker refused anything that matters)
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            return [event]
        return [sse(p) for p in self.take(payload)]

    def take(self, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """One upstream event (a parsed object with a type): the events for the client now. The
        framing is the caller's (SSE here, a WebSocket message in proxy/protocols/responses/socket_recall.py)."""
        t = payload["type"]
        if t in PREAMBLE:
            response = payload.get("response") if isinstance(payload.get("response"), dict) else {}
            if self.round > 1:
                return []
            if self.first is None:
                self.first = {k: response[k] for k in ("id", "created_at") if k in response}
            self.preamble.append({**payload, "response": without_tool(response, self.name)} if response else payload)  # until something follows: a round that only looks up shows nothing
            return []
        if t in END_EVENTS:
            self.end = payload
            response = payload.get("response")
            if isinstance(response, dict):
                self.usage = add_usage(self.usage, response.get("usage"))
            return []
        if not isinstance(payload.get("output_index"), int):
            return self._out(payload)
        i = payload["output_index"]
        out: list[dict[str, Any]] = []
        if t == "response.output_item.added":
            out += self._added(i, payload.get("item"))
        item = self.items.get(i)
        if t == "response.output_item.done":
            self.done[i] = payload.get("item")
        if item is None:
            return out + self._out(payload)
        if item.state == HELD:
            item.events.append(payload)
        elif item.state == SHOWN:
            if t == "response.output_item.done":
                self.shown[item.index] = payload.get("item")
            out += self._out({**payload, "output_index": item.index})
        return out

    def _added(self, i: int, added: Any) -> list[dict[str, Any]]:
        before = self.items.get(self.last_added) if self.last_added is not None else None
        self.last_added = i
        if is_recall(added, self.name):
            self.items[i] = _Item(HIDDEN, added=added)
            if before is not None and before.state == HELD:
                before.state, before.events = HIDDEN, []
            return []
        out = self._show(before) if before is not None and before.state == HELD else []
        if isinstance(added, dict) and added.get("type") == "reasoning":
            self.items[i] = _Item(HELD, added=added)
        else:
            self.items[i] = _Item(SHOWN, self._index(), added=added)
        return out

    def _index(self) -> int:
        self.next_index += 1
        return self.next_index - 1

    def _show(self, item: _Item) -> list[dict[str, Any]]:
        item.state, item.index = SHOWN, self._index()
        out: list[dict[str, Any]] = []
        for p in item.events:
            if p.get("type") == "response.output_item.done":
                self.shown[item.index] = p.get("item")
            out += self._out({**p, "output_index": item.index})
        item.events = []
        return out

    # -- the end of a round --------------------------------------------------------------------
    def _output(self) -> list[Any]:
        return [self.done[i] for i in sorted(self.done)]

    def recall_calls(self) -> list[Call]:
        return [Call(str(it.get("call_id")), str(it.get("arguments") or "")) for it in self._output()
                if is_recall(it, self.name)]

    def has_client_calls(self) -> bool:
        return any(is_client_call(it, self.name) for it in self.done.values())

    def continuation(self, body: dict[str, Any], results: list[str], *, last: bool) -> dict[str, Any]:
        return continuation(body, self._output(), self.recall_calls(), results, last=last)

    def error_event(self, err: errors.ProxyError) -> bytes:
        self.seq += 1
        return error_event(err, self.seq - 1)

    def unanswered(self) -> list[str]:
        """The call ids of the recall calls left out of the turn the client got (a mixed turn)."""
        return [c.id for c in self.recall_calls()] if self.dropped else []

    def ids(self) -> tuple[str | None, str | None]:
        """(the id the client was shown, the id of the response the upstream stored last)."""
        last = (self.end or {}).get("response") or {}
        return (self.first or {}).get("id"), last.get("id") if isinstance(last, dict) else None

    def close(self) -> list[bytes]:
        return [sse(p) for p in self.closing()]

    def closing(self) -> list[dict[str, Any]]:
        """Held reasoning shown (nothing followed it), then the one end event."""
        out: list[dict[str, Any]] = []
        for i in sorted(self.items):
            if self.items[i].state == HELD:
                out += self._show(self.items[i])
        if self.end is not None:
            end = self.end
            response = dict(without_tool(end.get("response") or {}, self.name))
            response.update(self.first or {})
            response["output"] = [self.shown[k] for k in sorted(self.shown)]
            if self.usage is not None:
                response["usage"] = self.usage
            out += self._out({**end, "response": response})
        return out
