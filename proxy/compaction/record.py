"""The stored summary record and the rendering of its text (pure).

A record covers the first `covered` non-system messages of a conversation, identified by the hash
chain over them. `summary` is the final text (model part + the parts code writes), stored once so
the forwarded bytes never change while the record is in use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import orjson

from proxy.compaction.extract import capped_lines, render_files


@dataclass
class SummaryRecord:
    covered: int  # non-system messages summarized
    chain: str  # hex hash chain over them
    summary: str
    files: dict[str, str] = field(default_factory=dict)
    identifiers: list[str] = field(default_factory=list)
    # kept tool outputs too big for the target: original message digest (hex) -> max tokens. Part
    # of the record so that every request carrying it forwards the same bytes.
    clamped: dict[str, int] = field(default_factory=dict)
    created: float = 0.0
    prepared: bool = False  # made ahead of time and not yet carried by a request

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_bytes(cls, raw: bytes) -> "SummaryRecord | None":
        try:
            data = orjson.loads(raw)
            return cls(**data)
        except (orjson.JSONDecodeError, TypeError):
            return None


def render_summary(
    model_text: str,
    *,
    turn_prefix: str | None,
    files: dict[str, str],
    identifiers: list[str],
    errors: list[str],
    latest_requests: list[str],
    extras_chars: int,
) -> str:
    """Model summary + split-turn context + the deterministic blocks.

    The files and identifier lists share `extras_chars` (the room the plan left for them), so the
    summary stays the size the cut was planned for; the user's requests are never cut.
    """
    parts = [model_text.strip()] if model_text.strip() else []
    if turn_prefix:
        parts.append(
            "## Current Turn So Far\n"
            "(The request below started the turn that the kept messages continue.)\n\n" + turn_prefix.strip()
        )
    room = extras_chars
    if files:
        block = render_files(files, room // 2 if identifiers or errors else room)
        parts.append("## Files Touched\n" + block)
        room -= len(block)
        identifiers = [i for i in identifiers if f"- {i} (" not in block]  # listed already
    if identifiers or errors:
        lines = [f"- {i}" for i in identifiers] + [f"- error: {e}" for e in errors]
        parts.append("\n".join(["## Identifiers (verbatim from the summarized messages)", *capped_lines(lines, room)]))
    if latest_requests:
        block = ["## Latest User Request (verbatim)", latest_requests[0]]
        if len(latest_requests) > 1:
            block += ["", "Last substantive request before it (verbatim):", latest_requests[1]]
        parts.append("\n".join(block))
    return "\n\n".join(parts)
