"""Which tool messages are summarized, and the exact text the summarizer receives (pure)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Any, Sequence

from proxy.chat_request import latest_user_index, message_text
from proxy.compaction.serialize import tool_names_by_call_id
from proxy.escaping import tool_name
from proxy.text import clip_hint

BEGIN = "--- BEGIN TOOL OUTPUT ---"
END = "--- END TOOL OUTPUT ---"


@dataclass(frozen=True)
class Candidate:
    index: int
    tool_call_id: str
    tool_name: str
    text: str
    tokens: int
    over_cap: bool  # larger than max_payload_tokens: never sent to a summarizer


def is_skipped(tool_name: str, skip: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(tool_name, pat) for pat in skip)


def select(
    messages: list[dict[str, Any]], tokens: Sequence[int], *, threshold: int, cap: int, skip: Sequence[str]
) -> list[Candidate]:
    """Tool messages over `threshold` tokens (the message's count: content plus a few tokens of
    framing), in order. The tool's name comes from the latest assistant call with the same id before
    the result: agents reuse call ids across turns, so a map over the whole conversation would name
    an earlier result after a later call."""
    if not tokens or max(tokens) <= threshold:
        return []  # the common case: nothing to do, and no walk over a long history
    names: dict[str, str] = {}
    out: list[Candidate] = []
    for i, m in enumerate(messages):
        if m.get("role") == "assistant" and m.get("tool_calls"):
            names.update(tool_names_by_call_id([m]))
        if m.get("role") != "tool" or tokens[i] <= threshold:
            continue
        content = m.get("content")
        if not (isinstance(content, str) or (isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" for p in content
        ))):
            continue  # images or other parts: not ours to rewrite
        call_id = str(m.get("tool_call_id", ""))
        name = names.get(call_id) or str(m.get("name") or "tool")
        if is_skipped(name, skip):
            continue
        # Skipping matches the name as sent; the prompt and the note's header get it sanitized.
        out.append(Candidate(i, call_id, tool_name(name), message_text(m), tokens[i], tokens[i] > cap))
    return out


def parent_hint(messages: list[dict[str, Any]]) -> str:
    i = latest_user_index(messages)
    return clip_hint(message_text(messages[i])) if i is not None else ""


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
