"""Which tool messages are summarized, and the exact text the summarizer receives (pure)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Callable, Sequence

from proxy.escaping import tool_name
from proxy.model import Envelope, Kind, result_tokens
from proxy.text import clip_hint

BEGIN = "--- BEGIN TOOL OUTPUT ---"
END = "--- END TOOL OUTPUT ---"


@dataclass(frozen=True)
class Candidate:
    index: int  # the envelope holding the tool result
    item: int  # the result's index among the envelope's items
    tool_call_id: str
    tool_name: str
    text: str
    tokens: int
    over_cap: bool  # larger than max_payload_tokens: never sent to a summarizer


def is_skipped(tool_name: str, skip: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(tool_name, pat) for pat in skip)


def select(
    envelopes: Sequence[Envelope], tokens: Sequence[int], *, threshold: int, cap: int, skip: Sequence[str],
    count_text: Callable[[str], int], start: int = 0,
) -> list[Candidate]:
    """Tool results over `threshold` tokens (a result alone in its envelope: the envelope's count,
    the output plus a few tokens of framing; one of several: its output's), in order, whose output
    is text only and answers a call id. The tool's name is that of the latest call with the same id
    before the result (the adapter names results so). Only the envelopes from `start` on are read."""
    if len(tokens) <= start or max(tokens[start:] if start else tokens) <= threshold:
        return []  # the common case: nothing to do, and no walk over a long history
    out: list[Candidate] = []
    for i in range(start, len(tokens)):
        if tokens[i] <= threshold:
            continue  # no result inside can be larger than its envelope
        e = envelopes[i]
        for j, result in e.results:
            n = result_tokens(e, tokens[i], result, count_text)
            if n <= threshold or not result.plain or result.call_id is None:
                continue  # images or other parts: not ours to rewrite
            name = result.name or "tool"
            if is_skipped(name, skip):
                continue
            # Skipping matches the name as sent; the prompt and the note's header get it sanitized.
            out.append(Candidate(i, j, result.call_id, tool_name(name), result.text, n, n > cap))
    return out


def parent_hint(envelopes: Sequence[Envelope]) -> str:
    """The latest user request, clipped: what the tool was run for."""
    latest = next((e for e in reversed(envelopes) if e.kind is Kind.USER), None)
    return clip_hint(latest.text) if latest is not None else ""


def user_message(tool_name: str, hint: str, payload: str) -> str:
    # A payload line that imitates our markers must not end the data early.
    payload = payload.replace(END, "--- END TOOL OUTPUT (text inside the output) ---").replace(
        BEGIN, "--- BEGIN TOOL OUTPUT (text inside the output) ---"
    )
    return f"Tool: {tool_name}\nParent task hint: {hint or '(none)'}\n\n{BEGIN}\n{payload}\n{END}"


def notice(reason: str) -> str:
    return (
        f"[compaction-proxy: summarization unavailable ({reason}); the raw output follows. "
        "Do not re-run the tool for a summary.]"
    )
