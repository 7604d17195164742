"""Tier 1 of compaction (design.md § Tiers): old tool outputs become stubs written by code. Pure functions.

No model call and no wait: the outputs of tool calls older than the kept recent part are replaced
by one line naming the call, its size, and the identifiers and error lines found in it. User and
assistant messages stay verbatim. The stubs are stored with the record (keyed by the original
message's digest), so every later request forwards the same bytes.
"""

from __future__ import annotations

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
