"""Client text made safe to place in a summarizer prompt (pure): the one place that escapes it.

The summarizer reads the conversation as labelled blocks inside boundary tags (design.md § The history as text). Client
text must not close a block early (`</conversation>`), fake a block label (`[System]:` at the
start of a line) or a chat-template token (`<|im_start|>`, `[INST]`). A model reads look-alikes
as the real thing, so what is compared is normalized first: NFKC (fullwidth `＜／ｃｏｎｖｅｒｓａｔｉｏｎ＞`,
`［System］:`), zero-width characters and the BOM removed (`</conv\u200bersation>`,
`\ufeff[System]:`), and case ignored (`[SYSTEM]:`). Only the brackets of what matched are replaced
by entities (`&lt;`, `&gt;`, `&#91;`, `&#93;`); everything else the client wrote stays as it was.

Tool names (`tool_name`) are made one printable, clipped line before they enter any prompt or the
`Tool:` line: a name is a label, not a place for text.
"""

from __future__ import annotations

import bisect
import re
import unicodedata
from functools import lru_cache

BOUNDARY_TAGS = ("conversation", "previous-summary", "summary", "focus", "turn-prefix", "files")
MAX_TOOL_NAME_CHARS = 64  # OpenAI's own limit on a function name

# Invisible characters a comparison must not see: zero-width, joiners, BOM, soft hyphen, word
# joiner and the other format characters a renderer does not draw.
_INVISIBLE = "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0"
_INVISIBLE_RE = re.compile(f"[{_INVISIBLE}]")

# Each pattern names the brackets to replace `a` and `b`; each starts with its bracket (or the
# line start) so that the search skips ahead fast on ordinary text.
_ANGLE = re.compile(
    r"(?P<a><)(?:\s*/?\s*(?:" + "|".join(BOUNDARY_TAGS) + r")\b[^>]*"
    # ChatML / Llama 3 / Harmony `<|...|>`, Gemma turns, sentence markers, think tags.
    r"|\|[^|<>\n]{0,40}\||/?(?:s|start_of_turn|end_of_turn|think|thinking)\b)(?P<b>>)",
    re.IGNORECASE,
)
# The summary message's own wrapper (`<summary>`...`</summary>`), found as the boundary tags are.
_WRAPPER = re.compile(r"(?P<a><)\s*/?\s*summary\b[^>]*(?P<b>>)", re.IGNORECASE)
_INST = re.compile(r"(?P<a>\[)/?INST(?P<b>\])", re.IGNORECASE)  # Mistral
_LABEL = re.compile(
    r"^[^\S\n]*(?P<a>\[)(?:user|assistant|system|tool call|tool result[^\]\n]{0,80})\]:", re.IGNORECASE | re.MULTILINE
)
_TAG_PATTERNS = (_ANGLE, _INST)
_CLIENT_PATTERNS = (_LABEL, _ANGLE, _INST)
_ENTITY = {"<": "&lt;", ">": "&gt;", "[": "&#91;", "]": "&#93;"}


@lru_cache(maxsize=1)
def _fold_table() -> tuple[dict[int, str | None], re.Pattern[str]]:
    """Each character that NFKC changes into text holding ASCII (fullwidth letters and brackets,
    ligatures, small forms), with what it becomes; invisible characters map to None (removed).
    Also a pattern finding any of them, so text without any skips the folding."""
    table: dict[int, str | None] = {}
    for cp in range(0x80, 0x10000):
        c = chr(cp)
        if 0xD800 <= cp < 0xE000:
            continue
        if unicodedata.is_normalized("NFKC", c):  # most characters: a quick check, not a normalization
            continue
        n = unicodedata.normalize("NFKC", c)
        if any(ord(x) < 0x80 for x in n):
            table[cp] = n
    for m in re.finditer(f"[{_INVISIBLE}]", "".join(chr(c) for c in range(0x80, 0x10000) if not 0xD800 <= c < 0xE000)):
        table[ord(m.group())] = None
    chars = "".join(re.escape(chr(cp)) for cp in sorted(table))
    return table, re.compile(f"[{chars}]")


def _folded(text: str) -> str | None:
    """The text as compared (None: the text itself)."""
    table, needs = _fold_table()
    return text.translate(table) if needs.search(text) is not None else None


def _origins(text: str, positions: list[int]) -> list[int]:
    """For positions in the folded text, the index of the character each came from. Walks only
    the characters whose folding changes the length (reached only when something matched)."""
    table, needs = _fold_table()
    # Stretches of the folded text, in order: where each starts (folded, original), and whether
    # it is the expansion of one original character (else it is length-preserving text).
    seg_f, seg_o, seg_one = [0], [0], [False]
    shift = 0
    for m in needs.finditer(text):
        r = table[ord(m.group())]
        n = len(r) if r else 0
        if n == 1:
            continue
        i = m.start()
        seg_f.append(i + shift)
        seg_o.append(i)
        seg_one.append(True)
        shift += n - 1
        seg_f.append(i + 1 + shift)
        seg_o.append(i + 1)
        seg_one.append(False)
    out = []
    for p in positions:
        k = bisect.bisect_right(seg_f, p) - 1
        out.append(seg_o[k] if seg_one[k] else seg_o[k] + p - seg_f[k])
    return out


def _escape(text: str, patterns: tuple[re.Pattern[str], ...]) -> str:
    folded = _folded(text)
    view = text if folded is None else folded
    at: list[int] = []
    for pattern in patterns:
        for m in pattern.finditer(view):
            at += [m.start(g) for g, v in m.groupdict().items() if v is not None]
    if not at:
        return text
    chars = [view[p] for p in at]
    if folded is not None:
        at = _origins(text, at)
    replace = dict(zip(at, (_ENTITY[c] for c in chars)))
    out: list[str] = []
    last = 0
    for i in sorted(replace):
        out.append(text[last:i])
        out.append(replace[i])
        last = i + 1
    out.append(text[last:])
    return "".join(out)


def escape_untrusted(text: str) -> str:
    """Boundary tags and chat-template tokens escaped (text inside a block: a previous summary, a
    focus)."""
    return _escape(text, _TAG_PATTERNS)


def escape_wrapper_tags(text: str) -> str:
    """`<summary>` tags, look-alikes included, escaped (the summary inside the summary message's
    wrapper: the rest of it, our own `<files>` block among it, stays as it was)."""
    return _escape(text, (_WRAPPER,))


def escape_client_text(text: str) -> str:
    """Boundary tags, template tokens and lines imitating our block labels escaped (a message's
    text, a tool call's arguments)."""
    return _escape(text, _CLIENT_PATTERNS)


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]|" + _INVISIBLE_RE.pattern)


def tool_name(name: object) -> str:
    """A tool name fit for a prompt: NFKC, one line (control and invisible characters become a
    space), no backticks (the system prompt quotes the name in them), at most 64 characters,
    then escaped like any client text. "tool" when nothing is left."""
    text = unicodedata.normalize("NFKC", name if isinstance(name, str) else str(name))
    text = _UNPRINTABLE.sub(" ", text).replace("`", "'")
    text = " ".join(text.split())[:MAX_TOOL_NAME_CHARS].strip()
    return escape_client_text(text) if text else "tool"

