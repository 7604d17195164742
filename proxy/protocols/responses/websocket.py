"""WebSocket mode of the Responses API on `/v1/responses` (design.md § Responses API), aiohttp on both sides.

One upstream socket per client socket, opened before the client's handshake is answered (so an
upstream that refuses it, 401 or 404, refuses the client the same way). Each client
`response.create` is one request: the route's `prepare` hook gives the message to send upstream
(tool notes, compaction, reuse, as for an HTTP body) and, optionally, how to retry it compacted
after an overflow. Server events go back in the order they came; each is checked (JSON with a
type), and a response's opening events are held until it shows output, so that an overflow
(an `error` event with `context_length_exceeded`, or `response.failed` with it, before any
output) can be retried without the client seeing the failed attempt.

Recall (design.md § Recall): a turn whose request declares the recall tool carries a `SocketRecall`
(socket_recall.py); its rounds are answered on this socket and relayed as one response. While such
a turn is under way (or a turn is being prepared) the client's next messages wait here, read
ahead up to a bound in count and decoded bytes (inbox.py; then the socket is not read until room
is made): the upstream takes messages in order, and the turn's continuation must reach it before
them.

Closing: either side's close is passed on with its code; an upstream that dies (connection lost,
no close frame) or sends what is not an event gives the client an `error` event and a close frame
(1011), never a dropped connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import WSMsgType, web
from multidict import CIMultiDict

from proxy import errors, offload
from proxy.forward import map_client_error
from proxy.protocols.responses.inbox import Inbox
from proxy.sockets import SocketLimits
from proxy.protocols.responses.socket_recall import SocketRecall
from proxy.protocols.responses.stream import END_EVENTS, OVERFLOW_CODE, PREAMBLE, is_overflow_failure

log = logging.getLogger("proxy.responses.ws")

# Handshake headers aiohttp makes anew for its own connection upstream.
_HANDSHAKE = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                        "sec-websocket-protocol", "sec-websocket-accept"})
_UNSENDABLE = frozenset({1005, 1006, 1015})  # codes that report a state and never go in a close frame
ABNORMAL = 1011
GOING_AWAY = 1001  # how a server ends a socket it will not keep (here: idle)


@dataclass
class WsTurn:
    """One client message on its way upstream."""

    message: str  # what goes upstream
    # the compacted message after an overflow, and its report
    retry: Callable[[], Awaitable[tuple[str, dict[str, str] | None] | None]] | None = None
    done: Callable[[dict[str, Any] | None], None] | None = None  # told the turn's end event (None: none came)
    expects_reply: bool = True  # a response.create (or an unknown message the upstream answers with an error)
    report: dict[str, str] | None = None  # the x-compaction-* report, put in its response.created
    recall: SocketRecall | None = None  # the recall tool is declared: its rounds are answered here
    held: list[str] = field(default_factory=list)  # opening events not yet relayed
    output_started: bool = False
    retried: bool = False


Prepare = Callable[[dict[str, Any], str], Awaitable[WsTurn]]


def handshake_headers(incoming: CIMultiDict[str] | Any, base: CIMultiDict[str]) -> CIMultiDict[str]:
    """The forwarded request headers (`base`, already filtered) minus the WebSocket handshake's."""
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in base.items():
        if k.lower() not in _HANDSHAKE:
            out.add(k, v)
    return out


def ws_error(err: errors.ProxyError) -> str:
    """OpenAI's WebSocket error event: the HTTP status it stands for and the error object."""
    return orjson.dumps({"type": "error", "status": err.status, "error": {
        "type": err.type, "code": err.code, "message": err.message, "param": err.param}}).decode()


def with_report(ev: dict[str, Any], data: str, report: dict[str, str] | None) -> str:
    """A `response.created` event with the turn's x-compaction-* report added to its response's
    `metadata` (a string map every client parses; Codex reads nothing of that event's body).
    Any other event, or no report: the upstream's bytes as they came."""
    response = ev.get("response")
    if not report or ev["type"] != "response.created" or not isinstance(response, dict):
        return data
    metadata = response.get("metadata")
    metadata = {**metadata, **report} if isinstance(metadata, dict) else dict(report)
    return orjson.dumps({**ev, "response": {**response, "metadata": metadata}}).decode()


def _event(data: str) -> dict[str, Any] | None:
    try:
        ev = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return ev if isinstance(ev, dict) and isinstance(ev.get("type"), str) else None


def is_overflow_event(ev: dict[str, Any]) -> bool:
    if ev["type"] == "error":
        err = ev.get("error") if isinstance(ev.get("error"), dict) else ev
        return err.get("code") == OVERFLOW_CODE
    return ev["type"] == "response.failed" and is_overflow_failure(ev.get("response"))


async def relay_websocket(
    request: web.Request,
    session: aiohttp.ClientSession,
    url: str,
    headers: CIMultiDict[str],
    prepare: Prepare,
    max_msg_size: int,
    limits: SocketLimits | None = None,
) -> web.StreamResponse:
    """`session`: the pool of upstream sockets (apart from the one HTTP requests use)."""
    limits = limits if limits is not None else SocketLimits()
    limits.take()
    try:
        return await _relay_held(request, session, url, headers, prepare, max_msg_size, limits)
    finally:
        limits.give_back()


