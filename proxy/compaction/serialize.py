"""The conversation as text for the summarizer (spec 4.3): pure functions.

Labelled blocks, never chat turns, so the summarizer reads history as data. Every piece of it is
untrusted: boundary tags and chat-template control tokens inside it are escaped, so no message (and
no earlier summary) can close the `<conversation>` block early or fake a turn of the chat template.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from proxy.text import clamp_middle

TOOL_RESULT_CHARS = 2000
TOOL_ARGS_CHARS = 2000

BOUNDARY_TAGS = ("conversation", "previous-summary", "summary", "focus", "turn-prefix", "files")
_TAG_RE = re.compile(r"<(\s*/?\s*(?:" + "|".join(BOUNDARY_TAGS) + r")\b[^>]*)>", re.IGNORECASE)
# ChatML / Llama 3 / Harmony `<|...|>`, Gemma turns, Mistral [INST], sentence markers, think tags.
_CONTROL_RE = re.compile(
    r"<(\|[^|<>\n]{0,40}\|)>|<(/?(?:s|start_of_turn|end_of_turn|think|thinking)\b)>|\[(/?INST)\]",
    re.IGNORECASE,
)


def escape_untrusted(text: str) -> str:
    text = _TAG_RE.sub(lambda m: "&lt;" + m.group(1) + "&gt;", text)

    def control(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return "&lt;" + m.group(1) + "&gt;"
        if m.group(2) is not None:
            return "&lt;" + m.group(2) + "&gt;"
        return "&#91;" + m.group(3) + "&#93;"

    return _CONTROL_RE.sub(control, text)


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


# A line of untrusted text that imitates one of our block labels would read as a turn of its own.
_FAKE_LABEL = re.compile(r"(?m)^(\s*)\[(User|Assistant|System|Tool call|Tool result[^\]\n]{0,80})\]:")


def _untrusted(text: str) -> str:
    """Client text made safe to place inside a block: tags, template tokens and fake labels."""
    return escape_untrusted(_FAKE_LABEL.sub(r"\1&#91;\2]:", text))


def serialize_message(msg: dict[str, Any], names: dict[str, str]) -> str:
    """One message as a labelled block, its text escaped (the labels are ours, so they are not).
    Reasoning/thinking fields are never read, so they drop."""
    role = msg.get("role")
    text = _untrusted(content_text(msg.get("content")))
    if role == "user":
        return f"[User]: {text}"
    if role == "assistant":
        lines = [f"[Assistant]: {text}"] if text else []
        for call in msg.get("tool_calls") or ():
            fn = call.get("function") or {} if isinstance(call, dict) else {}
            name = _untrusted(str(fn.get("name", "tool"))) if isinstance(fn, dict) else "tool"
            args = clamp_middle(str(fn.get("arguments", "")) if isinstance(fn, dict) else "", TOOL_ARGS_CHARS)
            lines.append(f"[Tool call]: {name}({_untrusted(args)})")
        return "\n".join(lines) if lines else "[Assistant]:"
    if role in ("tool", "function"):
        name = _untrusted(str(names.get(str(msg.get("tool_call_id")), msg.get("name") or "tool")))
        return f"[Tool result: {name}]: {clamp_middle(text, TOOL_RESULT_CHARS)}"
    return f"[System]: {text}"


def serialize_messages(messages: list[dict[str, Any]], names: dict[str, str] | None = None) -> list[str]:
    """Escaped blocks, one per message (callers fold them into windows on these boundaries)."""
    names = names if names is not None else tool_names_by_call_id(messages)
    return [serialize_message(m, names) for m in messages]
