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
from array import array

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


# How each character of the Basic Multilingual Plane the comparison has met folds, worked out when
# first met: the whole plane's table cost ~25 ms of the first summary of a process, where a text
# holds a few dozen distinct non-ASCII characters. Bounded: one byte a character of the plane
# (0 not met, 1 as is, 2 folds: `_FOLDS`), the ~1,000 that fold, and those met as is in order (two
# bytes each). Past the plane and surrogates nothing folds, as before.
_BMP = 0x10000
_MET = bytearray(_BMP)
_FOLDS: dict[int, str | None] = {}
_AS_IS = array("H")
_NEVER = r"\x00-\x7f\ud800-\udfff\U00010000-\U0010ffff"  # (characters that never fold)
_NOTHING = re.compile("(?!)")
# (characters met when the first was made, a pattern finding those not met; characters that fold
# when the second was made, a pattern finding them): made again by _patterns
_PATTERNS: list = [0, re.compile(f"[^{_NEVER}]"), 0, _NOTHING]


def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """A pattern finding the characters not met (and those met since it was made: made again
    once a quarter more were), and one finding those that fold (made again for each)."""
    met, unknown, folds, folding = _PATTERNS
    n, k = len(_AS_IS), len(_FOLDS)
    fold = "".join(map(chr, list(_FOLDS))) if k != folds or n + k - met > met // 4 else ""
    if n + k - met > met // 4:
        unknown = re.compile(f"[^{_NEVER}{''.join(map(chr, _AS_IS[:n]))}{fold}]")
        met = n + k
    if k != folds:
        folding, folds = re.compile(f"[{fold}]"), k
    _PATTERNS[:] = [met, unknown, folds, folding]
    return unknown, folding


def _learn(cp: int) -> None:
    """How one character folds: to what NFKC makes of it when that holds ASCII (fullwidth letters
    and brackets, ligatures, small forms), to nothing when invisible; else it is compared as is."""
    c = chr(cp)
    fold: str | None | bool = False  # (False: as is)
    if _INVISIBLE_RE.match(c):
        fold = None
    elif not unicodedata.is_normalized("NFKC", c):  # the quick check first: most characters pass it
        n = unicodedata.normalize("NFKC", c)
        fold = n if any(ord(x) < 0x80 for x in n) else False
    if fold is False:
        _AS_IS.append(cp)
        _MET[cp] = 1
        return
    _FOLDS[cp] = fold
    _MET[cp] = 2


def _folds(text: str) -> bool:
    """Whether the comparison changes `text` (it reads text.translate(_FOLDS)): its characters
    not met yet worked out first."""
    if text.isascii():
        return False
    unknown, _ = _patterns()
    if unknown.search(text) is not None:
        for c in set(unknown.findall(text)):
            if not _MET[ord(c)]:
                _learn(ord(c))
    return _patterns()[1].search(text) is not None


def _origins(text: str, positions: list[int]) -> list[int]:
    """For positions in the folded text, the index of the character each came from. Walks only
    the characters whose folding changes the length (reached only when something matched)."""
    resized = "".join(chr(cp) for cp, r in list(_FOLDS.items()) if r is None or len(r) != 1)
    # Stretches of the folded text, in order: where each starts (folded, original), and whether
    # it is the expansion of one original character (else it is length-preserving text).
    seg_f, seg_o, seg_one = [0], [0], [False]
    shift = 0
    for m in re.finditer(f"[{resized}]", text) if resized else ():
        r = _FOLDS[ord(m.group())]
        n = len(r) if r else 0
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
    folds = _folds(text)
    view = text.translate(_FOLDS) if folds else text
    at: list[int] = []
    for pattern in patterns:
        for m in pattern.finditer(view):
            at += [m.start(g) for g, v in m.groupdict().items() if v is not None]
    if not at:
        return text
    chars = [view[p] for p in at]
    if folds:
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

