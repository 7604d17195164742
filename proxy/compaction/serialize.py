"""The conversation as text for the summarizer (design.md § The history as text): pure functions.

Labelled blocks, never chat turns, so the summarizer reads history as data. Every piece of it is
untrusted: boundary tags, chat-template control tokens and imitated block labels inside it are
escaped (proxy/escaping.py), so no message (and no earlier summary) can close the `<conversation>`
block early or fake a turn; tool names are made one clipped, printable line.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from proxy.escaping import escape_client_text, tool_name
from proxy.model import Envelope, Item, Kind, calls_by_id
from proxy.text import clamp_middle

TOOL_RESULT_CHARS = 2000
TOOL_ARGS_CHARS = 2000


def serialize_envelope(env: Envelope, names: Mapping[str, tuple[str, str]]) -> str:
    """One envelope as a labelled block, its text escaped (the labels are ours, so they are not).
    Opaque parts (reasoning, thinking) are never read, so they drop."""
    kind = env.kind
    text = escape_client_text(env.text)
    if kind is Kind.USER:
        return f"[User]: {text}"
    if kind is Kind.ASSISTANT:
        lines = [f"[Assistant]: {text}"] if text else []
        for call in env.calls:
            args = clamp_middle(call.args, TOOL_ARGS_CHARS)
            lines.append(f"[Tool call]: {tool_name(call.name or 'tool')}({escape_client_text(args)})")
        return "\n".join(lines) if lines else "[Assistant]:"
    if kind is Kind.TOOL_RESULT:
        if len(env.items) == 1:
            return _result_line(env.items[0], text, names)
        # several results in one envelope (a Messages user message), and what the user added to them
        lines = [_result_line(it, escape_client_text(it.text), names) for _, it in env.results]
        said = "\n".join(it.text for it in env.items if it.kind is Kind.USER and it.text)
        return "\n".join(lines + ([f"[User]: {escape_client_text(said)}"] if said else []))
    if kind is Kind.OPAQUE:
        return "[Opaque item]"
    return f"[System]: {text}"


def _result_line(result: Item, text: str, names: Mapping[str, tuple[str, str]]) -> str:
    name = tool_name(names.get(result.call_id or "", (result.name or "tool", ""))[0])
    return f"[Tool result: {name}]: {clamp_middle(text, TOOL_RESULT_CHARS)}"


def serialize_envelopes(envelopes: Sequence[Envelope], names: Mapping[str, tuple[str, str]] | None = None) -> list[str]:
    """Escaped blocks, one per envelope (callers fold them into windows on these boundaries).
    `names`: call id -> (tool name, arguments) over the whole conversation (model.calls_by_id)."""
    names = names if names is not None else calls_by_id(it for e in envelopes for it in e.items)
    return [serialize_envelope(e, names) for e in envelopes]
