"""Whether a summarizer's answer is a summary, and completing its structure (design.md § Tiers): pure.

Real models skip headings, so a summary that lacks some is accepted and completed by code: every
missing heading is added, in the format's order, with "none recorded", so the forwarded structure
never varies. What is still refused is an answer that is not a summary at all: empty text, far
over its output cap, or a reply that carries the conversation on (a tool call, or no heading and
nothing summary-shaped about it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

NONE_RECORDED = "- none recorded"
OVER_CAP = 2  # an answer longer than this many times its output cap is a failure

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_ANY_HEADING = re.compile(r"(?m)^#{1,6}\s+\S")
# Tool calls written as text, as small models do when they carry the conversation on.
_TEXT_TOOL_CALL = re.compile(
    r"<tool_call>|<function_call>|\"tool_calls\"\s*:|^\s*\{\s*\"name\"\s*:\s*\"[^\"]+\"\s*,\s*\"(?:arguments|parameters)\"",
    re.IGNORECASE | re.MULTILINE,
)
# How replies to a person open (and summaries do not).
_REPLY_OPENER = re.compile(
    r"^\s*(?:sure|ok(?:ay)?|certainly|of course|absolutely|great|thanks|thank you|hello|hi|hey|yes|no problem|"
    r"i(?:'ll| will| can| am|'m| have|'ve)|let me|let's|here(?:'s| is| are)|you(?:'re| are| can| should)|"
    r"sorry|alright|we|好的|当然|我来|让我)\b",
    re.IGNORECASE,
)
# A summary speaks of the conversation in the third person; a reply speaks to its reader.
_ABOUT_THE_CONVERSATION = re.compile(r"\b(?:the|a) (?:user|assistant|agent|conversation)\b|用户|助手", re.IGNORECASE)
_ITEM = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+\S")


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str = ""  # why not: empty | over_cap | tool_call | reply | missing_headings
    detail: str = ""


def judge(text: str, *, output_cap: int, count: Callable[[str], int], required: Sequence[str] = ()) -> Verdict:
    """Accept any non-empty summary; refuse what is not one. `required` headings are the
    operator's opt-in strictness (compaction.required_headings, default none)."""
    if not text.strip():
        return Verdict(False, "empty", "the summarizer returned an empty summary")
    if _TEXT_TOOL_CALL.search(text):
        return Verdict(False, "tool_call", "the answer is a tool call, not a summary")
    if not _ANY_HEADING.search(text) and reads_as_reply(text):
        return Verdict(False, "reply", "the answer has no heading and reads as a reply to the conversation")
    if count(text) > OVER_CAP * output_cap:
        # An upstream that ignores the output cap (a runaway answer) would make the forwarded
        # request larger than the original; the slack covers tokenizers unlike tiktoken's.
        return Verdict(False, "over_cap", f"the summary is far over its {output_cap}-token cap")
    if missing := missing_headings(text, required):
        return Verdict(False, "missing_headings", f"the summary lacks required headings: {', '.join(missing)}")
    return Verdict(True)


def reads_as_reply(text: str) -> bool:
    """A heading-less answer that is not summary-shaped: it opens the way a reply does, ends with
    a question, or is prose that does not speak of the conversation in the third person (weak
    models do summarize in prose: "The user asked ...")."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if _REPLY_OPENER.match(lines[0]) or lines[-1].rstrip().endswith(("?", "？")):
        return True
    if _ABOUT_THE_CONVERSATION.search(text):
        return False
    items = sum(1 for ln in lines if _ITEM.match(ln))
    return items * 2 < len(lines)  # mostly prose


def missing_headings(text: str, required: Sequence[str]) -> list[str]:
    return [h for h in required if not re.search(r"(?m)^" + re.escape(h) + r"\s*$", text)]


def complete_headings(text: str, headings: Sequence[str]) -> str:
    """The summary with every heading of the format, in order; a missing one gets "none recorded"
    (a parent heading such as `## Progress`, whose subsections follow it, stays empty). Text under
    headings the format does not know stays with the section above it; text before the first known
    heading goes to the last section (Critical Context in our format)."""
    known = {_norm(h): h for h in headings}
    sections: dict[str, list[str]] = {}
    preamble: list[str] = []
    current: list[str] = preamble
    for line in text.strip().splitlines():
        m = _HEADING.match(line)
        key = _norm(line) if m else None
        if key in known and known[key] not in sections:
            current = sections.setdefault(known[key], [])
            continue
        current.append(line)
    body_of = {h: "\n".join(lines).strip() for h, lines in sections.items()}
    if any(ln.strip() for ln in preamble) and headings:
        last = headings[-1]
        body_of[last] = "\n".join(p for p in ("\n".join(preamble).strip(), body_of.get(last, "")) if p)
    out: list[str] = []
    for i, h in enumerate(headings):
        body = body_of.get(h, "")
        if not body and not _is_parent(headings, i):
            body = NONE_RECORDED
        out.append(f"{h}\n{body}" if body else h)
    return "\n\n".join(out)


def _norm(line: str) -> str:
    return " ".join(line.strip().rstrip("#").split()).lower()


def _is_parent(headings: Sequence[str], i: int) -> bool:
    """A heading directly followed by a deeper one (`## Progress` before `### Done`)."""
    if i + 1 >= len(headings):
        return False
    level = len(headings[i]) - len(headings[i].lstrip("#"))
    nxt = len(headings[i + 1]) - len(headings[i + 1].lstrip("#"))
    return nxt > level
