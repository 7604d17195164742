"""A client WebSocket's messages read ahead of the relay's sender, bounded in count and in
(decoded) bytes: permessage-deflate makes a body-sized message a few kilobytes on the wire, so
only the decoded size says what a socket holds. Past either bound the socket is not read until the
sender takes a message (TCP then pushes back on the client); one message is always let in, so any
message up to the size limit goes through."""

from __future__ import annotations

import asyncio
from collections import deque

from aiohttp import WSMessage

from proxy.sockets import ReadAhead

MAX_MESSAGES = 64


def size_of(msg: WSMessage) -> int:
    data = msg.data
    return len(data) if isinstance(data, (str, bytes, bytearray)) else 0


class Inbox:
    def __init__(self, max_bytes: int, total: ReadAhead | None = None) -> None:
        self.max_bytes = max_bytes
        self.total = total if total is not None else ReadAhead()
        self.held = 0
        self.pending = 0  # messages taken in and not yet done with (queued or being sent up)
        self._items: deque[tuple[WSMessage, int]] = deque()
        self._changed = asyncio.Condition()

    def _full(self, size: int) -> bool:
        return bool(self._items) and (len(self._items) >= MAX_MESSAGES or self.held + size > self.max_bytes)

    async def put(self, msg: WSMessage) -> None:
        size = size_of(msg)
        async with self._changed:
            await self._changed.wait_for(lambda: not self._full(size))
            self._items.append((msg, size))
            self.held += size
            self.total.add(size)
            self.pending += 1
            self._changed.notify_all()

    async def get(self) -> WSMessage:
        async with self._changed:
            await self._changed.wait_for(lambda: bool(self._items))
            msg, size = self._items.popleft()
            self.held -= size
            self.total.add(-size)
            self._changed.notify_all()
            return msg

    def done(self) -> None:
        """The sender is through with a message it took."""
        self.pending -= 1

    def close(self) -> None:
        """The socket is over: what it still held leaves the process's count."""
        self.total.add(-self.held)
        self.held = 0
        self._items.clear()
