"""Tier 3, the floor (spec 9.1, 9.2): a digest of the oldest part written by code. Pure.

Used when the summarizer failed and the request does not fit the window even with old tool
outputs masked. It keeps what the agent cannot do without, in this order, as far as the budget
allows: the user's requests verbatim (newest first), the files touched, identifiers and error
lines, then one line per dropped message.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from proxy.compaction import extract
from proxy.compaction.mask import calls_by_id
from proxy.compaction.serialize import content_text
from proxy.text import clamp_middle

TURN_LINE_CHARS = 160

HEADER = ("## Digest of earlier messages\n"
          "(Written by the proxy from the messages themselves: the summarizer was unavailable.)")


def write_digest(span: Sequence[dict[str, Any]], budget_tokens: int, count: Callable[[str], int]) -> str:
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

    requests = [content_text(m.get("content")) for m in span if m.get("role") == "user"]
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
    text = extract.span_text(span)
    errors = extract.find_error_lines(text)
    idents = extract.rank_identifiers(extract.find_identifiers(text), errors=errors, user_text=extract.user_text(span))
    if errors or idents:
        lines = ["### Identifiers and errors"] + [f"- error: {e}" for e in errors] + [f"- {i}" for i in idents]
        add("\n".join(extract.capped_lines(lines, max(0, room() * 2))))
    add("\n".join(["### Messages (one line each)", *_turn_lines(span, max(0, room() * 2))]))
    return "\n\n".join(parts)


def _turn_lines(span: Sequence[dict[str, Any]], max_chars: int) -> list[str]:
    calls = calls_by_id(span)
    lines = []
    for m in span:
        role = m.get("role")
        text = " ".join(content_text(m.get("content")).split())
        if role in ("tool", "function"):
            name, _ = calls.get(str(m.get("tool_call_id")), (str(m.get("name") or "tool"), ""))
            lines.append(f"- tool {name}: {len(text)} characters")
            continue
        called = ", ".join(name for name, _ in (
            (str((c.get("function") or {}).get("name", "tool")), "") for c in m.get("tool_calls") or () if isinstance(c, dict)
        ))
        line = f"- {role}: {clamp_middle(text, TURN_LINE_CHARS)}" if text else f"- {role}:"
        if called:
            line += f" [called {called}]"
        lines.append(line)
    return extract.capped_lines(lines, max_chars)
