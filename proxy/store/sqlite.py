"""SQLite store: the embedded default, one file, no server.

sqlite3 calls block, so every one of them runs on a single dedicated worker thread that owns the
only connection: the event loop never waits on disk and the connection never crosses threads.
The connection is opened lazily and dropped after any error, so a store whose file was
unreachable recovers by itself once it is reachable again.

A key's own TTL is `expires_at - last_used` (both are set together), which lets a read extend
each key by its own TTL (locks use a shorter one than records) without storing it separately.

Originals (keys `orig:...`) are kv rows like any other; their index lives beside them: an FTS5
table without content of its own (the text is the kv value, indexed once) and a table of exact
identifiers, both tied to the row through `orig_doc`. Triggers on kv keep the index in step with
every way a row goes (delete, eviction, expiry sweep, overwrite), so it never outlives its row.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from .base import Clock, OriginalRow, Store, StoreUnavailable

T = TypeVar("T")

_CHUNK = 500  # keys per `IN (...)`: well under SQLite's limit on bound parameters
_BUSY_TIMEOUT_S = 5.0  # another process writing the same file; waits on the worker, not the loop
_SWEEP_INTERVAL_S = 60.0

# The number of expiring keys is kept by triggers: counting the rows after each write would
# scan the table (milliseconds at 100k records) where a one-row update costs microseconds.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL,
    expires_at REAL,
    last_used REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS kv_last_used ON kv (last_used) WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS kv_count (expiring INTEGER NOT NULL);
INSERT INTO kv_count SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM kv_count);
CREATE TRIGGER IF NOT EXISTS kv_count_insert AFTER INSERT ON kv WHEN NEW.expires_at IS NOT NULL
BEGIN UPDATE kv_count SET expiring = expiring + 1; END;
CREATE TRIGGER IF NOT EXISTS kv_count_delete AFTER DELETE ON kv WHEN OLD.expires_at IS NOT NULL
BEGIN UPDATE kv_count SET expiring = expiring - 1; END;
CREATE TABLE IF NOT EXISTS log (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    at REAL NOT NULL,
    value BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS log_name_seq ON log (name, seq);
CREATE TRIGGER IF NOT EXISTS kv_count_update AFTER UPDATE OF expires_at ON kv
WHEN (OLD.expires_at IS NULL) != (NEW.expires_at IS NULL)
BEGIN UPDATE kv_count SET expiring = expiring + (NEW.expires_at IS NOT NULL) - (OLD.expires_at IS NOT NULL); END;
""" + """
CREATE TABLE IF NOT EXISTS orig_doc (id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS orig_ident (ident TEXT NOT NULL, doc INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS orig_ident_ident ON orig_ident (ident);
CREATE INDEX IF NOT EXISTS orig_ident_doc ON orig_ident (doc);
CREATE VIRTUAL TABLE IF NOT EXISTS orig_fts USING fts5(body, content='');
CREATE TRIGGER IF NOT EXISTS orig_delete AFTER DELETE ON kv WHEN OLD.key GLOB 'orig:*'
BEGIN
  INSERT INTO orig_fts (orig_fts, rowid, body)
    SELECT 'delete', id, CAST(OLD.value AS TEXT) FROM orig_doc WHERE key = OLD.key;
  DELETE FROM orig_ident WHERE doc = (SELECT id FROM orig_doc WHERE key = OLD.key);
  DELETE FROM orig_doc WHERE key = OLD.key;
END;
CREATE TRIGGER IF NOT EXISTS orig_update AFTER UPDATE OF value ON kv
WHEN OLD.key GLOB 'orig:*' AND OLD.value IS NOT NEW.value
BEGIN
  INSERT INTO orig_fts (orig_fts, rowid, body)
    SELECT 'delete', id, CAST(OLD.value AS TEXT) FROM orig_doc WHERE key = OLD.key;
  INSERT INTO orig_fts (rowid, body) SELECT id, CAST(NEW.value AS TEXT) FROM orig_doc WHERE key = OLD.key;
END;
"""

_UPSERT = """
INSERT INTO kv (key, value, expires_at, last_used) VALUES (?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE SET
    value = excluded.value, expires_at = excluded.expires_at, last_used = excluded.last_used
"""
# `add` replaces only an expired row; SQLite reports 0 changed rows when the WHERE refuses.
_ADD = _UPSERT + " WHERE kv.expires_at IS NOT NULL AND kv.expires_at <= ?"
_LIVE = "(expires_at IS NULL OR expires_at > ?)"


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    # No rollback here: on any error the worker closes the connection, which rolls back.
    conn.execute("BEGIN IMMEDIATE")
    yield
    conn.execute("COMMIT")


