"""Slots for calls in flight: a global limit, and within it a limit per credential scope, so one
tenant's slow calls never hold every slot (the others' calls take the slots left)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import AsyncIterator


class ScopedSlots:
    def __init__(self, total: int, per_scope: int) -> None:
        self.total = asyncio.Semaphore(total)
        self.per_scope = min(per_scope, total)
        self._scopes: dict[str | None, tuple[asyncio.Semaphore, list[int]]] = {}  # scope -> (its slots, users)

    @contextlib.asynccontextmanager
    async def slot(self, scope: str | None) -> AsyncIterator[None]:
        """One call's slot: its scope's first (a scope at its limit waits without holding a
        global slot), then the global one. A scope's entry lives while someone holds or waits."""
        own, users = self._scopes.setdefault(scope, (asyncio.Semaphore(self.per_scope), [0]))
        users[0] += 1
        try:
            async with own, self.total:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._scopes[scope]

    def scopes(self) -> int:
        """Scopes holding or waiting for a slot now."""
        return len(self._scopes)
