"""Anthropic's prompt cache, as the fake models it (https://docs.claude.com/en/docs/build-with-claude/
prompt-caching): caching is explicit. A prefix (tools, then system, then messages) is written at
each `cache_control` breakpoint that is at least the model's minimum cacheable length; a later
request reads the longest written prefix that ends at one of its block boundaries no more than
20 blocks before one of its breakpoints. Usage: cache_read_input_tokens = that prefix,
cache_creation_input_tokens = from there to the last breakpoint (when it is long enough),
input_tokens = the rest. Breakpoint markers are not part of the content: moving one does not
change what was cached."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from proxy.fakes.prompt_cache import PrefixCache, segment_key

LOOKBACK_BLOCKS = 20
# Minimum cacheable prompt length per model family (the prompt-caching page); others: 1024.
MIN_CACHEABLE = (
    ("claude-opus-4-6", 4096), ("claude-opus-4-5", 4096), ("claude-haiku-4-5", 4096),
    ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048), ("claude-haiku-3", 2048),
)
DEFAULT_MIN_CACHEABLE = 1024


def min_cacheable(model: str) -> int:
    for prefix, n in MIN_CACHEABLE:
        if model.startswith(prefix):
            return n
    return DEFAULT_MIN_CACHEABLE


@dataclass
class CacheUsage:
    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


def _strip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if k != "cache_control"}
    if isinstance(obj, (list, tuple)):
        return [_strip(v) for v in obj]
    return obj


class BreakpointCache:
    def __init__(self) -> None:
        self._cache = PrefixCache()

    def clear(self) -> None:
        self._cache.clear()

    def account(self, model: str, segments: Sequence[Any], tokens: Sequence[int], breakpoints: Sequence[int],
                total: int, minimum: int | None = None) -> CacheUsage:
        """Usage for a request whose cache segments have these token counts, breakpoints at these
        segment indexes; writes its breakpoint prefixes."""
        minimum = min_cacheable(model) if minimum is None else minimum
        hashes = self._cache.prefix_hashes(model, [segment_key(_strip(s)) for s in segments])
        cum = []
        run = 0
        for n in tokens:
            run += n
            cum.append(run)
        read_at = -1
        for b in breakpoints:
            for k in range(b, max(-1, b - LOOKBACK_BLOCKS - 1), -1):
                if self._cache.seen(hashes[k]) and k > read_at:
                    read_at = k
                    break
        read = cum[read_at] if read_at >= 0 else 0
        creation = 0
        if breakpoints:
            last = max(breakpoints)
            written = [hashes[b] for b in breakpoints if cum[b] >= minimum]
            self._cache.store(written)
            if cum[last] >= minimum:
                creation = max(0, cum[last] - read)
        return CacheUsage(max(0, total - read - creation), read, creation)
