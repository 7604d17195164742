"""Counting honestly (design.md § Counting tokens; § Learning the token ratio): learn each model's ratio between the upstream's prompt count
and the proxy's tiktoken count, from the `usage` of its answers.

Models whose tokenizer tiktoken lacks count differently (often 10-30% more); a threshold computed
on tiktoken's count would then let requests reach the upstream's window before the proxy compacts
them. The ratio is smoothed (one odd answer moves it a little), bounded to [0.5, 2] (a broken
`usage` cannot make the proxy compact everything or nothing), kept per model, and persisted in the
store so that restarts and replicas share it. The configured `models.<name>.token_ratio` is the
starting value until the first answer arrives.
"""

from __future__ import annotations

import asyncio
import logging

import orjson

from proxy.store.base import Store

log = logging.getLogger("proxy.ratio")

LOW, HIGH = 0.5, 2.0
ALPHA = 0.3  # weight of one new observation
MIN_TOKENS = 200  # smaller requests say more about the chat framing than about the tokenizer
SAVE_CHANGE = 0.01  # persist when the ratio moved this much since the last save
# Model names come from clients: past this many, a new name is neither looked up nor learned (it
# counts with its configured ratio), so names that never repeat cannot grow the process.
MAX_MODELS = 1024


def update_ratio(old: float | None, counted: int, reported: int, *, alpha: float = ALPHA) -> float | None:
    """The smoothed, bounded ratio after one answer; `old` unchanged when the answer says nothing."""
    if counted < MIN_TOKENS or reported <= 0:
        return old
    observed = reported / counted
    if not LOW <= observed <= HIGH:
        return old  # no tokenizer is that far off: a `usage` that says so is not a count of this request
    new = observed if old is None else (1 - alpha) * old + alpha * observed
    return min(HIGH, max(LOW, new))


class RatioLearner:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._ratios: dict[str, float] = {}
        self._saved: dict[str, float] = {}
        self._loaded: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @staticmethod
    def _key(model: str) -> str:
        return "ratio:" + model

    async def ratio(self, model: str, default: float) -> float:
        """The learned ratio of `model` (read from the store once per process), else `default`."""
        if model not in self._loaded and len(self._loaded) < MAX_MODELS:
            self._loaded.add(model)
            raw = await self.store.get(self._key(model))
            try:
                value = float(orjson.loads(raw)) if raw is not None else None
            except (orjson.JSONDecodeError, TypeError, ValueError):
                value = None
            if value is not None and LOW <= value <= HIGH and model not in self._ratios:
                self._ratios[model] = self._saved[model] = value
        return self._ratios.get(model, default)

    def observe(self, model: str, counted: int, reported: int) -> None:
        """One answer's `usage.prompt_tokens` against the proxy's unscaled count of what it sent."""
        new = update_ratio(self._ratios.get(model), counted, reported)
        if new is None or (model not in self._ratios and len(self._ratios) >= MAX_MODELS):
            return
        self._ratios[model] = new
        if abs(new - self._saved.get(model, 0.0)) >= SAVE_CHANGE:
            self._saved[model] = new
            task = asyncio.create_task(self._save(model, new), name=f"ratio-save:{model[:24]}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _save(self, model: str, value: float) -> None:
        try:
            await self.store.put(self._key(model), orjson.dumps(round(value, 4)), None)
        except Exception:  # a store outage costs the persistence, never the request
            log.debug("could not persist the token ratio of %s", model, exc_info=True)

    async def idle(self) -> None:
        """Wait for pending saves (tests, shutdown)."""
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
