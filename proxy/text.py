"""Small text helpers shared by the compaction and tool-result paths (pure)."""

from __future__ import annotations


def clamp_middle(text: str, max_chars: int, *, what: str = "characters") -> str:
    """Keep the head and the tail (errors and totals sit at the end), say how much was cut."""
    if len(text) <= max_chars:
        return text
    marker_budget = 80
    keep = max(max_chars - marker_budget, 0)
    head = (keep * 2) // 3 if keep else 0
    tail = keep - head
    cut = len(text) - head - tail
    marker = f"\n[... {cut} {what} cut ...]\n"
    return text[:head] + marker + (text[-tail:] if tail else "")


def clip_hint(text: str, head: int = 1000, tail: int = 1000) -> str:
    """First `head` and last `tail` characters with a marker between (the parent-task hint)."""
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} characters omitted ...]\n{text[-tail:]}"
