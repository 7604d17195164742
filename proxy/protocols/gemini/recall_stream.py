"""Recall inside a Gemini stream (design.md § Recall): the filter proxy/recall/relay.py runs.

Each upstream event is a whole GenerateContentResponse; a functionCall part comes whole in one.
The client gets the events as they come without the recall calls (an event left with no part is
not sent), the later rounds' call signatures as the API's skip value, and one last event: the
last round's finishReason with every round's usageMetadata summed. Each round's parts are kept
for the continuation.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy import errors
from proxy.protocols.gemini.body import CALL, parts
from proxy.protocols.gemini.errors import GOOGLE
from proxy.protocols.gemini.recall import continuation, is_client_call, is_recall, later, recall_calls
from proxy.recall.answers import Call, add_usage
from proxy.sse import event_fields


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\r\n\r\n"


class Rounds:
    def __init__(self, name: str) -> None:
        self.name = name
        self.usage: Any = None
        self.dropped = False
        self._round = -1
        self.start()
        self._round = -1

    def start(self) -> None:
        self._round += 1
        self._parts: list[Any] = []  # this round's, as the model made them
        self._meta: Any = None  # this round's usageMetadata (each event carries the totals so far)
        self._held: dict[str, Any] | None = None  # the round's last event, sent by close()

    def feed(self, event: bytes) -> list[bytes]:
        _, data = event_fields(event)
        try:
            obj = orjson.loads(data) if data else None
        except orjson.JSONDecodeError:
            obj = None
        cands = obj.get("candidates") if isinstance(obj, dict) else None
        if not (isinstance(cands, list) and cands and isinstance(cands[0], dict)):
            return [event]  # an error event, or none of ours to read: as it came
        if isinstance(obj.get("usageMetadata"), dict):
            self._meta = obj["usageMetadata"]
        cand = cands[0]
        ps = parts(cand.get("content"))
        self._parts.extend(ps)
        shown = [p if self._round == 0 else later(p) for p in ps if not is_recall(p, self.name)]
        out = {**obj, "candidates": [{**cand, "content": {**(cand.get("content") or {}), "parts": shown}}, *cands[1:]]}
        if cand.get("finishReason"):
            self._held = out
            return []
        return [sse(out)] if shown else []

    def recall_calls(self) -> list[Call]:
        return recall_calls(self._parts, self.name)

    def has_client_calls(self) -> bool:
        return any(is_client_call(p, self.name) for p in self._parts)

    def continuation(self, body: dict[str, Any], results: list[str], *, last: bool) -> dict[str, Any]:
        self.usage = add_usage(self.usage, self._meta)  # this round ends here
        self._meta = None
        return continuation(body, {"role": "model", "parts": self._parts}, self.recall_calls(), results, last=last)

    def close(self) -> list[bytes]:
        self.usage = add_usage(self.usage, self._meta)
        self._meta = None
        held = self._held
        if held is None:
            return []
        if self.usage is not None:
            held = {**held, "usageMetadata": self.usage}
        cand = held["candidates"][0]
        if not parts(cand.get("content")) and not any(CALL in p for p in self._parts if not is_recall(p, self.name)):
            held["candidates"] = [{**cand, "content": {**(cand.get("content") or {}), "parts": [{"text": ""}]}}]
        return [sse(held)]

    def error_event(self, err: errors.ProxyError) -> bytes:
        return GOOGLE.event(err)
