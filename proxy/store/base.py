"""The store interface: a small key-value contract that every backend implements.

Values are opaque bytes (records are serialized by their owners). Every backend gives the same
guarantees, which tests/store/test_store_contract.py checks against all three:

- `ttl_s` None means permanent (never expires, never evicted: the scope secret); otherwise the key
  expires `ttl_s` after its last use, and a read (`get`/`get_many`) counts as a use and refreshes it;
  `peek` reads without using: a lock's waiters look at it that way, so that their polling does not
  keep a lock alive whose holder stopped writing it;
- at most `max_records` expiring keys are kept; past that the least recently used are evicted;
- `add` is set-if-absent (locks, the generated secret); `delete(key, expected)` deletes only while
  the value is still `expected` (releasing a lock one still holds);
- logs (the journal of compaction events) are a second, separate namespace: `append(name, value,
  max_len)` adds an entry stamped with the clock and keeps the newest `max_len`; an entry expires
  `ttl_s` after it was appended (reads do not refresh it); `tail(name, n)` is the newest n live
  entries, oldest first. Logs do not count towards `max_records`;
- originals (what compaction replaced, kept for recall: design.md § Recall) are expiring keys like any
  other (same TTL, refreshed by reads, counted in `max_records`, evicted least recently used),
  written by `put_original` with an index: their identifiers exactly, the words of their value
  for search. `find_originals(prefix, ...)` returns live keys under one prefix only (the prefix
  holds the credential scope), so an index never leads from one scope to another's originals.
  The index of an original goes with it (eviction, expiry, delete, overwrite).
Time comes from an injectable `clock` so expiry is testable without sleeping.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from typing import Callable, NamedTuple, Sequence

from proxy import offload
from proxy.farm import farm
from proxy.identifiers import scanned

Clock = Callable[[], float]


class OriginalRow(NamedTuple):
    """What put_original stores: the key, the value, its identifiers and (or None) its words."""

    key: str
    value: bytes
    identifiers: Sequence[str]
    words: Sequence[str] | None = None


class StoreUnavailable(Exception):
    """The backend cannot be reached or written; callers carry on without reuse."""


class Store(ABC):
    # The backend finds an original's words in its value itself (SQLite's FTS5): a caller need not
    # work them out for put_original.
    indexes_words = False
    def __init__(self, *, ttl_s: float, max_records: int, clock: Clock = time.time) -> None:
        self.ttl_s = ttl_s
        self.max_records = max_records
        self.clock = clock

    @abstractmethod
    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        """Values of the keys that exist (missing ones absent); refreshes their expiry."""

    async def get(self, key: str) -> bytes | None:
        return (await self.get_many([key])).get(key)

    @abstractmethod
    async def peek(self, key: str) -> bytes | None:
        """The value of a live key, or None; neither refreshes its expiry nor counts as a use."""

    @abstractmethod
    async def put(self, key: str, value: bytes, ttl_s: float | None = ...) -> None:  # type: ignore[assignment]
        """Store a value. `ttl_s` defaults to the store's TTL; None means permanent."""

    @abstractmethod
    async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
        """Store only if absent (or expired); True when this call stored it."""

    @abstractmethod
    async def delete(self, key: str, expected: bytes | None = None) -> bool:
        """Delete; with `expected`, only while the stored value equals it. True when deleted."""

    async def scan(self, prefix: str) -> dict[str, bytes]:
        """Live keys starting with `prefix` and their values, where the backend can list them
        cheaply (SQLite); {} elsewhere. For start-up housekeeping only, never on a request."""
        return {}

    @abstractmethod
    async def put_original(self, key: str, value: bytes, identifiers: Sequence[str],
                           words: Sequence[str] | None = None) -> None:
        """Store an original (an expiring key with the store's TTL) and index it: `identifiers`
        exactly, the words of `value` (UTF-8 text) for search: `words` when the caller knows them
        already (index_words of the value; a backend that indexes its text itself ignores them)."""

    async def put_originals(self, rows: Sequence[OriginalRow]) -> None:
        """put_original of each row: a backend that can writes them all at once (SQLite: one
        transaction; a request that masks keeps tens of originals)."""
        for row in rows:
            await self.put_original(row.key, row.value, row.identifiers, row.words)

    @abstractmethod
    async def find_originals(
        self, prefix: str, words: Sequence[str], identifiers: Sequence[str], limit: int
    ) -> list[str]:
        """Keys of live originals under `prefix` (everything up to the last `:` of their keys) that carry one of `identifiers` exactly or one of
        `words` (lower case, as `index_words` cuts them), best first: identifier matches, then by
        how well the words match; at most `limit`. Reads nothing else and refreshes nothing."""

    @abstractmethod
    async def append(self, name: str, value: bytes, max_len: int) -> None:
        """Add an entry to the end of log `name`; keep its newest `max_len` entries."""

    @abstractmethod
    async def tail(self, name: str, n: int) -> list[tuple[float, bytes]]:
        """The newest `n` live entries of log `name` as (time appended, value), oldest first."""

    async def ping(self) -> None:
        """Raise StoreUnavailable when the backend is down."""

    async def close(self) -> None:
        return None

    def _ttl(self, ttl_s: float | None) -> float | None:
        return self.ttl_s if ttl_s is ... else ttl_s


_WORD = re.compile(r"[^\W_]+")
MAX_WORD_CHARS = 64  # longer runs (base64, minified code) are no words anyone searches for


def index_words(text: str) -> list[str]:
    """The distinct words of a text as every backend indexes them: runs of letters and digits,
    lower-cased (what SQLite FTS5's default tokenizer keeps, near enough; `max_conn` is two)."""
    seen: dict[str, None] = {}
    for word in dict.fromkeys(_WORD.findall(text)):  # each distinct word once: a repeat adds nothing
        w = word.lower()
        if len(w) <= MAX_WORD_CHARS:
            seen.setdefault(w, None)
    return list(seen)


def _value_words(value: bytes) -> list[str]:
    part = scanned(value.decode("utf-8", "replace"))  # a huge original: its head and tail
    return farm.sized(len(part), index_words, part)


async def value_words(value: bytes) -> list[str]:
    """index_words of a stored value: off the event loop for a large one (an original of megabytes
    is a second of scanning)."""
    return await offload.sized(len(value) * offload.SCAN_WEIGHT, _value_words, value)
