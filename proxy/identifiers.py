"""Identifiers in text: finding them (paths and file names, URLs, hashes, tickets, IDs, exception
names, error lines) and ranking
them by salience (design.md § What code keeps). Pure functions, shared by the tool-result notes and the summaries.
"""

from __future__ import annotations

import re
import threading
from bisect import bisect_right
from collections import OrderedDict
from typing import Callable, Iterable

from proxy.farm import farm

_URL = re.compile(r"https?://[^\s<>\"'`)\]}]+")
_TICKET = re.compile(r"\b[A-Z][A-Z0-9]{1,9}-\d+\b")  # LED-7112, PROJ-42
# a file name without a directory (tox.ini, CHANGELOG.rst, from a directory listing): by the
# extensions of source, config and docs, so prose with a dot (e.g. "i.e.", 3.12) is none
_FILE_NAME = re.compile(
    r"(?<![\w./@-])[\w][\w.+-]*\.(?:py|pyi|ini|cfg|toml|rst|md|txt|json|ya?ml|lock|js|mjs|ts|tsx|jsx|go|rs|java|kt|rb|"
    r"php|swift|c|h|cc|cpp|hpp|cs|sh|sql|html|css|xml|csv|conf|in|mk|gradle|proto|ipynb)\b(?![\w/-])")