async def _relay_held(request: web.Request, session: aiohttp.ClientSession, url: str, headers: CIMultiDict[str],
                      prepare: Prepare, max_msg_size: int, limits: SocketLimits) -> web.StreamResponse:
    protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    try:
        upstream = await session.ws_connect(url, headers=headers, protocols=protocols, max_msg_size=max_msg_size,
                                            autoping=True)
    except aiohttp.WSServerHandshakeError as e:
        raise errors.ProxyError(e.status if e.status >= 400 else 502,
                                f"The upstream refused the WebSocket ({e.status} {e.message}).",
                                type="upstream_error" if e.status >= 500 or e.status < 400 else "invalid_request_error",
                                code="websocket_refused") from None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise map_client_error(e) from None
    client = web.WebSocketResponse(protocols=[upstream.protocol] if upstream.protocol else (),
                                   max_msg_size=max_msg_size, autoping=True)
    try:
        await client.prepare(request)
    except Exception:
        await upstream.close()
        raise
    turns: deque[WsTurn] = deque()
    relay = _Relay(client, upstream, turns, Inbox(limits.read_ahead_bytes, limits.read_ahead))
    down = relay.down = asyncio.create_task(relay.downstream())
    watch = asyncio.create_task(relay.close_when_idle(limits.idle_timeout_s)) if limits.idle_timeout_s else None
    try:
        await relay.upstream_side(prepare)
    finally:
        for task in (down, watch):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if not upstream.closed:
            await upstream.close()
    return client


