"""The `recall id` handles that stubs, notes and summaries carry, written by code (design.md § Recall).

A handle is derived from what it stands for (the original's digest, or the hash chain of a
summarized span), so the text that names it is the same on every request and on every replica.
The recall layer reads the handles back out of the forwarded text to know which originals to keep:
the stages only write them.
"""

from __future__ import annotations

import re
from typing import Iterable

from proxy.hashing import content_digest

HANDLE_CHARS = 12
_HANDLE = re.compile(r"recall id ([0-9a-f]{6,64})")
_SPAN = re.compile(r"^- recall id ([0-9a-f]{6,64}): messages (\d+)-(\d+)\b", re.MULTILINE)
RECALL_HEADING = "## Recall"


def of_text(text: str) -> str:
    """The handle of one original text (a tool output made into a note)."""
    return content_digest(text)[:HANDLE_CHARS]


def of_span(chain_hex: str) -> str:
    """The handle of a summarized span, from the hash chain over the messages up to its end."""
    return chain_hex[:HANDLE_CHARS]


def note_line(handle: str) -> str:
    """The last line of a tool-output note."""
    return f"[the whole output, verbatim: recall id {handle}]"


def in_text(text: str) -> list[str]:
    """Every handle a text names, in order."""
    return list(dict.fromkeys(_HANDLE.findall(text)))


def recall_block(spans: Iterable[tuple[str, int, int]]) -> str:
    """The summary's block naming the originals of every span it covers: (handle, first, last),
    message numbers counted from 1 after the system part."""
    lines = [f"- recall id {h}: messages {a}-{b}, verbatim" for h, a, b in spans]
    if not lines:
        return ""
    return "\n".join([RECALL_HEADING, "(the summarized messages themselves, word for word, can be looked up)", *lines])


def spans_in(summary: str) -> list[tuple[str, int, int]]:
    """The spans a summary's recall block names."""
    return [(h, int(a), int(b)) for h, a, b in _SPAN.findall(summary)]
