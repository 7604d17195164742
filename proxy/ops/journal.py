"""The journal: compaction events kept in the store (bounded by journal.max_events, expiring with
store.ttl_s), shared by replicas like the summaries themselves. Written off the request path; a
store that is down loses events, never a request."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict
from typing import Any

import orjson

from proxy.exchange import Exchange
from proxy.ops.hooks import CompactionEvent, Hooks
from proxy.store.base import Store

log = logging.getLogger("proxy.journal")

LOG_NAME = "journal"


class Journal(Hooks):
    def __init__(self, store: Store, max_events: int, bill: Any = None) -> None:
        self.store = store
        self.max_events = max_events
        self.bill = bill  # when set, each event carries its conversation's bill so far
        self._writes: set[asyncio.Task[None]] = set()

    def compaction(self, event: CompactionEvent) -> None:
        entry = asdict(event)
        if self.bill is not None:
            entry["bill"] = self.bill.conversation(event.conversation)
        self._add(entry)

    def prefix_break(self, ex: Exchange, at: int, tokens: int) -> None:
        """An entry of the journal's shape (tier `prefix-break`) naming the conversation."""
        self._add(asdict(CompactionEvent(
            time=time.time(), request_id=ex.request_id, scope="", conversation=ex.conversation, model=ex.model,
            tier="prefix-break", covered=0, messages=0, tokens_before=tokens, tokens_after=tokens, calls=0, wait_ms=0.0,
            reason=f"the forwarded request differs from the conversation's previous one from message {at + 1} on, "
                   "with no compaction in between (the provider's prompt cache is missed from there)",
            observed=ex.observed)))

    def _add(self, entry: dict[str, Any]) -> None:
        task = asyncio.get_running_loop().create_task(self._write(orjson.dumps(entry)))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, raw: bytes) -> None:
        try:
            await self.store.append(LOG_NAME, raw, self.max_events)
        except Exception:  # the resilient store swallows outages; anything else is a bug to see
            log.exception("writing a journal event failed")

    async def flush(self) -> None:
        """Wait for the writes under way (tests, shutdown)."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)

    async def recent(self, n: int) -> list[dict[str, Any]]:
        return await read_events(self.store, n)


async def read_events(store: Store, n: int) -> list[dict[str, Any]]:
    """The newest n events, newest first (entries that do not parse are skipped)."""
    out = []
    for _, raw in await store.tail(LOG_NAME, n):
        try:
            out.append(orjson.loads(raw))
        except orjson.JSONDecodeError:
            continue
    return out[::-1]
