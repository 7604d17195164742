"""The parts of a tool-result note written by code, not by the model (pure functions).

The agent must be able to tell a note from raw output and act on every identifier in the output,
even when the summarizer is sloppy: the header line is made canonical and the identifiers the
model's text dropped are added under `## Identifiers preserved`.
"""

from __future__ import annotations

import re

IDENTIFIERS_HEADING = "## Identifiers preserved"
SIZE_HEADING = "## Original size"
MAX_APPENDED_IDENTIFIERS_CHARS = 8000

# A first line the model meant as the header but wrote loosely: "**Summary of bash output:**".
_LOOSE_HEADER = re.compile(r"^\W*summary of .{0,120} output\W*$", re.IGNORECASE)
_HEADING = re.compile(r"^#{1,6} ", re.MULTILINE)


def header(tool_name: str) -> str:
    return f"[Summary of {tool_name} output]"


def with_header(tool_name: str, text: str) -> str:
    """The note starting with the exact header line naming the tool."""
    first, _, rest = text.partition("\n")
    if first.strip() == header(tool_name):
        return text
    if _LOOSE_HEADER.match(first.strip()):
        return header(tool_name) + "\n" + rest
    return header(tool_name) + "\n" + text


def with_identifiers(text: str, missing: list[str]) -> str:
    """Adds the missing identifiers to the note's `## Identifiers preserved` section (made when the
    model left it out, before `## Original size`), bounded so a list of thousands stays a note."""
    if not missing:
        return text
    bullets = "\n".join(f"- {i}" for i in _bounded(missing))
    at = _section_end(text, IDENTIFIERS_HEADING)
    if at is not None:
        return text[:at].rstrip("\n") + "\n" + bullets + "\n" + _after(text, at)
    section = f"{IDENTIFIERS_HEADING}\n{bullets}\n"
    size = re.search(rf"^{re.escape(SIZE_HEADING)}\s*$", text, re.MULTILINE)
    if size is not None:
        return text[: size.start()].rstrip("\n") + "\n\n" + section + "\n" + text[size.start():]
    return text.rstrip("\n") + "\n\n" + section.rstrip("\n")


def _bounded(missing: list[str]) -> list[str]:
    kept: list[str] = []
    used = 0
    for ident in missing:
        used += len(ident) + 3
        if used > MAX_APPENDED_IDENTIFIERS_CHARS:
            kept.append(f"... and {len(missing) - len(kept)} more")
            break
        kept.append(ident)
    return kept


def _section_end(text: str, heading: str) -> int | None:
    """Offset where the section under `heading` ends (the next heading, or the end of the text)."""
    start = re.search(rf"^{re.escape(heading)}\s*$", text, re.MULTILINE)
    if start is None:
        return None
    nxt = _HEADING.search(text, start.end())
    return nxt.start() if nxt else len(text)


def _after(text: str, at: int) -> str:
    rest = text[at:]
    return "\n" + rest if rest else ""
