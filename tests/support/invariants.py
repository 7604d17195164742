"""The invariant every forwarded request must satisfy, checked by many tests (issue 7 item 2).

Given what the client sent and what the proxy forwarded:
- leading system messages are kept (the first may carry the annotation appended);
- every tool message directly follows the assistant message that called it, every call answered;
- nothing is invented except the summary (its own user message, or merged at the head of the first
  kept user message) and the system annotation; kept messages are a suffix of the original, equal
  but for tool results replaced by notes or clamped (same role and tool_call_id);
- the most recent user message is present verbatim; no two user messages in a row.
"""

from __future__ import annotations

from typing import Any


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def check_tool_pairing(messages: list[dict[str, Any]]) -> None:
    pending: set[str] = set()
    prev_role = None
    for i, m in enumerate(messages):
        role = m.get("role")
        if role == "tool":
            assert prev_role in ("assistant", "tool"), f"tool message {i} does not follow an assistant/tool message"
            assert m.get("tool_call_id") in pending, f"tool message {i} answers an unknown call {m.get('tool_call_id')}"
            pending.discard(m["tool_call_id"])
        else:
            assert not pending, f"calls {sorted(pending)} unanswered before message {i}"
            if role == "assistant":
                pending = {c["id"] for c in m.get("tool_calls") or ()}
        prev_role = role
    assert not pending, f"calls {sorted(pending)} unanswered at the end"


def check_forwarded(original: list[dict[str, Any]], forwarded: list[dict[str, Any]], *, compacted: bool) -> None:
    n_sys = 0
    while n_sys < len(original) and original[n_sys].get("role") in ("system", "developer"):
        n_sys += 1
    # leading system messages
    if n_sys:
        assert forwarded[0]["role"] == original[0]["role"]
        assert text_of(forwarded[0]["content"]).startswith(text_of(original[0]["content"]))
        assert forwarded[1:n_sys] == original[1:n_sys]
        f_sys = n_sys
    else:
        f_sys = 1 if compacted else 0
        if compacted:
            assert forwarded[0]["role"] == "system"
    rest = forwarded[f_sys:]
    if compacted:
        head = rest[0]
        assert head["role"] == "user" and "<summary>" in text_of(head["content"]), "no summary message"
        kept = rest[1:]
        i = len(original) - len(rest)  # the original message `head` stands for, if merged
        merged = (
            i >= n_sys
            and original[i].get("role") == "user"
            and text_of(head["content"]).endswith(text_of(original[i]["content"]))
            and text_of(head["content"]) != text_of(original[i]["content"])
        )
        if not merged:
            assert not kept or kept[0]["role"] != "user", "summary not merged into the first kept user message"
        orig_tail = original[len(original) - len(kept):] if kept else []
        assert len(kept) < len(original) - n_sys, "compaction kept every message"
    else:
        kept = rest
        orig_tail = original[len(original) - len(kept):]
        assert len(kept) == len(original) - n_sys
    for k, o in zip(kept, orig_tail):
        if k == o:
            continue
        assert k.get("role") == o.get("role") == "tool", f"kept message changed: {o.get('role')}"
        assert k.get("tool_call_id") == o.get("tool_call_id")
    # Two user messages in a row only where the client itself sent two in a row.
    for j in range(1, len(forwarded)):
        if forwarded[j]["role"] == forwarded[j - 1]["role"] == "user":
            pos = len(original) - (len(forwarded) - j)
            assert pos > 0 and original[pos] == forwarded[j] and original[pos - 1]["role"] == "user", (
                "two user messages in a row"
            )
    check_tool_pairing(forwarded)
    last_user = next((m for m in reversed(original) if m.get("role") == "user"), None)
    if last_user is not None:
        needle = text_of(last_user["content"])
        assert any(needle in text_of(m.get("content")) for m in forwarded if m["role"] == "user"), (
            "the most recent user message is not present verbatim"
        )
