"""What a text holds that compaction reads again and again: its identifiers, error lines and how
often each identifier occurs, found once per distinct text and kept in a bounded cache; and a
joined span's, from its texts' (below).

An agent resends its whole history on every request, so the same tool outputs are scanned for
identifiers on request after request (the masking's stubs and the recall list both read them).
The scan is a dozen regular expressions over the text; a lookup is one hash of it (Python keeps a
string's hash, and a body parsed through the prefix reuse hands back the same string objects).
Thread-safe: masking runs in worker threads for large requests.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, Iterator, NamedTuple, Sequence, TypeVar

from proxy import identifiers
from proxy.farm import farm
from proxy.identifiers import MAX_ERROR_LINE_CHARS, MAX_ERROR_LINES, find_error_lines, scan, scanned

# Held as keys: the texts themselves. A long session's tool outputs are a few MB; the bound keeps
# a busy process's memory flat whatever its conversations hold.
MAX_ENTRIES = 16_384
MAX_CHARS = 64 << 20
# Texts shorter than this are scanned each time: the scan costs less than keeping them.
MIN_CHARS = 256


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# What a text's token counts are charged against MAX_CHARS, a token (a dict entry and its key).
COUNT_CHARS = 96


class Facts(NamedTuple):
    identifiers: tuple[str, ...]  # in order of first appearance
    errors: tuple[str, ...]  # the error lines, at most identifiers.MAX_ERROR_LINES
    counts: dict[str, int]  # identifiers.token_counts: a summary's ranking sums them over its span

    def weight(self, text: str) -> int:
        return len(text) + COUNT_CHARS * len(self.counts)


class TextCache(Generic[K, V]):
    """key -> what `compute` finds in it, least recently used evicted first, bounded by count and
    by characters held (`weigh(key, value)`: the key and what its value holds). A key is a text,
    or anything hashable that `compute` and `weigh` read (inject.wrapped's: a template and a
    summary); a text shorter than `min_chars` is computed each time (0: every key is kept)."""

    def __init__(self, compute: Callable[[K], V], weigh: Callable[[K, V], int],
                 max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS, min_chars: int = MIN_CHARS) -> None:
        self.compute, self.weigh = compute, weigh
        self.max_entries, self.max_chars, self.min_chars = max_entries, max_chars, min_chars
        self.chars = 0
        self.scans = 0  # values computed (misses): what the tests count
        self._d: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, key: K) -> V:
        if self.min_chars and len(key) < self.min_chars:  # type: ignore[arg-type]
            return self.compute(key)
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
                return hit
        value = self.compute(key)  # outside the lock: two threads may scan one text, both get equal values
        with self._lock:
            self.scans += 1
            weight = self.weigh(key, value)
            if key not in self._d and weight <= self.max_chars:
                self._d[key] = value
                self.chars += weight
                while len(self._d) > self.max_entries or self.chars > self.max_chars:
                    old, gone = self._d.popitem(last=False)
                    self.chars -= self.weigh(old, gone)
        return value

    def __len__(self) -> int:
        return len(self._d)


class FactsCache(TextCache[str, Facts]):
    """text -> Facts."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_chars: int = MAX_CHARS) -> None:
        super().__init__(_scan, lambda text, facts: facts.weight(text), max_entries, max_chars)


def _scan(text: str) -> Facts:
    part = scanned(text)  # (what both read of a huge text: only that goes to the worker process)
    return farm.sized(len(part), _facts, part)


def _facts(text: str) -> Facts:
    idents, counts = scan(text)
    return Facts(tuple(idents), tuple(find_error_lines(text)), counts)


# One per process: the facts of a text do not depend on who asks.
facts = FactsCache()


# -- a joined text from its parts -------------------------------------------------------------------
# A summary reads its span as one text, "\n".join(parts), and the parts are the messages whose facts
# are cached already. No identifier crosses a line, so what a scan of the joined text finds is what
# scans of its parts find, in order; over SCAN_CHARS the scan reads the joined text's head and tail,
# cut at line ends, so the parts (or the pieces of them) inside those are what it reads.


def _read(text: str, parts: Sequence[str]) -> Iterator[tuple[str, bool]]:
    """What identifiers.scanned(text) reads of `text` ("\n".join(parts)), piece by piece in order:
    (piece, True) for a whole part (its facts are cached), (piece, False) for anything else: a
    part's cut piece, or short parts next to each other (read as one: one scan, not one each)."""
    run: list[int] = []  # [start, end) of the short parts read as one piece
    for lo, hi, whole in pieces(text, parts):
        if whole is not None and hi - lo < MIN_CHARS and (not run or run[1] + 1 == lo):
            run = [run[0] if run else lo, hi]
            continue
        if run:
            yield text[run[0]:run[1]], False
            run = [lo, hi] if whole is not None and hi - lo < MIN_CHARS else []
            if run:
                continue
        yield (whole, True) if whole is not None else (text[lo:hi], False)
    if run:
        yield text[run[0]:run[1]], False


def pieces(text: str, parts: Sequence[str]) -> Iterator[tuple[int, int, str | None]]:
    """(start, end, the part when it is read whole) of what scanned(text) reads, part by part."""
    regions = _kept(text)
    if regions is None:  # a cut inside a line (no line end near it): the joined text read as it is
        yield 0, len(text), None
        return
    start = 0
    for part in parts:
        end = start + len(part)
        for a, b in regions:
            lo, hi = max(start, a), min(end, b)
            if lo < hi:
                yield lo, hi, part if (lo, hi) == (start, end) else None
        start = end + 1


def _kept(text: str) -> list[tuple[int, int]] | None:
    """The (start, end) regions of `text` that identifiers.scanned keeps; None when it cuts mid-line."""
    if len(text) <= identifiers.SCAN_CHARS:
        return [(0, len(text))]
    head, tail = identifiers.line_cuts(text)
    return [(0, head), (tail, len(text))] if head and tail else None


def joined_counts(text: str, parts: Sequence[str]) -> dict[str, int]:
    """identifiers.token_counts(text) for text == "\n".join(parts), from the parts' cached counts."""
    total: dict[str, int] = {}
    for piece, whole in _read(text, parts):
        counts = facts(piece).counts if whole else scan(piece)[1]
        for tok, n in counts.items():
            total[tok] = total.get(tok, 0) + n
    return total


def joined_identifiers(text: str, parts: Sequence[str]) -> list[str]:
    """identifiers.find_identifiers(text) for text == "\n".join(parts), from the parts' cached ones."""
    return list(dict.fromkeys(i for piece, whole in _read(text, parts)
                              for i in (facts(piece).identifiers if whole else scan(piece)[0])))


def joined_errors(text: str, parts: Sequence[str]) -> list[str]:
    """identifiers.find_error_lines(text) for text == "\n".join(parts), from the parts' cached ones:
    the first distinct lines of the parts' lists in order are the text's (a part's list stops at
    its MAX_ERROR_LINES lines only where the text's is full). A line longer than the clip is listed
    clipped each time it recurs (find_error_lines compares the whole line with the clipped ones);
    a listed line of the clip's length was clipped or not, which decides only when it is listed
    already: then the text is read as it is."""
    out: list[str] = []
    for piece, whole in _read(text, parts):
        for line in facts(piece).errors if whole else farm.sized(len(piece), find_error_lines, piece):
            if line in out:
                if len(line) < MAX_ERROR_LINE_CHARS:
                    continue
                part = scanned(text)
                return farm.sized(len(part), find_error_lines, part)
            out.append(line)
            if len(out) >= MAX_ERROR_LINES:
                return out
    return out
