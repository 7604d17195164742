"""Digests that identify messages, conversation prefixes and credential scopes (pure functions).

A message's digest is over its canonical JSON (sorted keys), so two requests carrying the same
message give the same digest whatever order the client wrote its keys in. A prefix is identified by
a hash chain over its messages' digests: chain[i] covers messages[0:i].
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Sequence

import orjson

_DIGEST_SIZE = 16


def message_digest(msg: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(msg, option=orjson.OPT_SORT_KEYS), digest_size=_DIGEST_SIZE).digest()


def content_digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=_DIGEST_SIZE).hexdigest()


def hash_chain(digests: Sequence[bytes]) -> list[bytes]:
    """chain[0] is the empty prefix; chain[i] identifies digests[0:i]."""
    out = [b"\x00" * _DIGEST_SIZE]
    h = out[0]
    for d in digests:
        h = hashlib.blake2b(h + d, digest_size=_DIGEST_SIZE).digest()
        out.append(h)
    return out


def credential_scope(secret: bytes, credential: str, session: str | None) -> str:
    """An HMAC of the client's credential (and optional session id): never the raw key."""
    msg = credential.encode("utf-8", "surrogatepass") + b"\x00" + (session or "").encode("utf-8", "surrogatepass")
    return hmac.new(secret, msg, hashlib.sha256).hexdigest()[:32]
