"""The parts of a summary written by code, not by the model (design.md § The summary's shape): pure functions.

They hold even when the model is sloppy: which files tool calls read or wrote, the identifiers the
model's text dropped, the user's constraints and latest request verbatim.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence

import orjson

# Identifiers are found by proxy/identifiers.py (shared with the tool-result notes); the
# compaction modules read them through here.
from proxy.identifiers import PIECE_CHARS, dropped, find_error_lines, find_identifiers, rank_identifiers  # noqa: F401
from proxy import textfacts
from proxy.model import Envelope, Kind

def span_identifiers(envelopes: Sequence[Envelope]) -> list[str]:
    """find_identifiers(span_text(envelopes)), from each text's identifiers (found once per text,
    textfacts): no identifier crosses a line, so the joined text's are the texts' in order, each
    once."""
    texts = [e.text for e in envelopes] + [call.args for e in envelopes for call in e.calls]
    return list(dict.fromkeys(i for t in texts for i in textfacts.facts(t).identifiers))


def span_text(envelopes: Iterable[Envelope]) -> str:
    """Message text first, tool-call arguments after: when the identifier list is capped, those
    found first are kept, and the files block already lists the paths that arguments name."""
    return "\n".join(span_parts(envelopes))


def span_joined(envelopes: Iterable[Envelope]) -> tuple[str, list[str], list[str]]:
    """(span_text, the parts it joins, find_identifiers of it): the identifiers from the parts'
    cached ones (textfacts.joined_identifiers), not a second scan of the span written out."""
    parts = span_parts(envelopes)
    text = "\n".join(parts)
    return text, parts, textfacts.joined_identifiers(text, parts)


def span_parts(envelopes: Iterable[Envelope]) -> list[str]:
    """The texts span_text joins, in its order (their facts are cached one by one: textfacts)."""
    texts: list[str] = []
    args: list[str] = []
    for e in envelopes:
        texts.append(e.text)
        args += [call.args for call in e.calls]
    return texts + args


# -- files -----------------------------------------------------------------------------------
_PATH_KEYS = ("path", "file_path", "filepath", "filename", "file", "target_file", "source", "destination",
              "src", "dst", "notebook_path", "old_path", "new_path")
_PATH_LIST_KEYS = ("paths", "files", "file_paths")
_WRITE_RE = re.compile(r"write|edit|create|replace|patch|apply|insert|delete|remove|move|rename|save|update|append|mkdir", re.I)
_READ_RE = re.compile(r"read|view|cat|open|get|list|search|grep|find|show|ls|stat|head|tail|glob", re.I)
MAX_FILES = 50


def _op_for(tool: str, args: dict[str, Any]) -> str:
    command = args.get("command")
    if isinstance(command, str) and len(command) < 40:  # str_replace_editor style sub-commands
        if _WRITE_RE.search(command):
            return "write"
        if _READ_RE.search(command):
            return "read"
    if _WRITE_RE.search(tool):
        return "write"
    return "read"


def files_touched(envelopes: Iterable[Envelope]) -> dict[str, str]:
    """path -> "read" | "write" | "both", from the arguments of tool calls, in first-seen order."""
    files: dict[str, str] = {}
    for e in envelopes:
        for call in e.calls:
            try:
                args = orjson.loads(call.args or "{}")
            except orjson.JSONDecodeError:
                continue
            if not isinstance(args, dict):
                continue
            paths = [args[k] for k in _PATH_KEYS if isinstance(args.get(k), str)]
            for k in _PATH_LIST_KEYS:
                if isinstance(args.get(k), list):
                    paths += [p for p in args[k] if isinstance(p, str)]
            op = _op_for(call.name or "", args)
            for p in paths:
                p = p.strip()
                if not p or len(p) > 500 or "\n" in p:
                    continue
                files[p] = merge_op(files.get(p), op)
    return files


def merge_op(a: str | None, b: str) -> str:
    if a is None or a == b:
        return b
    return "both"


def merge_files(old: dict[str, str], new: dict[str, str]) -> dict[str, str]:
    out = dict(old)
    for p, op in new.items():
        out[p] = merge_op(out.get(p), op)
    return out


def capped_lines(lines: list[str], max_chars: int, max_lines: int | None = None) -> list[str]:
    """As many whole lines as fit, then one "- ... and N more" line for the rest."""
    out: list[str] = []
    used = 0
    for line in lines:
        if (max_lines is not None and len(out) >= max_lines) or used + len(line) + 1 > max_chars:
            break
        out.append(line)
        used += len(line) + 1
    if len(out) < len(lines):
        out.append(f"- ... and {len(lines) - len(out)} more")
    return out


def render_files(files: dict[str, str], max_chars: int = 1 << 30) -> str:
    lines = capped_lines([f"- {p} ({op})" for p, op in files.items()], max_chars, MAX_FILES)
    return "<files>\n" + "\n".join(lines) + "\n</files>"


# -- the user's request ----------------------------------------------------------------------
_GO_ON = (r"(?:ok(?:ay)?|k|yes|yep|sure|go(?: on| ahead)?|continue|proceed|next|do it|please do|"
          r"sounds good|thanks?|thank you|继续|好的?|可以|是的?|行|嗯)")
# one or more of them: "OK, continue.", "yes, go ahead", "好的，继续"
_CONTINUATION = re.compile(rf"^\s*{_GO_ON}(?:[\s,，.!。！]+{_GO_ON})*[\s.!。！]*$", re.IGNORECASE)


def is_continuation(text: str) -> bool:
    return bool(_CONTINUATION.match(text))


def latest_requests(envelopes: Sequence[Envelope], start: int, end: int) -> list[str]:
    """What a summary of envelopes[start:end] must carry verbatim so that the user's intent is never
    only a paraphrase (design.md § What code keeps): the conversation's latest user message when it falls in the span
    and, if that is a bare "ok"/"continue", the last substantive request before it; when the latest
    user message is a continuation that is kept (at or after `end`), the substantive request
    before it if that is summarized (before `end`). The first item is always the latest message
    (it may be kept, and is then not repeated)."""
    users = [i for i in range(len(envelopes)) if envelopes[i].kind is Kind.USER]
    if not users or users[-1] < start:
        return []
    latest = envelopes[users[-1]].text
    substantive = None
    if is_continuation(latest):
        for i in reversed(users[:-1]):
            text = envelopes[i].text
            if text.strip() and not is_continuation(text):
                substantive = (i, text)
                break
    if users[-1] < end:
        return [latest] + ([substantive[1]] if substantive else [])
    if substantive is not None and substantive[0] < end:
        return [latest, substantive[1]]
    return []


# -- the user's constraints and corrections ----------------------------------------------------
# A sentence ends at . ! ? followed by a space or the end (a path's dot does not end one).
_SENTENCE = re.compile(r"(?:[^.!?\n。！？]|[.!?](?=[^\s.!?]))+[.!?。！？]?")
_CONSTRAINT = re.compile(
    r"\b(?:never|always|do not|don't|must(?: not)?|mustn't|avoid|only use|instead of|rather than|prefer|"
    r"make sure|correction|actually,|not\s+\w+,?\s+but|use [\w.-]+,? not)\b|禁止|不要|必须|务必|改正",
    re.IGNORECASE,
)
MAX_CONSTRAINT_CHARS = 400


def find_constraints(envelopes: Iterable[Envelope]) -> list[str]:
    """Sentences of user messages that state a constraint, a preference or a correction, verbatim
    ("Never use floats for money.", "Use ruff, not black."), in order, without duplicates."""
    out: list[str] = []
    for e in envelopes:
        if e.kind is not Kind.USER:
            continue
        for sent in _SENTENCE.findall(e.text):
            sent = sent.strip()
            if sent and len(sent) <= MAX_CONSTRAINT_CHARS and _CONSTRAINT.search(sent) and sent not in out:
                out.append(sent)
    return out


def tool_errors(envelopes: Iterable[Envelope]) -> list[str]:
    """find_error_lines of the tool outputs among the envelopes joined (where error lines come
    from: prose that says "failed" is not one), from each output's lines, found once
    (textfacts.joined_errors)."""
    parts = [it.text for e in envelopes for _, it in e.results]
    return textfacts.joined_errors("\n".join(parts), parts)


def user_text(envelopes: Iterable[Envelope]) -> str:
    return "\n".join(e.text for e in envelopes if e.kind is Kind.USER)
