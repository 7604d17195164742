"""The fakes' simulated prompt caches: which prefix of a request an earlier request already sent.

A request is a sequence of segments (messages, items or content blocks), each with its token
count. `PrefixCache.longest_seen` chains a hash over the segments and says how many tokens of the
longest prefix were seen before; what it is told to `store` is remembered for later requests.
The provider's rules (OpenAI: automatic, 1024-token minimum, 128-token steps; Anthropic: only up
to explicit breakpoints) are applied by the caller with the functions below.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import orjson

# OpenAI's prompt cache: prefixes from 1024 tokens on, hits in steps of 128 tokens.
OPENAI_CACHE_MIN_TOKENS = 1024
OPENAI_CACHE_STEP_TOKENS = 128


def segment_key(obj: object) -> bytes:
    """Canonical bytes of a JSON segment (key order does not matter, as for the provider)."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


class PrefixCache:
    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    def clear(self) -> None:
        self._seen.clear()

    def prefix_hashes(self, head: object, segments: Iterable[bytes]) -> list[bytes]:
        """The chained hash after each segment (`head`: what must match too, e.g. model and tools)."""
        h = hashlib.sha256(segment_key(head)).digest()
        out = []
        for seg in segments:
            h = hashlib.sha256(h + seg).digest()
            out.append(h)
        return out

    def seen(self, h: bytes) -> bool:
        return h in self._seen

    def store(self, hashes: Iterable[bytes]) -> None:
        self._seen.update(hashes)

    def longest_seen(self, head: object, segments: Sequence[tuple[bytes, int]], *, store: bool = True) -> int:
        """Tokens of the longest prefix seen before (automatic caching: every prefix is stored)."""
        hashes = self.prefix_hashes(head, [s for s, _ in segments])
        tokens = cached = 0
        for h, (_, n) in zip(hashes, segments):
            tokens += n
            if h not in self._seen:
                break
            cached = tokens
        if store:
            self.store(hashes)
        return cached


def openai_cached_tokens(cached: int) -> int:
    """What OpenAI reports as cached for a matching prefix of `cached` tokens."""
    if cached < OPENAI_CACHE_MIN_TOKENS:
        return 0
    return cached - (cached - OPENAI_CACHE_MIN_TOKENS) % OPENAI_CACHE_STEP_TOKENS
