"""Redis Cluster (or Valkey's) as the store: the Redis store's scripts, one hash slot per script.

A cluster runs a script only on keys of one slot, so every key lives in the namespace of its
group, hash-tagged: `<ns>{<group>}k:<key>`, with the group's own bookkeeping `<ns>{<group>}lru` and
`<ns>{<group>}ttl` and, for originals, its recall index `<ns>{<group>}ix:...` and
`<ns>{<group>}ixk:<key>`. The group of a key is everything before its last `:`: a scope's summaries
(`sum:<scope>`), a scope's originals (`orig:<scope>`: the recall index a search reads whole), one
tool call's notes, a summary's lock. So the scripts are the single-Redis ones, unchanged, and:

- `store.max_records` bounds each group, not the whole store (no script may count keys of two
  slots); the whole is bounded by the TTLs (every key, and every group's bookkeeping, carries a
  native expiry) and by the cluster's own `maxmemory` (design.md § The store);
- a read of keys of several groups is one script per group;
- the journal is one list (one slot), as on one Redis.

URL: `redis+cluster://[user:password@]host:port[,host:port...][/]` (`rediss+cluster://` for TLS),
the hosts being seed nodes: the client learns the rest of the cluster from them.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from .base import StoreUnavailable
from .redis import RedisStore

SCHEMES = ("redis+cluster://", "rediss+cluster://")


def group_tag(key: str) -> str:
    """The hash tag of `key`'s group: what precedes its last `:` ('-' for none). Braces become
    parentheses, so the tag is never empty and never ends early (either would split a group)."""
    group = key[: key.rfind(":")] if ":" in key else ""
    return group.replace("{", "(").replace("}", ")") or "-"


def parse_cluster_url(url: str) -> dict[str, Any]:
    """Seed nodes and credentials of a `redis+cluster://` URL. ValueError (not echoing the URL:
    it may carry a password) when it names no host:port."""
    scheme, rest = url.split("://", 1)
    netloc = rest.split("/", 1)[0]
    userinfo, _, hosts = netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    nodes = []
    for hostport in filter(None, hosts.split(",")):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("a redis+cluster:// URL lists its seed nodes as host:port[,host:port...]")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    if not nodes:
        raise ValueError("a redis+cluster:// URL needs at least one seed node host:port")
    return {"startup_nodes": nodes, "username": unquote(user) or None,
            "password": unquote(password) or None, "ssl": scheme == "rediss+cluster"}


class _Cluster(RedisCluster):
    # Retried (once, at once): a connection error, what a restarted node's pooled connections give.
    # Not a cluster that is down (the client waits 0.25 s before failing each such attempt), nor a
    # timeout (it would double): those are an outage, answered by going on without the store.
    ERRORS_ALLOW_RETRY = (RedisConnectionError,)


class RedisClusterStore(RedisStore):
    # The cluster client's own failures (no node reachable, a slot nobody serves) are no RedisError.
    errors = (*RedisStore.errors, RedisClusterException)

    def _connect(self, url: str) -> Any:
        # As on one Redis: short timeouts, one immediate retry. Not the client's default of
        # three retries with backoff: a dead node would cost every call all of them before the
        # proxy goes on without the store.
        return _Cluster(
            **parse_cluster_url(url),
            socket_connect_timeout=1.0,
            socket_timeout=2.0,
            retry=Retry(NoBackoff(), 1),
        )

    def _space(self, key: str) -> str:
        return f"{self._ns}{{{group_tag(key)}}}"

    async def ping(self) -> None:
        """Every primary answers: a cluster missing one serves none of its slots (nor, with
        cluster-require-full-coverage, the default, any other)."""
        try:
            await self._redis.ping(target_nodes=RedisCluster.PRIMARIES)
        except self.errors as e:
            raise StoreUnavailable(f"redis cluster: {type(e).__name__}: {e}") from e