class SqliteStore(Store):
    indexes_words = True  # (FTS5)
    def __init__(
        self, path: str, *, ttl_s: float, max_records: int, clock: Clock = time.time
    ) -> None:
        super().__init__(ttl_s=ttl_s, max_records=max_records, clock=clock)
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-sqlite")
        self._conn: sqlite3.Connection | None = None  # touched only on the worker thread
        self._next_sweep = 0.0
        self._closed = False

    # -- worker thread ----------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
        except BaseException:
            conn.close()
            raise
        return conn

    def _drop(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def _work(self, fn: Callable[..., T], *args: object) -> T:
        try:
            if self._conn is None:
                self._conn = self._connect()
            return fn(self._conn, *args)
        except Exception:
            try:
                self._drop()
            except sqlite3.Error:
                pass  # the original error is the one worth reporting
            raise

    def _after_write(self, conn: sqlite3.Connection, now: float) -> None:
        """Evict least recently used expiring keys past max_records; sweep expired ones now and then."""
        (count,) = conn.execute("SELECT expiring FROM kv_count").fetchone()
        if count > self.max_records:
            conn.execute(
                "DELETE FROM kv WHERE key IN (SELECT key FROM kv WHERE expires_at IS NOT NULL"
                " ORDER BY last_used LIMIT ?)",
                (count - self.max_records,),
            )
        if now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_INTERVAL_S
            conn.execute("DELETE FROM kv WHERE expires_at <= ?", (now,))

    def _get_many(self, conn: sqlite3.Connection, keys: list[str], now: float) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        with _transaction(conn):
            for i in range(0, len(keys), _CHUNK):
                chunk = keys[i : i + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT key, value FROM kv WHERE key IN ({marks}) AND {_LIVE}", (*chunk, now)
                )
                found.update(rows)
                conn.execute(
                    f"UPDATE kv SET expires_at = ? + (expires_at - last_used), last_used = ?"
                    f" WHERE key IN ({marks}) AND expires_at > ?",
                    (now, now, *chunk, now),
                )
        return found

    def _put(
        self, conn: sqlite3.Connection, key: str, value: bytes, ttl_s: float | None, now: float
    ) -> None:
        expires_at = None if ttl_s is None else now + ttl_s
        with _transaction(conn):
            conn.execute(_UPSERT, (key, value, expires_at, now))
            self._after_write(conn, now)

    def _add(
        self, conn: sqlite3.Connection, key: str, value: bytes, ttl_s: float | None, now: float
    ) -> bool:
        expires_at = None if ttl_s is None else now + ttl_s
        with _transaction(conn):
            stored = conn.execute(_ADD, (key, value, expires_at, now, now)).rowcount == 1
            if stored:
                self._after_write(conn, now)
        return stored

    def _append(self, conn: sqlite3.Connection, name: str, value: bytes, max_len: int, now: float) -> None:
        with _transaction(conn):
            conn.execute("INSERT INTO log (name, at, value) VALUES (?, ?, ?)", (name, now, value))
            conn.execute(
                "DELETE FROM log WHERE name = ? AND seq <= (SELECT seq FROM log WHERE name = ?"
                " ORDER BY seq DESC LIMIT 1 OFFSET ?)",
                (name, name, max_len),
            )
            conn.execute("DELETE FROM log WHERE name = ? AND at <= ?", (name, now - self.ttl_s))

    def _tail(self, conn: sqlite3.Connection, name: str, n: int, now: float) -> list[tuple[float, bytes]]:
        rows = conn.execute(
            "SELECT at, value FROM log WHERE name = ? AND at > ? ORDER BY seq DESC LIMIT ?",
            (name, now - self.ttl_s, n),
        ).fetchall()
        return [(at, bytes(v)) for at, v in reversed(rows)]

    def _put_originals(self, conn: sqlite3.Connection, rows: list[tuple[str, bytes, list[str]]], now: float) -> None:
        """Every row in one transaction: a commit (and the eviction's count) per original was most
        of a masking request's store time."""
        with _transaction(conn):
            for key, value, identifiers in rows:
                conn.execute("DELETE FROM kv WHERE key = ?", (key,))  # the trigger drops its old index
                conn.execute(_UPSERT, (key, value, now + self.ttl_s, now))
                doc = conn.execute("INSERT INTO orig_doc (key) VALUES (?)", (key,)).lastrowid
                # the same expression as the triggers' 'delete': FTS5 must be told the very text it indexed
                conn.execute("INSERT INTO orig_fts (rowid, body) VALUES (?, CAST(? AS TEXT))", (doc, value))
                conn.executemany("INSERT INTO orig_ident (ident, doc) VALUES (?, ?)", [(i, doc) for i in identifiers])
            self._after_write(conn, now)

    def _find_originals(
        self, conn: sqlite3.Connection, prefix: str, words: list[str], identifiers: list[str], limit: int, now: float
    ) -> list[str]:
        upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        live = "d.key >= ? AND d.key < ? AND (kv.expires_at IS NULL OR kv.expires_at > ?)"
        found: list[str] = []
        for i in range(0, len(identifiers), _CHUNK):
            chunk = identifiers[i : i + _CHUNK]
            rows = conn.execute(
                "SELECT d.key FROM orig_ident x JOIN orig_doc d ON d.id = x.doc JOIN kv ON kv.key = d.key"
                f" WHERE x.ident IN ({','.join('?' * len(chunk))}) AND {live}"
                " GROUP BY d.key ORDER BY count(*) DESC, max(kv.last_used) DESC LIMIT ?",
                (*chunk, prefix, upper, now, limit),
            )
            found += [k for (k,) in rows if k not in found]
        if words and len(found) < limit:
            query = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
            rows = conn.execute(
                "SELECT d.key FROM orig_fts JOIN orig_doc d ON d.id = orig_fts.rowid JOIN kv ON kv.key = d.key"
                f" WHERE orig_fts MATCH ? AND {live} ORDER BY bm25(orig_fts) LIMIT ?",
                (query, prefix, upper, now, limit),
            )
            found += [k for (k,) in rows if k not in found]
        return found[:limit]

    def _delete(
        self, conn: sqlite3.Connection, key: str, expected: bytes | None, now: float
    ) -> bool:
        # An expired row is already gone as far as callers can tell; the sweep removes it.
        if expected is None:
            cur = conn.execute(f"DELETE FROM kv WHERE key = ? AND {_LIVE}", (key, now))
        else:
            cur = conn.execute(
                f"DELETE FROM kv WHERE key = ? AND value = ? AND {_LIVE}", (key, expected, now)
            )
        return cur.rowcount == 1

    # -- event loop -------------------------------------------------------------------------

    async def _submit(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except (sqlite3.Error, OSError) as e:
            raise StoreUnavailable(f"sqlite: {type(e).__name__}: {e}") from e

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        if self._closed:
            raise StoreUnavailable("sqlite store is closed")
        return await self._submit(self._work, fn, *args)

    async def get_many(self, keys: list[str]) -> dict[str, bytes]:
        if not keys:
            return {}
        return await self._run(self._get_many, list(keys), self.clock())

    async def peek(self, key: str) -> bytes | None:
        def value(conn: sqlite3.Connection, now: float) -> bytes | None:
            row = conn.execute(f"SELECT value FROM kv WHERE key = ? AND {_LIVE}", (key, now)).fetchone()
            return None if row is None else row[0]

        return await self._run(value, self.clock())

    async def put(self, key: str, value: bytes, ttl_s: float | None = ...) -> None:  # type: ignore[assignment]
        await self._run(self._put, key, value, self._ttl(ttl_s), self.clock())

    async def add(self, key: str, value: bytes, ttl_s: float | None = ...) -> bool:  # type: ignore[assignment]
        return await self._run(self._add, key, value, self._ttl(ttl_s), self.clock())

    async def delete(self, key: str, expected: bytes | None = None) -> bool:
        return await self._run(self._delete, key, expected, self.clock())

    async def scan(self, prefix: str) -> dict[str, bytes]:
        def rows(conn: sqlite3.Connection, now: float) -> dict[str, bytes]:
            # A range on the primary key, not LIKE: keys may hold `%` or `_`.
            upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            cur = conn.execute(f"SELECT key, value FROM kv WHERE key >= ? AND key < ? AND {_LIVE}", (prefix, upper, now))
            return dict(cur.fetchall())

        return await self._run(rows, self.clock())

    async def put_original(self, key: str, value: bytes, identifiers: Sequence[str],
                           words: Sequence[str] | None = None) -> None:  # (FTS5 reads its words)
        await self.put_originals([OriginalRow(key, value, identifiers, words)])

    async def put_originals(self, rows: Sequence[OriginalRow]) -> None:
        if any(not r.key.startswith("orig:") for r in rows):
            raise ValueError("an original's key starts with 'orig:'")
        if rows:
            await self._run(self._put_originals, [(r.key, r.value, list(dict.fromkeys(r.identifiers))) for r in rows],
                            self.clock())

    async def find_originals(
        self, prefix: str, words: Sequence[str], identifiers: Sequence[str], limit: int
    ) -> list[str]:
        if not prefix or limit <= 0 or not (words or identifiers):
            return []
        return await self._run(self._find_originals, prefix, list(dict.fromkeys(words)),
                               list(dict.fromkeys(identifiers)), limit, self.clock())

    async def append(self, name: str, value: bytes, max_len: int) -> None:
        await self._run(self._append, name, value, max_len, self.clock())

    async def tail(self, name: str, n: int) -> list[tuple[float, bytes]]:
        if n <= 0:
            return []
        return await self._run(self._tail, name, n, self.clock())

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._submit(self._drop)  # not through _work: closing must not open the file
        finally:
            self._executor.shutdown(wait=False)