class _Relay:
    def __init__(self, client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse,
                 turns: deque[WsTurn], inbox: Inbox) -> None:
        self.client = client
        self.inbox = inbox  # the client's messages read ahead of the sender
        self.upstream = upstream
        self.turns = turns
        self.send_lock = asyncio.Lock()  # client messages, retries and continuations go up one at a time
        self.down: asyncio.Task[None] | None = None  # the downstream task
        self.idle = asyncio.Event()  # no recall turn under way: the client's next message may go up
        self.idle.set()
        self.last_message = asyncio.get_running_loop().time()  # either way

    async def upstream_side(self, prepare: Prepare) -> None:
        """Client -> upstream, in order; returns when the client is gone or the upstream closed."""
        code: int | None = None
        inbox = self.inbox
        sender = asyncio.create_task(self._sender(prepare, inbox))
        try:
            while not self.upstream.closed:
                msg = await self.client.receive()
                if msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                    # The code from the client's close frame (aiohttp's own reply to it reads 1000).
                    code = msg.data if msg.type == WSMsgType.CLOSE else None
                    break
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    self.last_message = asyncio.get_running_loop().time()
                    await inbox.put(msg)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await sender
            inbox.close()
        # The client closed (or went away): close the upstream with its code. The downstream
        # task stops reading first: aiohttp's receive, woken by a close from another task,
        # closes the socket itself with 1000 before the caller's code can go out.
        if self.down is not None and not self.down.done():
            self.down.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.down
        if not self.upstream.closed:
            await self.upstream.close(code=code if code and code not in _UNSENDABLE else 1000)

    async def close_when_idle(self, timeout_s: float) -> None:
        """Close the client's socket (1001, going away) once no message has passed either way for
        `timeout_s` with no turn under way; the relay then closes the upstream's (its pooled
        connection freed). Pings do not count: a client's keep-alive must not hold a socket forever."""
        loop = asyncio.get_running_loop()
        while True:
            left = self.last_message + timeout_s - loop.time()
            if left > 0:
                await asyncio.sleep(left)
            elif self.turns or self.inbox.pending or not self.idle.is_set():
                self.last_message = loop.time()  # a turn under way: the upstream's own timeouts govern it
            else:
                log.info("closing a WebSocket idle for %g s", timeout_s)
                await self.client.close(code=GOING_AWAY, message=b"idle timeout")
                return

    async def _sender(self, prepare: Prepare, inbox: Inbox) -> None:
        """The client's messages upstream, in order, each once no recall turn is under way."""
        while True:
            msg = await inbox.get()
            try:
                await self._send_one(prepare, msg)
            finally:
                inbox.done()

    async def _send_one(self, prepare: Prepare, msg: aiohttp.WSMessage) -> None:
        await self.idle.wait()
        if msg.type == WSMsgType.BINARY:
            async with self.send_lock:
                self.turns.append(WsTurn("", expects_reply=True))
                await self.upstream.send_bytes(msg.data)
            return
        ev = await offload.sized(len(msg.data), _event, msg.data)
        if ev is not None and ev["type"] == "response.create":
            try:
                turn = await prepare(ev, msg.data)
            except errors.Uncompactable:  # the upstream's to judge: the message goes as it came
                turn = WsTurn(msg.data)
            except errors.ProxyError as e:  # the client's mistake: answered on the socket
                await self._to_client(ws_error(e))
                return
            except Exception:  # a bug of ours never costs the client its message
                log.exception("preparing a WebSocket turn failed unexpectedly; forwarding it unchanged")
                turn = WsTurn(msg.data)
        else:
            turn = WsTurn(msg.data)
        if turn.recall is not None:
            self.idle.clear()
        await self._send_up(turn)

    async def _send_up(self, turn: WsTurn) -> None:
        async with self.send_lock:
            self.turns.append(turn)
            try:
                await self.upstream.send_str(turn.message)
            except (ConnectionResetError, aiohttp.ClientError):
                pass  # the downstream side sees the upstream gone and tells the client

    async def _to_client(self, data: str) -> bool:
        if self.client.closed:
            return False
        try:
            await self.client.send_str(data)
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return False
        return True

    async def downstream(self) -> None:
        """Upstream -> client, in order, until either side closes."""
        while True:
            msg = await self.upstream.receive()
            self.last_message = asyncio.get_running_loop().time()
            if msg.type == WSMsgType.TEXT:
                ev = _event(msg.data)
                if ev is None:
                    log.warning("upstream WebSocket sent a message that is not a Responses event")
                    await self._fail(errors.upstream_bad_response("a WebSocket message is not a Responses event"))
                    return
                if not await self._on_event(ev, msg.data):
                    return
            elif msg.type == WSMsgType.BINARY:
                if not self.client.closed:
                    await self.client.send_bytes(msg.data)
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                code = self.upstream.close_code
                if msg.type == WSMsgType.CLOSE and code is not None and code not in _UNSENDABLE:
                    if not self.client.closed:
                        await self.client.close(code=code, message=(msg.extra or "").encode()[:120])
                    return
                if self.client.closed:
                    return
                await self._fail(errors.upstream_unreachable("the upstream WebSocket closed without a close frame"))
                return

    async def _fail(self, err: errors.ProxyError) -> None:
        await self._to_client(ws_error(err))
        if not self.client.closed:
            await self.client.close(code=ABNORMAL)
        if not self.upstream.closed:
            await self.upstream.close(code=ABNORMAL)

    async def _on_event(self, ev: dict[str, Any], data: str) -> bool:
        """One upstream event; False when the relay is over."""
        turn = self.turns[0] if self.turns else None
        if turn is None:
            return await self._to_client(data)
        etype = ev["type"]
        end = etype in END_EVENTS or etype == "error"
        if not turn.output_started and is_overflow_event(ev) and turn.retry is not None and not turn.retried:
            turn.retried = True
            try:
                again = await turn.retry()
            except Exception:
                log.exception("compacting for the WebSocket overflow retry failed unexpectedly")
                again = None
            if again is not None:
                log.info("upstream rejected a WebSocket request for length; retrying compacted")
                turn.held.clear()
                turn.message, turn.report = again
                async with self.send_lock:
                    await self.upstream.send_str(turn.message)
                return True
        if turn.recall is not None:
            return await self._recall_event(turn, turn.recall, ev, data)
        data = with_report(ev, data, turn.report)
        if not turn.output_started and etype in PREAMBLE and not end:
            turn.held.append(data)
            return True
        turn.output_started = True
        for held in turn.held:
            if not await self._to_client(held):
                return False
        turn.held.clear()
        if end:
            self.turns.popleft()
            if turn.done is not None:
                turn.done(ev)
        return await self._to_client(data)

    async def _recall_event(self, turn: WsTurn, recall: SocketRecall, ev: dict[str, Any], data: str) -> bool:
        """One upstream event of a recall turn; False when the relay is over."""
        etype = ev["type"]
        if etype == "error":  # the upstream refused a round: the turn ends with its error
            await self._end_recall(turn, recall, ev)
            return await self._to_client(data)
        if etype not in PREAMBLE:
            turn.output_started = True
        for out in recall.take(ev):
            if not await self._to_client(out):
                return False
        if etype not in END_EVENTS:
            return True
        try:
            again = await recall.next_round()
        except Exception:
            log.exception("answering recall calls on a WebSocket turn failed unexpectedly; ending the turn")
            again = None
        if again is not None:
            async with self.send_lock:
                try:
                    await self.upstream.send_str(again)
                except (ConnectionResetError, aiohttp.ClientError):
                    pass  # this task sees the upstream gone and tells the client
            return True
        closing = recall.closing()
        await self._end_recall(turn, recall, _event(closing[-1]) if closing else None)
        for out in closing:
            if not await self._to_client(out):
                return False
        return True

    async def _end_recall(self, turn: WsTurn, recall: SocketRecall, last: dict[str, Any] | None) -> None:
        """A recall turn is over (`last`: its end event as the client gets it): what the route keeps
        of it, and the client's next message may go."""
        self.turns.popleft()
        if turn.done is not None:
            turn.done(last)
        try:
            if recall.finish is not None:
                await recall.finish(recall)
        except Exception:
            log.exception("finishing a WebSocket recall turn failed unexpectedly")
        finally:
            self.idle.set()
