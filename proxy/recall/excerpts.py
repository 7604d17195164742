"""Where in an original a search hit, and how much of it fits a token budget (pure functions).

Excerpts are verbatim slices of the original, cut at line ends where one is near, so the model gets
the exact text (a traceback line, a value in the middle of a large output) and its position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from proxy.recall import symbols

RADIUS = 700  # characters of context on each side of a hit
_WORD = re.compile(r"[^\W_]+")  # a word as the index cuts them (store.base.index_words)
Count = Callable[[str], int]


@dataclass(frozen=True)
class Window:
    start: int
    end: int
    score: int  # distinct identifiers (x1000) and words of the query inside it


def _positions(text: str, words: list[str], identifiers: list[str]) -> list[tuple[int, str, int]]:
    """(position, term, weight) of every hit: identifiers exactly, words case-insensitively as words.
    Where an identifier is defined (`def name`, a method in its class) counts as one more term,
    so the window around a definition comes before the ones around its mentions."""
    out: list[tuple[int, str, int]] = []
    for ident in identifiers:
        start = text.find(ident)
        while start >= 0 and len(out) < 10_000:
            out.append((start, ident, 1000))
            start = text.find(ident, start + 1)
        out += [(at, "def " + ident, 1000) for at in symbols.definitions(text, ident)[:100]]
    if words:
        # Every run of letters and digits looked up once: the words as one alternation were tried
        # at every position of the text (a query of thousands of words, seconds a megabyte).
        wanted = {w.lower() for w in words}
        for m in _WORD.finditer(text):
            if (w := m.group(0).lower()) in wanted:
                out.append((m.start(), w, 1))
                if len(out) >= 20_000:
                    break
    out.sort()
    return out


def _line_bounds(text: str, start: int, end: int) -> tuple[int, int]:
    """Widen [start, end) to whole lines when the line ends are within RADIUS/2."""
    s = text.rfind("\n", max(0, start - RADIUS // 2), start)
    e = text.find("\n", end, min(len(text), end + RADIUS // 2))
    return (s + 1 if s >= 0 else start if start > RADIUS // 2 else 0), (e if e >= 0 else end if end < len(text) - RADIUS // 2 else len(text))


def windows(text: str, words: list[str], identifiers: list[str], limit: int = 6) -> list[Window]:
    """The best windows around hits, at most `limit`, not overlapping, in the text's order of
    preference (most distinct query terms first, then earliest)."""
    hits = _positions(text, words, identifiers)
    if not hits:
        return []
    # One candidate per hit: the hits within RADIUS after it count for it.
    cands: list[Window] = []
    j = 0
    for i, (pos, _term, _w) in enumerate(hits):
        j = max(j, i)
        while j + 1 < len(hits) and hits[j + 1][0] < pos + RADIUS:
            j += 1
        terms = {}
        for p, t, w in hits[i:j + 1]:
            terms[t] = w
        cands.append(Window(pos, pos, sum(terms.values())))
    cands.sort(key=lambda w: (-w.score, w.start))
    chosen: list[Window] = []
    for c in cands:
        start, end = _line_bounds(text, max(0, c.start - RADIUS // 2), min(len(text), c.start + RADIUS))
        if any(start < w.end and w.start < end for w in chosen):
            continue
        chosen.append(Window(start, end, c.score))
        if len(chosen) >= limit:
            break
    return chosen


def fit(text: str, start: int, budget: int, count: Count) -> int:
    """The end of a slice text[start:end] of at most `budget` tokens, near the longest, at a line end when
    one falls in its last fifth."""
    if budget <= 0 or start >= len(text):
        return start
    hi = min(len(text), start + budget * 8)  # tokens are rarely over 8 characters: enough
    n = count(text[start:hi])
    if n <= budget:
        end = hi
    else:
        # proportional first guess, then shrink: two or three counts, not a bisection's fifteen
        end = start + int((hi - start) * budget / n * 0.97)
        while end > start and count(text[start:end]) > budget:
            end = start + int((end - start) * 0.9)
    if end < len(text):
        nl = text.rfind("\n", start + (end - start) * 4 // 5, end)
        if nl > start:
            end = nl + 1
    return end


def page(text: str, n: int, budget: int, count: Count) -> tuple[int, int, bool]:
    """(start, end, more left) of page `n` (from 1) when the text is cut into consecutive pages
    of at most `budget` tokens each; past the last page, an empty slice at the end."""
    start = 0
    for _ in range(n - 1):
        end = fit(text, start, budget, count)
        if end <= start:
            return len(text), len(text), False
        start = end
    end = fit(text, start, budget, count)
    return start, end, end < len(text)
