"""Which originals a forwarded request stands in for, found from the handles its replacements name
(design 13.1). Pure functions over `Part`s, so every protocol feeds them the same way.

A tool result whose forwarded text names a handle and differs from what the client sent was
replaced (a stub, a note): its original is the client's output for the same call id. A summary
(new text, not the client's) names its spans in its `## Recall` block: their originals are the
client's messages by number, written out verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from proxy.recall import handles
from proxy.recall.originals import Original

ARGS_LABEL_CHARS = 120


@dataclass(frozen=True)
class Part:
    """One item of a message as recall reads it."""

    role: str  # system | user | assistant | tool_call | tool_result | other
    text: str
    call_id: str | None = None
    name: str | None = None
    args: str = ""


Message = Sequence[Part]  # one protocol envelope


def _label(name: str | None, args: str) -> str:
    args = " ".join(args.split())
    if len(args) > ARGS_LABEL_CHARS:
        args = args[: ARGS_LABEL_CHARS - 3] + "..."
    return f"{name or 'tool'}({args})"


def span_text(messages: Sequence[Message], first: int) -> str:
    """Messages written out verbatim, each under a line naming its number and role."""
    out: list[str] = []
    for n, msg in enumerate(messages, start=first):
        for p in msg:
            if p.role == "tool_call":
                out.append(f"--- message {n}, tool call {p.name or 'tool'}:\n{p.args}")
            elif p.role == "tool_result":
                out.append(f"--- message {n}, tool result of {p.name or 'tool'}:\n{p.text}")
            elif p.text:
                out.append(f"--- message {n}, {p.role}:\n{p.text}")
    return "\n".join(out)


def replacements(original: Sequence[Message], forwarded: Sequence[Message], n_system: int) -> list[Original]:
    """The originals of every replacement the forwarded request carries, by handle (deduplicated)."""
    results: dict[str, Part] = {}
    calls: dict[str, Part] = {}
    client_texts: set[str] = set()
    for msg in original:
        for p in msg:
            if p.role == "tool_result" and p.call_id:
                results[p.call_id] = p
            elif p.role == "tool_call" and p.call_id:
                calls[p.call_id] = p
            elif p.role == "user":
                client_texts.add(p.text)
    found: dict[str, Original] = {}
    for msg in forwarded:
        for p in msg:
            if p.role == "tool_result" and p.call_id in results:
                orig = results[p.call_id]
                named = handles.in_text(p.text)
                if named and orig.text != p.text and named[-1] not in found:
                    call = calls.get(p.call_id)
                    found[named[-1]] = Original(named[-1], "tool output",
                                                _label(orig.name or (call.name if call else None), call.args if call else ""),
                                                orig.text)
            elif p.role == "user" and handles.RECALL_HEADING in p.text and p.text not in client_texts:
                for h, a, b in handles.spans_in(p.text):
                    if h in found or a < 1 or b < a or n_system + b > len(original):
                        continue
                    found[h] = Original(h, "messages", f"messages {a}-{b} of the conversation",
                                        span_text(original[n_system + a - 1:n_system + b], a))
    return list(found.values())
