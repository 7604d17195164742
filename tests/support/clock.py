"""An injectable clock for tests of expiry, cool-downs and breakers: time moves only when told."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
