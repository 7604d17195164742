"""The prefix-break alarm: a forwarded request whose start differs from its conversation's
previous forwarded request, though no compaction happened in between. The provider's prompt cache
serves a request only up to where it differs from what it saw, so every such request is paid at
the full input price from there on; a rise of the count means the cache is being busted (by the
client rewriting its history, or by the proxy forwarding something different twice).

Each conversation keeps the fingerprints of its last forwarded request's messages: the client's
messages by the in-process key written at parse (the stable digest, where a protocol's keys carry
cache markers that clients move: Messages), the proxy's own (summary, notes, stubs) by the digest
of their JSON. When the request reused the previous body's parse (proxy/adapters/prefix.py) and
shares all of its messages, nothing is compared; else the lists are compared once (a C-level
compare of the same objects, most of the time).
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from typing import Any, NamedTuple

from proxy import jsonbody
from proxy.adapters.base import DIGESTS
from proxy.model import Conversation
from proxy.ops.events import is_event

log = logging.getLogger("proxy.prefix")

MAX_CONVERSATIONS = 4096  # conversations whose last forwarded request is remembered (oldest out first)


class Last(NamedTuple):
    fingerprints: list[Any]
    request: Any  # weakref to the Request whose own messages these were (None: the proxy changed some)


def fingerprints(request: Any, conv: Conversation) -> list[Any]:
    """One per forwarded message: the client's by their key or digest, the proxy's by their JSON's digest."""
    own = request.keys if request.digest_cache is DIGESTS else request.digests
    if conv is request.conversation:
        return own
    index = {id(e): i for i, e in enumerate(request.conversation.envelopes)}
    cache = request.digest_cache
    out: list[Any] = []
    for e in conv.envelopes:
        i = index.get(id(e))
        if i is None:
            value = e.value
            out.append(cache.digest(value, hash(jsonbody.dumps(value))))
        else:
            out.append(own[i])
    return out


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
        self._last: OrderedDict[str, Last] = OrderedDict()

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
        request = flow.request
        mine = conv is request.conversation
        now = fingerprints(request, conv)
        key = ex.conversation
        last = self._last.pop(key, None)
        self._last[key] = Last(now, weakref.ref(request) if mine else None)
        if len(self._last) > self.size:
            self._last.popitem(last=False)
        if last is None or (conv is flow.forwarded and is_event(ex, flow.report)):
            return  # a conversation's first request, or a compaction: the prefix may change here
        before = last.fingerprints
        previous = last.request() if last.request is not None else None
        if mine and previous is not None and request.previous is previous and request.shared >= len(before):
            return  # the previous body's every message, byte for byte (the reuse compared them)
        at = first_difference(before, now)
        if at is not None:
            log.warning("prefix break: conversation %s forwarded a request that differs from its previous one at "
                        "message %d (no compaction in between)", key, at + 1)
            self.hooks.prefix_break(ex, at, flow.report.tokens_before)
