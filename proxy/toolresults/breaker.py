"""A circuit breaker for a summarizer that keeps failing.

`failures` consecutive failures open it for `cooldown_s`; then one trial call is let through
(half-open); its success closes the breaker, its failure opens it again. The clock is injectable.
`Breakers` keeps one per key (credential scope, upstream, model), at most `cap` of them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Hashable

SEVERITY = {"closed": 0, "half-open": 1, "open": 2}


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


class Breakers:
    """One breaker per key, the least recently used dropped past `cap`: keys come from clients
    (every credential makes a scope), so their number is bounded here. A dropped breaker costs its
    scope at most `failures` calls more before it opens again."""

    def __init__(self, cap: int, make: Callable[[], CircuitBreaker]) -> None:
        self.cap = cap
        self.make = make
        self._by_key: OrderedDict[Hashable, CircuitBreaker] = OrderedDict()

    def get(self, key: Hashable) -> CircuitBreaker:
        b = self._by_key.get(key)
        if b is None:
            b = self._by_key[key] = self.make()
            while len(self._by_key) > self.cap:
                self._by_key.popitem(last=False)
        else:
            self._by_key.move_to_end(key)
        return b

    def peek(self, key: Hashable) -> CircuitBreaker | None:
        """The key's breaker if one is kept (none is made)."""
        return self._by_key.get(key)

    def __len__(self) -> int:
        return len(self._by_key)

    def states(self) -> list[tuple[str, str]]:
        """(model, state) per model (a key's last part), its most severe breaker's state."""
        worst: dict[str, str] = {}
        for key, b in self._by_key.items():
            model = key[-1] if isinstance(key, tuple) else str(key)
            state = b.state
            if SEVERITY[state] >= SEVERITY.get(worst.get(model, "closed"), 0):
                worst[model] = state
        return sorted(worst.items())