# exception class names (ValueError, FieldInstanceResolutionError): agents look errors up by them
_EXCEPTION = re.compile(r"\b[A-Z][A-Za-z0-9]*(?:Error|Exception|Warning)\b")
# Each pattern with the strings one of which every match holds: a text holding none of them is
# not run through it (a dozen regular expressions over every character are most of a scan's cost,
# and prose seldom holds an "@", a "/" or an exception's name). Empty: always run.
_IDENT_NEEDS: list[tuple[re.Pattern[str], tuple[str, ...]]] = [
    (_URL, ("://",)),
    (_TICKET, ("-",)),
    (re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b"), ("@",)),
    (re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"), ("-",)),
    # paths: absolute, home- or dot-relative, or relative with a directory and an extension (the
    # slash of a closing tag, </system-reminder>, starts none: agents wrap context in such tags)
    (re.compile(r"(?<![\w/.<])(?:~|\.{1,2})?/(?:[\w.@+-]+/)*[\w.@+-]+"), ("/",)),
    (re.compile(r"\b(?:[\w.@+-]+/)+[\w@+-]+\.[A-Za-z0-9]{1,8}\b"), ("/",)),
    # hex hashes (7+), containing at least one digit and one letter
    (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,64}\b"), ()),
    # IDs mixing letters and digits: OI5L9G, sofia_kim_7287, HAT001
    (re.compile(r"\b(?=[A-Za-z0-9_-]*[A-Za-z])(?=[A-Za-z0-9_-]*\d)[A-Za-z0-9][A-Za-z0-9_-]{3,}[A-Za-z0-9]\b"), ()),
    (re.compile(r"(?<![\w.])\d{4,}(?:\.\d+)?\b"), ()),
    (_FILE_NAME, (".",)),
    (_EXCEPTION, ("Error", "Exception", "Warning")),
]
# function names in Python tracebacks: the one pattern that reads across a space (kept out of the
# runs below, run over the whole text)
_TRACE_FUNC = re.compile(r"(?<=, in )[A-Za-z_][\w.]*")
# No other pattern matches across white space, and each sees white space beside a match as it sees
# a text's start or end. So a text's matches are its runs' (of non-space characters); and a run of
# prose (a letter, lower-case letters, at most one stop after them) has none: no digit, no capital
# after the first letter, no "/", "@", "-" or extension. Only the other runs are scanned, joined
# by newlines: prose's words are most of a user's or an answer's characters.
_WORDY_RUN = re.compile(r"(?<!\S)(?![A-Za-z][a-z]*[.,;:]?(?!\S))\S+")
_ERROR_LINE = re.compile(
    r"^.*\b(?:[A-Z]\w*(?:Error|Exception)|Traceback|error|failed|fatal|panic)\b.*$", re.MULTILINE
)
# Bare slashes and dots, and percentages, are not identifiers (numbers of 4+ digits are).
_NOT_AN_ID = re.compile(r"^(?:/+|\.+/?|[\d.]+%)$")
MAX_ERROR_LINES = 20
MAX_ERROR_LINE_CHARS = 300


PIECE_CHARS = 1 << 18
# What extraction reads of one text: all of it up to this, else its head and tail, half each. A
# tool output of tens of MB (the body limit allows them) would be a minute of regular expressions
# holding the interpreter (a worker thread still takes the GIL from the event loop); its note keeps
# head and tail too, and errors and totals sit at the end (design.md § Oversized tool results).
SCAN_CHARS = 1 << 19


def scanned(text: str) -> str:
    """`text`, or over SCAN_CHARS its head and tail cut at line ends: what extraction reads."""
    if len(text) <= SCAN_CHARS:
        return text
    head, tail = line_cuts(text)
    half = SCAN_CHARS // 2
    return text[:head or half] + text[tail or len(text) - half:]


def line_cuts(text: str) -> tuple[int, int]:
    """Where `scanned` cuts a text over SCAN_CHARS: the end of its head and the start of its tail
    at line ends (0 for a cut with no line end before it: there it cuts mid-line)."""
    half = SCAN_CHARS // 2
    return text.rfind("\n", 0, half) + 1, text.find("\n", len(text) - half) + 1


def _pieces(text: str) -> Iterable[tuple[int, int]]:
    """(start, end) of consecutive pieces of about PIECE_CHARS, each ending after a newline. No
    pattern here crosses a line, so matching piece by piece finds what one pass would; and a scan
    of megabytes without a match is not one long call holding the GIL, which would stall the event
    loop while this runs in a worker thread."""
    start, n = 0, len(text)
    while start < n:
        end = text.find("\n", start + PIECE_CHARS) + 1 or n
        yield start, end
        start = end


def _spans(text: str) -> list[tuple[int, int, str]]:
    """Every identifier match as (start, end, token), in order, longer first at a start."""
    text = scanned(text)
    starts, runs = _wordy_runs(text)
    joined = "\n".join(runs)
    _joined.put(text, joined)
    found: list[tuple[int, int, str]] = []
    for pat, needs in _IDENT_NEEDS:
        if needs and not any(n in joined for n in needs):
            continue
        _matches(found, joined, pat)
    spans = _placed(found, starts, runs)
    if ", in " in text:
        _matches(spans, text, _TRACE_FUNC)
    spans.sort(key=lambda s: (s[0], -s[1]))
    return spans


def unworded(text: str) -> str:
    """`text`'s runs that are not prose's words, joined by newlines: all that a pattern matching
    no prose word and crossing no white space (seeing it as a text's edge) needs to read. The
    identifier scan's, when it read this text lately."""
    joined = _joined.take(text)
    return "\n".join(_WORDY_RUN.findall(text)) if joined is None else joined


class _Joined:
    """text -> its runs joined, as the identifier scan read them, until the symbols' read of the
    same text takes them (recall reads a text's symbols after its identifiers: a masked output at
    the crossing, a summarized span's messages in the preparation that ranked their identifiers),
    so the runs are found once a text. Bounded by entries and characters, oldest dropped first."""

    MAX_ENTRIES, MAX_CHARS, MIN_CHARS = 1024, 8 << 20, 256

    def __init__(self) -> None:
        self._d: OrderedDict[str, str] = OrderedDict()
        self.chars = 0
        self._lock = threading.Lock()  # (scans run in worker threads too)

    def put(self, text: str, joined: str) -> None:
        if len(text) < self.MIN_CHARS or len(joined) > self.MAX_CHARS:
            return
        with self._lock:
            self.chars += len(joined) - len(self._d.pop(text, ""))
            self._d[text] = joined
            while len(self._d) > self.MAX_ENTRIES or self.chars > self.MAX_CHARS:
                self.chars -= len(self._d.popitem(last=False)[1])

    def take(self, text: str) -> str | None:
        if len(text) < self.MIN_CHARS:
            return None
        with self._lock:
            joined = self._d.pop(text, None)
            self.chars -= len(joined or "")
        return joined


_joined = _Joined()


def _wordy_runs(text: str) -> tuple[list[int], list[str]]:
    """The runs of `text` that are not prose's words, and where each starts."""
    starts: list[int] = []
    runs: list[str] = []
    for m in _WORDY_RUN.finditer(text):
        starts.append(m.start())
        runs.append(m.group())
    return starts, runs


def _matches(out: list[tuple[int, int, str]], text: str, pat: re.Pattern[str]) -> None:
    for m in (m for a, b in _pieces(text) for m in pat.finditer(text, a, b)):
        tok = m.group(0).rstrip(".,;:")
        if len(tok) >= 4 and not _NOT_AN_ID.match(tok):
            out.append((m.start(), m.start() + len(tok), tok))


def _placed(found: list[tuple[int, int, str]], starts: list[int], runs: list[str]) -> list[tuple[int, int, str]]:
    """Matches in the runs joined by newlines, placed where their runs start in the text."""
    if not found:
        return []
    joined_starts, at = [], 0
    for run in runs:
        joined_starts.append(at)
        at += len(run) + 1
    out = []
    for a, b, tok in found:
        k = bisect_right(joined_starts, a) - 1
        shift = starts[k] - joined_starts[k]
        out.append((a + shift, b + shift, tok))
    return out


def find_identifiers(text: str) -> list[str]:
    """Identifiers in order of first appearance, without duplicates.

    A match inside a longer one (the path part of a URL, the digits of a UUID) is left out: the
    longer identifier already carries it verbatim.
    """
    return identifiers_of(_spans(text))


def scan(text: str) -> tuple[list[str], dict[str, int]]:
    """(find_identifiers(text), token_counts(text)) from one pass of the patterns."""
    spans = _spans(text)
    return identifiers_of(spans), counts_of(spans)


def token_counts(text: str) -> dict[str, int]:
    """How often each identifier token occurs in `text` as a match (occurrences' linear rule)."""
    return counts_of(_spans(text))


def counts_of(spans: list[tuple[int, int, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _s, _e, tok in set(spans):  # (a span two patterns match is one occurrence)
        counts[tok] = counts.get(tok, 0) + 1
    return counts


def identifiers_of(spans: list[tuple[int, int, str]]) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    covered_to = -1
    for _start, end, tok in spans:
        if end <= covered_to:
            continue
        covered_to = end
        if tok not in seen:
            seen.add(tok)
            out.append(tok)
    return out


# a line that is only an exception's name (a list's bullet of identifiers) says no error
_NAME_ONLY = re.compile(r"^[-*\s]*[A-Z]\w*(?:Error|Exception)[\s,.;]*$")


def find_error_lines(text: str) -> list[str]:
    out: list[str] = []
    text = scanned(text)
    for m in (m for a, b in _pieces(text) for m in _ERROR_LINE.finditer(text, a, b)):
        line = m.group(0).strip()
        if line and line not in out and not _NAME_ONLY.match(line):
            out.append(line[:MAX_ERROR_LINE_CHARS])
        if len(out) >= MAX_ERROR_LINES:
            break
    return out


_HEX = re.compile(r"^[0-9a-f]{7,64}$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-")
_PATH_LIKE = re.compile(r"/|\.\w{1,8}$")


def _kind_weight(ident: str) -> int:
    """Kinds an agent needs exactly (tickets, hashes, URLs) above paths and exception names above
    other tokens."""
    if _URL.fullmatch(ident) or _TICKET.fullmatch(ident) or _HEX.match(ident) or _UUID.match(ident):
        return 3
    if "@" in ident or _PATH_LIKE.search(ident) or _EXCEPTION.fullmatch(ident):
        return 2
    return 0


# Characters `str.count` may scan for one list (~50 ms; a session of a thousand identifiers in 33 KB
# asks half of it): every identifier counted in the whole text is quadratic (2 MB of a compaction's
# items: 5.7 s); past it, identifiers are counted as the tokens a scan of the text finds, in one pass.
EXACT_COUNT_CHARS = 1 << 26


def occurrences(idents: list[str], text: str, cap: int,
                counts: Callable[[], dict[str, int]] | None = None) -> dict[str, int]:
    """How often each identifier occurs in `text`, at most `cap`: exactly (substrings) while that
    is cheap, else as identifier tokens of the text (linear; an identifier inside a longer word is
    not counted there). `counts`: token_counts(text) from what is known already (a span's texts
    were scanned one by one: textfacts.joined_counts), instead of a scan of the whole text."""
    if not text or not idents:
        return dict.fromkeys(idents, 0)
    if len(idents) * len(text) <= EXACT_COUNT_CHARS:
        if cap == 1 and len(idents) >= RUNS_FROM:
            return _present(idents, text)
        return {i: min(text.count(i), cap) for i in idents}
    if counts is not None:
        known = counts()
    else:
        part = scanned(text)  # (what the scan reads: a summary's span of megabytes goes to the worker process)
        known = farm.sized(len(part), token_counts, part)
    return {i: min(known.get(i, 0), cap) for i in idents}


RUNS_FROM = 8  # identifiers asked at once, from which _present searches the text's distinct runs


def _present(idents: list[str], text: str) -> dict[str, int]:
    """occurrences(idents, text, 1): 1 for each identifier in `text`, else 0. One without white
    space is in the text iff it is in one of its runs, so it is looked for in the distinct runs
    joined (prose repeats its words: a summary's user texts are a few times their runs)."""
    runs = "\n".join(dict.fromkeys(text.split()))
    return {i: int(i in (runs if i.split() == [i] else text)) for i in idents}


def absent(items: list[str], text: str) -> list[str]:
    """The items not verbatim in `text` (occurrences' rule past its budget: an error line, no
    token, then counts as absent), in order."""
    found = occurrences(items, text, 1)
    return [x for x in items if not found[x]]


def union(old: list[str], new: Iterable[str]) -> list[str]:
    """`old`, then what `new` adds to it, in order, each once (a set: the list's own membership
    test was quadratic in the identifiers of a large span)."""
    seen = set(old)
    return old + [x for x in new if x not in seen and not seen.add(x)]  # type: ignore[func-returns-value]


def rank_identifiers(idents: list[str], *, errors: Iterable[str] = (), user_text: str = "", text: str = "",
                     counts: Callable[[], dict[str, int]] | None = None) -> list[str]:
    """Most salient first (design.md § What code keeps): named by the user, in an error, of a kind agents need
    verbatim, frequent, recent (`idents` is in order of first appearance, so later is newer).
    `counts`: occurrences' token counts of `text`, when known without a scan."""
    n = max(len(idents), 1)
    # (no identifier holds a newline: one joined text asks "in any error line" of each at once)
    by_user = occurrences(idents, user_text, 1)
    in_error = occurrences(idents, "\n".join(errors), 1)
    frequency = occurrences(idents, text, 4, counts)

    def score(k: int) -> float:
        ident = idents[k]
        return (_kind_weight(ident) + 2.0 * k / n + 4 * by_user[ident] + 3 * in_error[ident]
                + frequency[ident] / 2)

    order = sorted(range(len(idents)), key=lambda k: -score(k))
    return [idents[k] for k in order]


def dropped(candidates: Iterable[str], summary: str) -> list[str]:
    """Candidates that do not appear verbatim in the model's summary."""
    # (a set for the de-duplication: a list's membership test made 68k identifiers take 35 s)
    return [c for c in dict.fromkeys(candidates) if c not in summary]
