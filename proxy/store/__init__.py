"""Key-value storage for summaries, the scope secret and locks (design.md § The store).

`open_store` picks the backend from `store.url`; wrap the result in `ResilientStore` so that an
unreachable backend never fails a request.
"""

from __future__ import annotations

import time

from .base import Clock, Store, StoreUnavailable
from .memory import MemoryStore
from .redis import RedisStore
from .redis_cluster import SCHEMES as CLUSTER_SCHEMES
from .redis_cluster import RedisClusterStore
from .sqlite import SqliteStore

__all__ = ["Store", "StoreUnavailable", "open_store"]


def open_store(url: str, *, ttl_s: float, max_records: int, clock: Clock = time.time) -> Store:
    """The backend for `url`; nothing is connected or created until the first call.

    `sqlite:///rel/path` is relative to the working directory, `sqlite:////abs/path` absolute.
    Raises ValueError for an unsupported URL, without echoing it (it may carry a password).
    """
    if url == "memory://":
        return MemoryStore(ttl_s=ttl_s, max_records=max_records, clock=clock)
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path:
            raise ValueError("store URL sqlite:/// needs a file path")
        return SqliteStore(path, ttl_s=ttl_s, max_records=max_records, clock=clock)
    if url.startswith(CLUSTER_SCHEMES):
        return RedisClusterStore(url, ttl_s=ttl_s, max_records=max_records, clock=clock)
    if url.startswith(("redis://", "rediss://")):
        return RedisStore(url, ttl_s=ttl_s, max_records=max_records, clock=clock)
    scheme = url.split("://", 1)[0] if "://" in url else "(none)"
    raise ValueError(
        f"unsupported store URL scheme {scheme!r}: use memory://, sqlite:///path, redis://host:port/db or "
        "redis+cluster://host:port[,host:port...]"
    )
