"""A circuit breaker for a summarizer that keeps failing (spec 5).

`failures` consecutive failures open it for `cooldown_s`; then one trial call is let through
(half-open); its success closes the breaker, its failure opens it again. The clock is injectable.
"""

from __future__ import annotations

import time
from typing import Callable


class CircuitBreaker:
    def __init__(self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures = failures
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self._trial = False

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() - self.opened_at >= self.cooldown_s else "open"

    def allow(self) -> bool:
        """May a call go out now? In half-open state only one call is let through."""
        state = self.state
        if state == "closed":
            return True
        if state == "half-open" and not self._trial:
            self._trial = True
            return True
        return False

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self._trial = False

    def failure(self) -> None:
        self.failures += 1
        if self._trial or self.failures >= self.max_failures:
            self.opened_at = self.clock()
            self._trial = False
