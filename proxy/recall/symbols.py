"""Code symbols in text: the names an original defines and mentions, so that a model asking for
`def settle_charge_refund`, `class LedgerWorker`, `LedgerWorker.flush` or a config key finds the
file read that held it (pure functions).

Words alone do not find code: a search for `settle_charge_refund` by its words finds every file
with a `settle_charge_*` sibling, and the excerpt around the first word is seldom the definition.
So an original is indexed by its symbols exactly (defined names, methods under their class,
code-shaped names it mentions, keys), a query is read for the symbols it names, and an excerpt
prefers the place where a name is defined.
"""

from __future__ import annotations

import heapq
import re
from typing import Iterable, NamedTuple

from proxy.identifiers import unworded

MAX_SYMBOLS = 2000  # indexed per original, at most (definitions first, then mentions)
DEFINES = "def:"  # the index term of a definition (no identifier starts so: it holds no space or slash)
# `def f`, `class C`, and their kin in other languages (JS, Go, Rust, Swift, C#, Kotlin...)
_KEYWORDS = ("def", "class", "function", "fn", "func", "struct", "interface", "enum", "trait", "type", "impl",
             "object", "record")
_DEFINERS = rf"(?:async[ \t]+)?(?:{'|'.join(_KEYWORDS)})"
# what follows a defined name in code (not in prose: "the class of problems")
_AFTER = r"(?=[ \t]*[(:{<\[=]|[ \t]+(?:struct|interface|extends|implements|where)\b|[ \t]*$)"
# A definition at a place where one starts (`_at_keywords` checks what is behind it: not a word's
# character or a dot). No leading look-behind or optional `async`: with them the engine tries the
# whole alternation at every character of a text.
_DEFINITION_AT = re.compile(rf"(?:async[ \t]+(?:{'|'.join(_KEYWORDS)})|{'|'.join(_KEYWORDS)})[ \t]+([A-Za-z_]\w*){_AFTER}",
                            re.MULTILINE)
_WORDISH = re.compile(r"[\w.]")
# the same definitions as one pattern led by the look-behind: for a short text (a span's message
# line, a call's arguments, a query), where one pattern costs less than a find per keyword
_DEFINITION = re.compile(rf"(?<![\w.]){_DEFINERS}[ \t]+([A-Za-z_]\w*){_AFTER}", re.MULTILINE)
_SHORT = 160  # characters: about where the two cost the same (1.5 against 4 us at 40)
_PY_BLOCK = re.compile(r"^([ \t]*)(?:async\s+)?(def|class)\s+([A-Za-z_]\w*)", re.MULTILINE)
# keys: quoted ones before a colon (JSON, dicts), and code-shaped ones starting a YAML/INI line.
# Two patterns, not one alternation: a pattern starting with a quote is looked for at quotes only
# (one starting at `^` is tried at every character). No match of one starts inside the other's,
# nor do both match at one place, so their matches in order of start are the alternation's.
_QUOTED_KEY = re.compile(r"""["']([A-Za-z_][\w.-]{1,63})["']\s*:""")
_LINE_KEY = re.compile(r"""^[ \t]*([A-Za-z_][\w-]{1,63})\s*[:=](?![:=])""", re.MULTILINE)
# Names shaped like code: snake_case, CamelCase (an inner capital after a lower-case letter),
# dotted chains of them (Foo.bar, self.ledger.settle).
_CODE_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_SNAKE = re.compile(r"[A-Za-z0-9]_[A-Za-z0-9]")
_CAMEL = re.compile(r"[a-z0-9][A-Z]")


def code_shaped(name: str) -> bool:
    """A name no prose word looks like: snake_case, CamelCase, or dotted with such a part or a
    capital (`Foo.bar`); bare words and file names (`notes.txt`) are not."""
    if "." in name:
        parts = name.split(".")
        return len(parts) > 1 and all(parts) and (any(map(code_shaped, parts)) or parts[0][:1].isupper())
    return bool(_SNAKE.search(name) or _CAMEL.search(name))


def _plain(name: str) -> bool:
    """A name code_shaped rejects at a glance: no "_" or "." and no capital after its first letter
    (most of prose's words; the check is str methods, not two regular expressions)."""
    return "_" not in name and "." not in name and name[1:] == name[1:].lower()


def _qualified(text: str) -> list[str]:
    """Python methods as `Class.method`: a def indented under the latest class less indented."""
    out: list[str] = []
    classes: list[tuple[int, str]] = []  # (indent, name) of the enclosing classes
    for m in _PY_BLOCK.finditer(text):
        indent, kind, name = len(m.group(1).expandtabs()), m.group(2), m.group(3)
        while classes and classes[-1][0] >= indent:
            classes.pop()
        if classes:
            out.append(f"{classes[-1][1]}.{name}")
        if kind == "class":
            classes.append((indent, name))
    return out


def _definitions(text: str) -> list[str]:
    """The names _DEFINITION finds in `text`, in order."""
    if len(text) < _SHORT:
        return [m.group(1) for m in _DEFINITION.finditer(text)]
    return _at_keywords(text)


