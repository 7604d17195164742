"""The turns of one client WebSocket (`GET /v1/responses` upgraded): each `response.create`
through the same pipeline as an HTTP body (the handshake's headers carry the credential, the
focus, the session); a turn chained to the socket's latest response read as the whole history it
stands for (chain.py), and the forwarded body chained again where the upstream holds its start."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from proxy import jsonbody, offload
from proxy.exchange import EXCHANGE
from proxy.protocols import pipeline
from proxy.protocols.responses import recall_chains, trigger
from proxy.protocols.responses.chain import Chain, Sent
from proxy.protocols.responses.protocol import PROTOCOL
from proxy.protocols.responses.socket_recall import SocketRecall
from proxy.protocols.responses.websocket import WsTurn
from proxy.recall import answers as recall_answers
from proxy.recall.relay import RECALLS
from proxy.state import STATE

log = logging.getLogger("proxy.responses")


class SocketTurns:
    """A socket's `prepare` (websocket.Prepare): called with each `response.create` event."""

    def __init__(self, request: web.Request) -> None:
        self.app = request.app
        self.state = state = request.app[STATE]
        self.ex = request[EXCHANGE]
        self.headers = request.headers
        self.caller = PROTOCOL.caller(request, state)
        cfg = state.cfg
        # (with both stages off nothing can change: the chain is not read, nor its history kept)
        self.chain = Chain(max_bytes=state.max_body) if cfg.compaction.enabled or cfg.tool_results.enabled else None

    async def __call__(self, event: dict[str, Any], message: str) -> WsTurn:
        body = {k: v for k, v in event.items() if k != "type"}
        chain = self.chain
        whole = chain.whole(body) if chain is not None else None
        native = trigger.on_socket(self.app, whole or body, self.caller)  # Codex's compaction_trigger
        if native is not None and native.now:  # answered here: nothing goes upstream
            return WsTurn("", native=native)
        # Parsed (and checked) as an HTTP body is: a turn that resends the whole history (or is
        # read as it) reuses the previous turn's parse of it (the same writing of the same items).
        # Written off the event loop when large (a chain's history is up to the body limit).
        size = len(message) + (chain.size if whole is not None and chain is not None else 0)
        raw = await offload.sized(size, jsonbody.dumps, whole if whole is not None else body)
        p = await pipeline.prepare(self.state, PROTOCOL, pipeline.Incoming(raw, self.headers, self.caller, self.ex))
        turn = await _Turn(self, body, whole, raw, p).start(message)
        turn.native = native  # (answered here if the upstream refuses it)
        return turn


class _Turn:
    """One `response.create`: its prepared body, the report shown in its response.created, what
    it adds to the socket's chain, its recall rounds."""

    def __init__(self, turns: SocketTurns, body: dict[str, Any], whole: dict[str, Any] | None, raw: bytes,
                 p: pipeline.Prepared) -> None:
        self.turns, self.chain, self.body, self.whole, self.raw, self.p = turns, turns.chain, body, whole, raw, p
        report = p.headers if turns.state.cfg.responses.websocket_report else None
        # (a recall turn puts its count in)
        self.report = {k: v for k, v in report.items() if k != RECALLS} if report is not None else None
        self.added: Sent | None = None  # what this turn adds to the chain (the last attempt's)
        self.recall: SocketRecall | None = None

    async def start(self, message: str) -> WsTurn:
        p, chain, state = self.p, self.chain, self.turns.state
        if p.recall is not None:  # the recall tool is declared: its rounds are answered on the socket
            self.recall = SocketRecall(p.recall, await _parsed(p.data), self.report,
                                       finish=lambda r: _finish_recall(state, p.model, r))
        if p.data is self.raw and (self.whole is None or chain is None or chain.upstream is not None):
            # nothing changed: the client's message as it came (chained or not)
            self.added = await offload.sized(len(message), chain.as_it_came, self.body) if chain is not None else None
            out = message
        else:  # changed, or the upstream's history is not the client's (a recall turn's rounds): through the chain
            out = await self.outgoing(p.data, self.recall.body if self.recall is not None else None)
        return WsTurn(out, retry=self.retry, done=self.done, report=self.report, recall=self.recall)

    def as_sent(self, data: bytes, forwarded: dict[str, Any]) -> tuple[str, Sent | None]:
        assert self.chain is not None
        sent, what = self.chain.forwarded(self.whole or self.body, forwarded, chained=self.whole is not None,
                                          size=len(self.raw))
        # (unchained: the stages' own bytes; chained: the shorter body, written here)
        return as_message(data if sent is forwarded else jsonbody.dumps(sent)), what

    async def outgoing(self, data: bytes, forwarded: dict[str, Any] | None) -> str:
        """The stages' body (`forwarded`: it parsed, when a recall turn has it already) as the
        message to send, chained where the upstream holds its start (a recall turn's
        continuations are built from the whole body: valid either way); off the event loop
        when it is large."""
        if self.chain is None:
            return as_message(data)
        if forwarded is None:
            forwarded = await _parsed(data)
        out, self.added = await offload.sized(len(data), self.as_sent, data, forwarded)
        return out

    async def retry(self) -> tuple[str, dict[str, str] | None] | None:
        again = await self.p.retry() if self.p.retry is not None else None
        if again is None:
            return None
        shown = {k: v for k, v in again[1].items() if k != RECALLS} if self.report is not None else None
        forwarded = None
        if self.recall is not None:
            forwarded = await _parsed(again[0])
            self.recall.restart(forwarded, shown)
        return await self.outgoing(again[0], forwarded), shown

    def done(self, event: dict[str, Any] | None) -> None:
        recall = self.recall
        # (a recall turn's rounds or recall call: the upstream holds what the client never saw)
        if self.chain is not None and self.chain.ended(event, self.added, as_shown=recall is not None and (
                recall.rounds.round > 1 or bool(recall.rounds.recall_calls()))):
            self.turns.state.sockets.chains_dropped += 1
            log.info("a WebSocket chain's history passed the body limit: dropped (turns go as they come)")


async def _parsed(data: bytes) -> dict[str, Any]:
    return await offload.sized(len(data), jsonbody.loads, data)


def as_message(data: bytes) -> str:
    """A request body's bytes as the socket's `response.create` message."""
    return (b'{"type":"response.create",' + data[1:]).decode() if data != b"{}" else '{"type":"response.create"}'


async def _finish_recall(state: Any, model: str, recall: SocketRecall) -> None:
    """A socket turn's recall rounds counted, and its shown id mapped to the response the upstream
    keeps (the last round's), which a later previous_response_id must name (recall_chains.py)."""
    session = recall.session
    late = recall.late()
    if late:
        log.info("recall: %d of %d lookup(s) came after the turn's response.created", late, session.calls)
        state.hooks.recall_after_headers(late, "responses")
    if session.rounds or recall.rounds.dropped:
        await recall_chains.remember(state.store, session.scope, *recall.rounds.ids(), recall.rounds.unanswered())
    recall_answers.finished(state.hooks, "responses", model, session)
