"""The prefix-break alarm: a forwarded request whose start differs from its conversation's
previous forwarded request, though no compaction happened in between. The provider's prompt cache
serves a request only up to where it differs from what it saw, so every such request is paid at
the full input price from there on; a rise of the count means the cache is being busted (by the
client rewriting its history, or by the proxy forwarding something different twice).

Each conversation keeps the fingerprints of its last forwarded request's messages: the client's
messages by the in-process key written at parse (the stable digest, where a protocol's keys carry
cache markers that clients move: Messages), the proxy's own (summary, notes, stubs) by the digest
of their JSON. When the request reused the previous body's parse (proxy/reuse.py) and
shares all of its messages, nothing is compared (and a Messages request's digests are not made
until a later request compares); else the lists are compared once (a C-level compare of the same
objects, most of the time).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from proxy import jsonbody
from proxy.adapter import DIGESTS
from proxy.model import Conversation
from proxy.rendered import per_item
from proxy.ops.events import is_event

log = logging.getLogger("proxy.prefix")

MAX_CONVERSATIONS = 4096  # conversations whose last forwarded request is remembered (oldest out first)


FINGERPRINTS = "prefix.fingerprints"  # a compacted request's, per forwarded envelope, in its __dict__


def fingerprints(request: Any, conv: Conversation) -> list[Any]:
    """One per forwarded message: the client's by their key or digest, the proxy's by their JSON's
    digest; the previous request's for the envelopes it forwarded too at the same places (a
    compacted request forwards its kept history again: only its head and new turn are looked up)."""
    own = request.keys if request.digest_cache is DIGESTS else request.digests
    if conv is request.conversation:
        return own
    at = request.positions()
    cache = request.digest_cache

    def one(e: Any) -> Any:
        i = at(e)
        return own[i] if i is not None else cache.digest(e.value, hash(jsonbody.dumps(e.value)))
    return per_item(request, FINGERPRINTS, conv.envelopes, one)


def first_difference(before: list[Any], now: list[Any]) -> int | None:
    """Where `now` stops starting with `before` (None: it does)."""
    n = len(before)
    if now[:n] == before:
        return None
    for i in range(min(n, len(now))):
        if now[i] != before[i]:
            return i
    return min(n, len(now))


class PrefixAlarm:
    def __init__(self, hooks: Any, size: int = MAX_CONVERSATIONS) -> None:
        self.hooks = hooks
        self.size = size
        # conversation -> (its last forwarded request's fingerprints (None: not made yet, `_own`),
        # how many, a weak reference to that Request when they were its own messages, else
        # None); oldest first (a plain dict keeps
        # the order it was written in)
        self._last: dict[str, tuple[list[Any] | None, int, Any]] = {}

    def forwarded(self, ex: Any, flow: Any, conv: Conversation | None = None) -> None:
        """`flow`'s request goes upstream carrying `conv` (flow.forwarded by default; the client's
        own conversation when forwarded as sent). Raises nothing: it is only an alarm."""
        if ex is None or not ex.conversation:
            return
        try:
            self._check(ex, flow, flow.forwarded if conv is None else conv)
        except Exception:
            log.exception("the prefix-break check failed")

    def _check(self, ex: Any, flow: Any, conv: Conversation) -> None:
        # (every forwarded request comes here: the usual case, the client's own messages, is
        # written out without calls; a few microseconds matter on this path)
        request = flow.request
        mine = conv is request.conversation
        now = _own(request) if mine else fingerprints(request, conv)
        key = ex.conversation
        last_ = self._last
        last = last_.pop(key, None)
        last_[key] = (now, len(conv), weakref.ref(request) if mine else None)
        if len(last_) > self.size:
            del last_[next(iter(last_))]
        if last is None:
            return  # the conversation's first request
        status = flow.report.status
        if conv is flow.forwarded and status != "none" and status != "reused" and is_event(ex, flow.report):
            return  # a compaction: the start may change here
        before, n_before, ref = last
        if mine and ref is not None and request.previous is not None and request.previous is ref() \
                and request.shared >= n_before:
            return  # the previous body's every message, byte for byte (the reuse compared them)
        before = before if before is not None else _made_late(ref)
        if before is None:
            return  # that request is gone, its fingerprints never made (nothing left to compare)
        now = now if now is not None else request.digests
        if now[:len(before)] == before:
            return
        at = first_difference(before, now)
        if at is not None:
            log.warning("prefix break: conversation %s forwarded a request that differs from its previous one at "
                        "message %d (no compaction in between)", key, at + 1)
            self.hooks.prefix_break(ex, at, flow.report.tokens_before)


def _own(request: Any) -> list[Any] | None:
    """The fingerprints of the client's own messages, or None where they are the stable digests
    (Messages) and the request reused the previous body's parse: they are made only if a later
    request has to compare (in the under zone nothing else asks for them, and the next request
    of a growing conversation is answered by `shared` alone)."""
    if request.digest_cache is DIGESTS:
        return request.keys
    return None if request.previous is not None and "digests" not in request.__dict__ else request.digests


def _made_late(ref: Any) -> list[Any] | None:
    """The deferred fingerprints of a request (`_own`), made now that they are compared."""
    request = ref() if ref is not None else None
    return request.digests if request is not None else None
