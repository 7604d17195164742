"""What a text holds that compaction reads again and again: its identifiers and error lines, found
once per distinct text and kept in a bounded cache.

An agent resends its whole history on every request, so the same tool outputs are scanned for
identifiers on request after request (the masking's stubs and the recall list both read them).
The scan is a dozen regular expressions over the text; a lookup is one hash of it (Python keeps a
string's hash, and a body parsed through the prefix reuse hands back the same string objects).
Thread-safe: masking runs in worker threads for large requests.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from proxy.farm import farm
from proxy.identifiers import find_error_lines, find_identifiers, scanned

# Held as keys: the texts themselves. A long session's tool outputs are a few MB; the bound keeps
# a busy process's memory flat whatever its conversations hold.
MAX_ENTRIES = 16_384
MAX_CHARS = 64 << 20
# Texts shorter than this are scanned each time: the scan costs less than keeping them.
MIN_CHARS = 256


class Facts(NamedTuple):
    identifiers: tuple[str, ...]  # in order of first appearance
    errors: tuple[str, ...]  # the error lines, at most identifiers.MAX_ERROR_LINES


class FactsCache:
    """text -> Facts, least recently used evicted first, bounded by count and by characters held."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        self.max_entries, self.max_chars = max_entries, max_chars
        self.chars = 0
        self.scans = 0  # texts scanned (misses): what the tests count
        self._d: OrderedDict[str, Facts] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, text: str) -> Facts:
        if len(text) < MIN_CHARS:
            return _scan(text)
        with self._lock:
            hit = self._d.get(text)
            if hit is not None:
                self._d.move_to_end(text)
                return hit
        facts = _scan(text)  # outside the lock: two threads may scan one text, both get equal facts
        with self._lock:
            self.scans += 1
            if text not in self._d and len(text) <= self.max_chars:
                self._d[text] = facts
                self.chars += len(text)
                while len(self._d) > self.max_entries or self.chars > self.max_chars:
                    old, _ = self._d.popitem(last=False)
                    self.chars -= len(old)
        return facts

    def __len__(self) -> int:
        return len(self._d)


def _scan(text: str) -> Facts:
    part = scanned(text)  # (what both read of a huge text: only that goes to the worker process)
    return farm.sized(len(part), _facts, part)


def _facts(text: str) -> Facts:
    return Facts(tuple(find_identifiers(text)), tuple(find_error_lines(text)))


# One per process: the facts of a text do not depend on who asks.
facts = FactsCache()
