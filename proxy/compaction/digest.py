"""Tier 3, the floor (design.md § Tiers; § The floor): a digest of the oldest part written by code. Pure.

Used when the summarizer failed and the request does not fit the window even with old tool
outputs masked. It keeps what the agent cannot do without, in this order, as far as the budget
allows: the user's requests verbatim (newest first), the files touched, identifiers and error
lines, then one line per dropped message.
"""

from __future__ import annotations

from typing import Callable, Sequence

from proxy import textfacts
from proxy.compaction import extract
from proxy.model import Envelope, Kind, calls_by_id
from proxy.text import clamp_middle

TURN_LINE_CHARS = 160

HEADER = ("## Digest of earlier messages\n"
          "(Written by the proxy from the messages themselves: the summarizer was unavailable.)")


def write_digest(span: Sequence[Envelope], budget_tokens: int, count: Callable[[str], int]) -> str:
    """The digest of `span` in at most about `budget_tokens` tokens."""
    parts = [HEADER]
    used = count(HEADER)

    def room() -> int:
        return budget_tokens - used

    def add(block: str) -> bool:
        nonlocal used
        n = count(block)
        if n > room():
            return False
        parts.append(block)
        used += n
        return True

    requests = [e.text for e in span if e.kind is Kind.USER]
    requests = [r for r in requests if r.strip()]
    if requests:
        lines = ["### User requests (verbatim, newest first)"]
        for r in reversed(requests):
            line = f"- {r}"
            if count("\n".join([*lines, line])) > room():
                break
            lines.append(line)
        if len(lines) > 1:
            add("\n".join(lines))
    files = extract.files_touched(span)
    if files:
        add("### Files touched\n" + extract.render_files(files, max(0, room() * 2)))
    text, texts, found = extract.span_joined(span)
    errors = textfacts.joined_errors(text, texts)
    idents = extract.rank_identifiers(found, errors=errors, user_text=extract.user_text(span))
    if errors or idents:
        lines = ["### Identifiers and errors"] + [f"- error: {e}" for e in errors] + [f"- {i}" for i in idents]
        add("\n".join(extract.capped_lines(lines, max(0, room() * 2))))
    add("\n".join(["### Messages (one line each)", *_turn_lines(span, max(0, room() * 2))]))
    return "\n\n".join(parts)


def _turn_lines(span: Sequence[Envelope], max_chars: int) -> list[str]:
    calls = calls_by_id(it for e in span for it in e.items)
    lines = []
    for e in span:
        text = " ".join(e.text.split())
        if e.kind is Kind.TOOL_RESULT:
            for _, result in e.results:  # one line per result (a Messages user message holds several)
                name, _ = calls.get(result.call_id or "", (result.name or "tool", ""))
                size = len(text) if len(e.items) == 1 else len(" ".join(result.text.split()))
                lines.append(f"- tool {name}: {size} characters")
            continue
        called = ", ".join(call.name or "tool" for call in e.calls)
        role = e.kind.value
        line = f"- {role}: {clamp_middle(text, TURN_LINE_CHARS)}" if text else f"- {role}:"
        if called:
            line += f" [called {called}]"
        lines.append(line)
    return extract.capped_lines(lines, max_chars)
