"""The cool-down after a failed summary (design.md § Tiers)."""

from __future__ import annotations

from typing import Any


class Cooldown:
    """Conversations whose summary just failed: not retried on every request before `seconds`
    passed (each attempt can cost the client the summarizer's whole timeout)."""

    def __init__(self, seconds: float, clock: Any, size: int = 4096) -> None:
        self.seconds, self.clock, self.size = seconds, clock, size
        self._until: dict[str, float] = {}

    def active(self, k: str) -> bool:
        until = self._until.get(k)
        if until is None:
            return False
        if self.clock() < until:
            return True
        del self._until[k]
        return False

    def failed(self, k: str) -> None:
        if self.seconds <= 0:
            return
        self._until[k] = self.clock() + self.seconds
        while len(self._until) > self.size:
            self._until.pop(next(iter(self._until)))
