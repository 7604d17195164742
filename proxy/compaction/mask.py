"""Tier 1 of compaction (design.md § Tiers): old tool outputs become stubs written by code. Pure functions,
and the stubs made (`Stubs`, bounded).

No model call and no wait: the outputs of tool calls older than the kept recent part are replaced
by one line naming the call, its size, and the identifiers and error lines found in it. User and
assistant messages stay verbatim. The stubs are stored with the record (keyed by the original
message's digest), so every later request forwards the same bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

from proxy.compaction import extract
from proxy.model import Envelope, Item, result_tokens
from proxy.text import clamp_middle
from proxy import textfacts

ARGS_CHARS = 160  # the call's arguments in a stub, at most
STUB_IDENTIFIERS_CHARS = 600
STUB_ERRORS = 3
MIN_MASKED_TOKENS = 120  # outputs smaller than this are left alone: a stub would save little
MAX_STUBS = 8192  # stubs kept made (a long session masks a few hundred outputs)
MAX_STUB_CHARS = 32 << 20  # characters they hold (outputs, stubs, what each had no room for)
STUB_OVERHEAD = 256  # a kept stub's tuples and strings, in characters


def key(digest: str, item: int) -> str:
    """Where a record keeps the stub of one tool result: the original envelope's digest (hex), and
    the result's index among its items when it is not the first (an envelope may hold several)."""
    return digest if item == 0 else f"{digest}:{item}"


def envelope_of(k: str) -> str:
    """The envelope digest a stub's key names."""
    return k.split(":", 1)[0]


@dataclass(frozen=True)
class Maskable:
    index: int  # the envelope
    item: int  # the result among its items
    result: Item
    tokens: int


def maskable(envelopes: Sequence[Envelope], tokens: Sequence[int], start: int, end: int,
             masked: Callable[[int, int], bool], count_text: Callable[[str], int]) -> list[Maskable]:
    """Tool outputs in envelopes[start:end] worth replacing, not replaced already (`masked(i, j)`:
    result j of envelope i is)."""
    out = []
    for i in range(start, end):
        e = envelopes[i]
        if tokens[i] < MIN_MASKED_TOKENS:
            continue  # no result inside is larger than its envelope
        for j, result in e.results:
            n = result_tokens(e, tokens[i], result, count_text)
            if n >= MIN_MASKED_TOKENS and not masked(i, j):
                out.append(Maskable(i, j, result, n))
    return out


def stub_text(name: str, args: str, tokens: int, output: str, recall_id: str, found: textfacts.Facts | None = None) -> str:
    """`[tool output elided: name(args) · N tokens · identifiers: ... · errors: ... · recall id R]`
    (`found`: the output's facts, when the caller has them already)."""
    found = found or textfacts.facts(output)
    errors = list(found.errors[:STUB_ERRORS])
    idents = extract.rank_identifiers(list(found.identifiers), errors=errors)
    shown: list[str] = []
    used = 0
    for ident in idents:
        if any(ident in e for e in errors):
            continue  # the error line carries it verbatim
        if used + len(ident) + 2 > STUB_IDENTIFIERS_CHARS:
            break
        shown.append(ident)
        used += len(ident) + 2
    name = clamp_middle("".join(ch for ch in " ".join(name.split()) if ch.isprintable()), 64)  # one printable line
    parts = [f"[tool output elided: {name}({clamp_middle(' '.join(args.split()), ARGS_CHARS)})", f"{tokens} tokens"]
    if shown:
        more = len(idents) - len(shown) - sum(1 for i in idents if any(i in e for e in errors))
        parts.append("identifiers: " + ", ".join(shown) + (f" (+{more} more)" if more > 0 else ""))
    if errors:
        parts.append("errors: " + " | ".join(errors))
    parts.append(f"recall id {recall_id}]")
    return " · ".join(parts)


class Stubs:
    """Stubs made, by what makes one (the output, its recall id, the call's name and arguments,
    its count): a preparation works out the masking that the request crossing the threshold then
    makes again for a longer history, so each stub is made once.
    With it, the identifiers and error lines of the output the stub has no room for. Least
    recently used evicted first; bounded by count and characters held (the outputs too: a kept
    key keeps its output alive). Thread-safe: masking runs in worker threads for large requests."""

    def __init__(self, max_entries: int = MAX_STUBS, max_chars: int = MAX_STUB_CHARS) -> None:
        self.max_entries, self.max_chars = max_entries, max_chars
        self.chars = 0
        self._d: OrderedDict[tuple[str, str, str, str, int], tuple[str, tuple[str, ...], int]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, output: str, handle: str, name: str, args: str, tokens: int) -> tuple[str, tuple[str, ...]]:
        """stub_text of these, and what it lacks of the output's identifiers and error lines."""
        key = (output, handle, name, args, tokens)
        with self._lock:
            hit = self._d.get(key)
            if hit is not None:
                self._d.move_to_end(key)
                return hit[0], hit[1]
        found = textfacts.facts(output)
        stub = stub_text(name, args, tokens, output, handle, found)
        lacks = tuple(x for x in found.identifiers + found.errors if x not in stub)
        weight = STUB_OVERHEAD + len(output) + len(handle) + len(name) + len(args) + len(stub) + sum(map(len, lacks))
        with self._lock:
            if key not in self._d and weight <= self.max_chars:
                self._d[key] = (stub, lacks, weight)
                self.chars += weight
                while len(self._d) > self.max_entries or self.chars > self.max_chars:
                    self.chars -= self._d.popitem(last=False)[1][2]
        return stub, lacks

    def __len__(self) -> int:
        return len(self._d)
