"""Recall on a Responses WebSocket turn (design.md § Recall; the HTTP stream's relay is proxy/recall/relay.py).

A `response.create` whose forwarded request declares the recall tool is one client-visible
response however many rounds it takes. Its upstream events go through the Responses stream filter
(proxy/protocols/responses/recall_stream.py: a recall call's events held back, output indexes and sequence
numbers renumbered, one `response.created`, one end event with the first round's id, the output
the client saw and every round's usage summed), each event as one JSON text message. When a round
ends in recall calls only, they are answered here and the continuation goes upstream on the same
socket; the socket relay (websocket.py) sends nothing else upstream until the turn is over.

A socket has no headers: the turn's x-compaction-* report (with `x-compaction-recalls`, the
lookups made before it) goes in the metadata of its `response.created`; lookups made after it
went out are counted in the end event's metadata, in the log and in the metrics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import orjson

from proxy.recall.relay import RECALLS, answered_here
from proxy.protocols.responses.recall_stream import Rounds
from proxy.recall.session import RecallSession
from proxy.protocols.responses.stream import END_EVENTS

log = logging.getLogger("proxy.recall")


def metadata_with(response: Any, values: dict[str, str]) -> Any:
    """A response object with `values` added to its metadata (a string map)."""
    if not isinstance(response, dict) or not values:
        return response
    metadata = response.get("metadata")
    return {**response, "metadata": {**metadata, **values} if isinstance(metadata, dict) else dict(values)}


def as_message(body: dict[str, Any]) -> str:
    """A request body as the socket's `response.create` message."""
    return orjson.dumps({"type": "response.create", **body}).decode()


@dataclass
class SocketRecall:
    """One socket turn's recall rounds: what the client gets of each upstream event, and the
    continuation when a round is answered here."""

    session: RecallSession
    body: dict[str, Any]  # the request last sent upstream (the continuation's base)
    report: dict[str, str] | None  # the turn's x-compaction-* report (None: not shown)
    # after the turn: what the route keeps of it (ids for previous_response_id, counts)
    finish: Callable[["SocketRecall"], Awaitable[None]] | None = None
    rounds: Rounds = field(init=False)
    headed: int = 0  # the lookups counted in the response.created the client got

    def __post_init__(self) -> None:
        self.restart(self.body)

    def restart(self, body: dict[str, Any], report: dict[str, str] | None = None) -> None:
        """Start over with another request (the overflow retry's): nothing went to the client yet."""
        self.body = body
        if report is not None:
            self.report = report
        self.rounds = Rounds(self.session.name)
        self.rounds.start()

    def take(self, ev: dict[str, Any]) -> list[str]:
        """The client's messages for one upstream event (none while a round's lookups are held)."""
        return [orjson.dumps(self._shown(p)).decode() for p in self.rounds.take(ev)]

    def _shown(self, payload: dict[str, Any]) -> dict[str, Any]:
        """An event as the client gets it: its response.created with the turn's report."""
        if payload.get("type") != "response.created":
            return payload
        self.headed = self.session.calls
        if self.report is None:
            return payload
        return {**payload, "response": metadata_with(payload.get("response"), {**self.report, RECALLS: str(self.headed)})}

    async def next_round(self) -> str | None:
        """At a round's end: the continuation's message when its recall calls are answered here,
        else None (the turn ends)."""
        session, rounds = self.session, self.rounds
        if not answered_here(rounds, over=session.rounds > session.max_rounds):
            return None
        last = session.exhausted
        results = await session.answer_calls([c.arguments for c in rounds.recall_calls()])
        self.body = rounds.continuation(self.body, results, last=last)
        rounds.start()
        return as_message(self.body)

    def closing(self) -> list[str]:
        """The turn's last messages: held reasoning, then the one end event."""
        out = [self._shown(p) for p in self.rounds.closing()]
        late = self.session.calls - self.headed
        if late and self.report is not None and out and out[-1].get("type") in END_EVENTS:
            # the response.created went out before these lookups: the final count on the end event
            out[-1] = {**out[-1], "response": metadata_with(out[-1].get("response"), {RECALLS: str(self.session.calls)})}
        return [orjson.dumps(p).decode() for p in out]

    def late(self) -> int:
        """Lookups made after the client got the turn's response.created."""
        return self.session.calls - self.headed if self.rounds.opened else 0
