"""Digests that identify messages, conversation prefixes and credential scopes.

A message's digest is over its canonical JSON (sorted keys), so two requests carrying the same
message give the same digest whatever order the client wrote its keys in. A prefix is identified by
a hash chain over its messages' digests: chain[i] covers messages[0:i].

Hashing a long history on every request is the hot path's largest cost, so each message also gets a
cheap in-process key (Python's keyed hash of its JSON): token counts and stable digests are cached
by it, and a stable digest is computed once per distinct message, not once per request.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections import OrderedDict
from typing import Any, Callable, Sequence

from proxy import jsonbody

_DIGEST_SIZE = 16


def message_digest(msg: Any) -> bytes:
    return hashlib.sha256(jsonbody.dumps(msg, sort_keys=True)).digest()[:_DIGEST_SIZE]


def message_keys(messages: Sequence[Any]) -> tuple[list[int], list[int]]:
    """A fast in-process key for each message (never stored, never shared between processes: the
    hash is keyed per process, so nobody can craft collisions), and the size of its JSON (how much
    work counting it is)."""
    keys, sizes = [], []
    for m in messages:
        raw = jsonbody.dumps(m)
        keys.append(hash(raw))
        sizes.append(len(raw))
    return keys, sizes


# Digests cached per process, one per distinct message: 130-230 bytes an entry, so at most
# about 8 MiB (like the token counts, tokens.CACHE_SIZE).
DIGEST_CACHE_SIZE = 32_768


class DigestCache:
    """Stable digests by in-process key, bounded (the oldest entry evicted first: a hit does not
    refresh it, which would cost the hot path a reordering per message). `canonical` leaves out
    what is not content before digesting (a protocol's cache markers); a cache with one has keys
    of its own."""

    def __init__(self, size: int = DIGEST_CACHE_SIZE, canonical: Callable[[Any], Any] | None = None) -> None:
        self._d: OrderedDict[int, bytes] = OrderedDict()
        self._size = size
        self._digest = message_digest if canonical is None else (lambda msg: message_digest(canonical(msg)))

    def digest(self, msg: Any, key: int) -> bytes:
        """One message's digest (the conversation's first: it names the conversation); a
        message seen before costs a lookup."""
        digest = self._d.get(key)
        if digest is None:
            digest = self._d[key] = self._digest(msg)
            if len(self._d) > self._size:
                self._d.popitem(last=False)
        return digest

    def digests(self, messages: Sequence[Any], keys: Sequence[int]) -> list[bytes]:
        out = []
        d = self._d
        for msg, key in zip(messages, keys):
            digest = d.get(key)
            if digest is None:
                digest = d[key] = self._digest(msg)
                if len(d) > self._size:
                    d.popitem(last=False)
            out.append(digest)
        return out


def content_digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=_DIGEST_SIZE).hexdigest()


def hash_chain(digests: Sequence[bytes], known: Sequence[bytes] | None = None) -> list[bytes]:
    """chain[0] is the empty prefix; chain[i] identifies digests[0:i]. `known`: the chain of
    digests this list starts with (chain[0:len(known)]), continued instead of made again."""
    if known:
        out = list(known[:len(digests) + 1])
        h = out[-1]
        for d in digests[len(out) - 1:]:
            h = hashlib.sha256(h + d).digest()[:_DIGEST_SIZE]
            out.append(h)
        return out
    out = [b"\x00" * _DIGEST_SIZE]
    h = out[0]
    for d in digests:
        h = hashlib.sha256(h + d).digest()[:_DIGEST_SIZE]
        out.append(h)
    return out


@functools.lru_cache(maxsize=4096)  # pure; every request of a conversation asks it the same (bounded)
def conversation_digest(scope: str, first_message_digest: bytes) -> str:
    """Names a conversation in the journal and the bill: its scope and the digest of its first
    message (the prepare slot tells conversations apart the same way)."""
    return hashlib.blake2b(scope.encode() + first_message_digest, digest_size=8).hexdigest()


# A client sends the same credential on every request: its HMAC (a few microseconds, most of the
# credential lookup) is worked out once. The cache lives in process memory only, as the request's
# own headers do, and is bounded.
@functools.lru_cache(maxsize=4096)
def credential_scope(secret: bytes, credential: str, session: str | None) -> str:
    """An HMAC of the client's credential (and optional session id): never the raw key."""
    msg = credential.encode("utf-8", "surrogatepass") + b"\x00" + (session or "").encode("utf-8", "surrogatepass")
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()[:32]
