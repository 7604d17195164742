"""Which originals a forwarded request stands in for, found from the handles its replacements name
(design.md § Recall). Pure functions over `Part`s, so every protocol feeds them the same way.

A tool result whose forwarded text names a handle and differs from what the client sent was
replaced (a stub, a note): its original is the client's output for the same call id. A summary
(new text, not the client's) names its spans in its `## Recall` block: their originals are the
client's messages by number, written out verbatim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from proxy.recall import handles
from proxy.recall.originals import Original

ARGS_LABEL_CHARS = 120
SPAN_OUTPUT_CHARS = 8000  # a tool output larger than this is kept apart from the spans covering it
SPAN_HEAD_CHARS, SPAN_TAIL_CHARS = 1200, 400


@dataclass(frozen=True)
class Part:
    """One item of a message as recall reads it."""

    role: str  # system | user | assistant | tool_call | tool_result | other
    text: str
    call_id: str | None = None
    name: str | None = None
    args: str = ""


Message = Sequence[Part]  # one protocol envelope

_ROLES = {"system": "system", "user": "user", "assistant": "assistant", "opaque": "other"}


def parts_of(conv: Any) -> list[list[Part]]:
    """A neutral conversation (proxy/model.py) as recall's parts, one list per envelope."""
    return [envelope_parts(env) for env in conv.envelopes]


def request_parts(request: Any) -> list[list[Part]]:
    """The parts of a request's own conversation: those of the envelopes the previous request of
    the conversation shared are not made again (a long history has thousands)."""
    return request.per_envelope("recall.parts", envelope_parts)


def envelope_parts(env: Any) -> list[Part]:
    parts = []
    for it in env.items:
        kind = it.kind.value
        if kind == "tool_call":
            parts.append(Part("tool_call", "", it.call_id, it.name, it.args))
        elif kind == "tool_result":
            parts.append(Part("tool_result", it.text, it.call_id, it.name))
        else:
            parts.append(Part(_ROLES.get(kind, "other"), it.text))
    return parts


def _label(name: str | None, args: str) -> str:
    args = " ".join(args.split())
    if len(args) > ARGS_LABEL_CHARS:
        args = args[: ARGS_LABEL_CHARS - 3] + "..."
    return f"{name or 'tool'}({args})"


def span_text(messages: Sequence[Message], first: int, apart: dict[str, Original] | None = None) -> str:
    """Messages written out verbatim, each under a line naming its number and role. A tool output
    over SPAN_OUTPUT_CHARS is kept as an original of its own (added to `apart`, under the handle a
    note of it names) and the span carries its head and tail with that handle: a large output is
    stored once, not again in every span that covers it."""
    return "\n".join(span_parts(messages, first, apart))


def span_parts(messages: Sequence[Message], first: int, apart: dict[str, Original] | None = None) -> list[str]:
    """The lines-long pieces span_text joins: each message's line, then its text (the client's
    string itself, whose identifiers are known already: textfacts)."""
    out: list[str] = []
    for n, msg in enumerate(messages, start=first):
        for p in msg:
            if p.role == "tool_call":
                out += [f"--- message {n}, tool call {p.name or 'tool'}:", p.args]
            elif p.role == "tool_result" and apart is not None and len(p.text) > SPAN_OUTPUT_CHARS:
                h = handles.of_text(p.text)
                apart.setdefault(h, Original(h, "tool output", f"{p.name or 'tool'} (message {n})", p.text))
                out.append(f"--- message {n}, tool result of {p.name or 'tool'} ({len(p.text)} characters; the whole "
                           f"output: recall id {h}):\n{p.text[:SPAN_HEAD_CHARS]}\n[...]\n{p.text[-SPAN_TAIL_CHARS:]}")
            elif p.role == "tool_result":
                out += [f"--- message {n}, tool result of {p.name or 'tool'}:", p.text]
            elif p.text:
                out += [f"--- message {n}, {p.role}:", p.text]
    return out


def replacements(original: Sequence[Message], forwarded: Sequence[Message], n_system: int,
                 known: Callable[[str], bool] = lambda handle: False) -> list[Original]:
    """The originals of every replacement the forwarded request carries, by handle (deduplicated).
    A span whose handle is `known` (stored already) is listed without its text: writing out a long
    history again on every request that reuses its summary would cost more than all the rest."""
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
    apart: dict[str, Original] = {}  # large outputs inside spans, kept on their own
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
                    parts = [] if known(h) else span_parts(original[n_system + a - 1:n_system + b], a, apart)
                    found[h] = Original(h, "messages", f"messages {a}-{b} of the conversation", "\n".join(parts),
                                        tuple(parts))
    return [*found.values(), *(o for h, o in apart.items() if h not in found)]