def _at_keywords(text: str) -> list[str]:
    """The names of _DEFINITION_AT's matches not after a word's character or a dot, in order, not
    overlapping (what _DEFINITION finds), tried only where a keyword occurs (str.find, in C): half
    _DEFINITION's time over the walk's texts, which it cannot skip through to its keywords."""
    starts: set[int] = set()
    for kw in ("async", *_KEYWORDS):
        at = text.find(kw)
        while at >= 0:
            starts.add(at)
            at = text.find(kw, at + 1)
    out, end = [], 0
    for at in sorted(starts):
        if at < end or (at and _WORDISH.match(text, at - 1)):
            continue
        m = _DEFINITION_AT.match(text, at)
        if m is not None:
            out.append(m.group(1))
            end = m.end()
    return out


def defined(text: str) -> list[str]:
    """The names `text` defines (methods also as `Class.method`), without duplicates."""
    return list(dict.fromkeys(_definitions(text) + _qualified(text)))


def mentioned(text: str, limit: int) -> list[str]:
    """Keys, then code-shaped names, in `text`: at most `limit`."""
    found: dict[str, None] = {}
    for m in heapq.merge(_QUOTED_KEY.finditer(text), _LINE_KEY.finditer(text), key=lambda m: m.start()):
        if len(found) >= limit:  # (a large JSON output has keys without end: read no further)
            break
        if m.re is _QUOTED_KEY or code_shaped(m.group(1)):
            found.setdefault(m.group(1), None)
    # each distinct name once, in order of first appearance: a name seen again adds nothing (a
    # long span's hundred thousand words are a few thousand names). Read in the text's runs that
    # are not prose's words: a code-shaped name holds no white space, a prose word's one name is
    # plain, and a run's edge is white space to the name's pattern as a newline is.
    for name in dict.fromkeys(_CODE_NAME.findall(unworded(text))):
        if len(found) >= limit:
            break
        if _plain(name):
            continue
        if code_shaped(name):
            found.setdefault(name, None)
            last = name.rsplit(".", 1)[-1]
            if last != name and code_shaped(last):  # `self.settle_charge` mentions `settle_charge`
                found.setdefault(last, None)
    return list(found)[:limit]


class Found(NamedTuple):
    """What one text defines and mentions, as far as an index of it or of a span holding it reads."""

    defined: tuple[str, ...]  # defined(text), at most MAX_SYMBOLS // 2
    mentioned: tuple[str, ...]  # mentioned(text, MAX_SYMBOLS)

    def weight(self, text: str) -> int:
        return len(text) + TERM_CHARS * (len(self.defined) + len(self.mentioned))


TERM_CHARS = 64  # what a found name is charged against a cache's characters (a short str and its slot)


def found(text: str) -> Found:
    return Found(tuple(defined(text)[:MAX_SYMBOLS // 2]), tuple(mentioned(text, MAX_SYMBOLS)))


def composed(texts: Iterable[Found]) -> list[str]:
    """The index terms of texts read one by one, at most MAX_SYMBOLS: `def:<name>` for each name
    they define (in order, at most MAX_SYMBOLS // 2 names), then those names, then what they
    mention, each text's in its order. A summarized span is indexed so, message by message
    (docs/design.md § Recall): a definition or key does not run from one message into the next,
    and a method is qualified by a class of its own message only, as when each was indexed alone.
    (Each text's lists are long enough: a text whose own list was cut at its cap brings that many
    distinct terms, which fill the index.)"""
    texts = list(texts)
    names = list(dict.fromkeys(n for t in texts for n in t.defined))[:MAX_SYMBOLS // 2]
    terms = dict.fromkeys([DEFINES + n for n in names] + names)
    for t in texts:
        if len(terms) >= MAX_SYMBOLS:
            break
        terms.update(dict.fromkeys(t.mentioned))
    return list(terms)[:MAX_SYMBOLS]


def index_terms(text: str) -> list[str]:
    """What an original is indexed by for its code, at most MAX_SYMBOLS: `def:<name>` for each
    name it defines (a query for a name ranks the definition above the mentions), then every
    symbol it defines or mentions."""
    return composed([found(text)])


def query_symbols(query: str) -> list[str]:
    """The symbols a query names: what it defines (`def f`, `class C`), and its code-shaped
    names, with any quotes around them (`"flush_backoff_ms"`) dropped."""
    found: dict[str, None] = dict.fromkeys(_definitions(query))
    for m in _CODE_NAME.finditer(query.replace('"', " ").replace("'", " ").replace("`", " ")):
        name = m.group(0).rstrip(".")
        if code_shaped(name) or (name in found):
            found.setdefault(name, None)
    return list(found)


def definitions(text: str, name: str) -> list[int]:
    """Where `text` defines `name`: the start of each `def name`, `class name`... line, or for
    `Class.method`, of the method's def inside that class's block."""
    if not _NAME.fullmatch(name):
        return []
    cls, _, meth = name.rpartition(".")
    if not cls:
        pat = re.compile(rf"(?<![\w.]){_DEFINERS}[ \t]+{re.escape(name)}{_AFTER}", re.MULTILINE)
        return [m.start() for m in pat.finditer(text)]
    out: list[int] = []
    for m in re.finditer(rf"^([ \t]*)class\s+{re.escape(cls.rsplit('.', 1)[-1])}\b", text, re.MULTILINE):
        indent = len(m.group(1).expandtabs())
        for d in _PY_BLOCK.finditer(text, m.end()):
            if len(d.group(1).expandtabs()) <= indent:
                break  # the class's block ended
            if d.group(3) == meth:
                out.append(d.start() + len(d.group(1)))
                break
    return out
