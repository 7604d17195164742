"""The conversation as text for the summarizer (spec 4.3): pure functions.

Labelled blocks, never chat turns, so the summarizer reads history as data. Every piece of it is
untrusted: boundary tags, chat-template control tokens and imitated block labels inside it are
escaped (proxy/escaping.py), so no message (and no earlier summary) can close the `<conversation>`
block early or fake a turn; tool names are made one clipped, printable line.
"""

from __future__ import annotations

from typing import Any, Iterable

from proxy.escaping import escape_client_text, escape_untrusted, tool_name  # noqa: F401 (escape_untrusted: callers import it here)
from proxy.text import clamp_middle

TOOL_RESULT_CHARS = 2000
TOOL_ARGS_CHARS = 2000


def content_text(content: Any) -> str:
    """Message content as text; images become [image], other non-text parts their type."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict):
                continue
            kind = p.get("type")
            if isinstance(p.get("text"), str):
                parts.append(p["text"])
            elif kind == "refusal" and isinstance(p.get("refusal"), str):
                parts.append(p["refusal"])
            elif kind in ("image_url", "input_image", "image"):
                parts.append("[image]")
            else:
                parts.append(f"[{kind}]")
        return "\n".join(parts)
    return str(content)


def tool_names_by_call_id(messages: Iterable[dict[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for m in messages:
        for call in m.get("tool_calls") or ():
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                fn = call.get("function") or {}
                names[call["id"]] = str(fn.get("name", "tool")) if isinstance(fn, dict) else "tool"
    return names


def serialize_message(msg: dict[str, Any], names: dict[str, str]) -> str:
    """One message as a labelled block, its text escaped (the labels are ours, so they are not).
    Reasoning/thinking fields are never read, so they drop."""
    role = msg.get("role")
    text = escape_client_text(content_text(msg.get("content")))
    if role == "user":
        return f"[User]: {text}"
    if role == "assistant":
        lines = [f"[Assistant]: {text}"] if text else []
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") or {} if isinstance(call, dict) else {}
            name = tool_name(fn.get("name", "tool")) if isinstance(fn, dict) else "tool"
            args = clamp_middle(str(fn.get("arguments", "")) if isinstance(fn, dict) else "", TOOL_ARGS_CHARS)
            lines.append(f"[Tool call]: {name}({escape_client_text(args)})")
        return "\n".join(lines) if lines else "[Assistant]:"
    if role in ("tool", "function"):
        name = tool_name(names.get(str(msg.get("tool_call_id")), msg.get("name") or "tool"))
        return f"[Tool result: {name}]: {clamp_middle(text, TOOL_RESULT_CHARS)}"
    return f"[System]: {text}"


def serialize_messages(messages: list[dict[str, Any]], names: dict[str, str] | None = None) -> list[str]:
    """Escaped blocks, one per message (callers fold them into windows on these boundaries)."""
    names = names if names is not None else tool_names_by_call_id(messages)
    return [serialize_message(m, names) for m in messages]
