"""What compaction replaced, kept for recall (design.md § Recall): saving, looking up and searching originals.

An original is one replaced text (a masked tool output, a tool output made into a note, a span of
summarized messages) under the handle its stub, note or summary names (`recall id ...`). It is
stored under `orig:<scope>:<handle>`: the credential scope is part of the key, so a handle guessed
or copied from another client finds nothing, and a search only reads its own scope's index.
The stored value is one JSON line (kind, label) and the text, verbatim.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import orjson

from proxy import identifiers as identifiers_, offload, textfacts
from proxy.farm import farm
from proxy.identifiers import find_identifiers, scanned
from proxy.model import Envelope
from proxy.recall import symbols
from proxy.store.base import OriginalRow, Store, index_words

MAX_IDENTIFIERS = 2000  # indexed exactly per original, at most (first seen first)
MAX_QUERY_CHARS = 1000  # of a search query, read (an identifier or some words; a longer one is cut)
MAX_QUERY_TERMS = 32  # words and identifiers of a query, each
_HANDLE = re.compile(r"^[0-9a-f]{6,64}$")
# Words that match nearly every text: a search on them finds noise, not the original asked for.
_STOPWORDS = frozenset(
    "a an and are as at be been but by can could did do does for from had has have how i in is it its of on or "
    "our so that the their then there these this those to was we were what when where which who why will with "
    "you your me my about exact exactly original text said say value line please tell".split()
)


class RecallUnavailable(Exception):
    """The store cannot be read now: the tool says so, the request goes on."""


@dataclass(frozen=True)
class Original:
    handle: str
    kind: str  # "tool output" | "messages"
    label: str  # what it was, for the model: the call that produced it, or which messages
    text: str
    # the texts `text` joins with newlines, when it was written out from messages whose
    # identifiers are known already (a span's): its index is made from theirs, not a second scan
    parts: tuple[str, ...] = field(default=(), compare=False, repr=False)


def encode(o: Original) -> bytes:
    return orjson.dumps({"kind": o.kind, "label": o.label}) + b"\n" + o.text.encode("utf-8", "surrogatepass")


def decode(handle: str, raw: bytes) -> Original | None:
    head, sep, body = raw.partition(b"\n")
    try:
        meta = orjson.loads(head)
        return Original(handle, str(meta["kind"]), str(meta["label"]), body.decode("utf-8", "surrogatepass"))
    except (orjson.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
        return None


def identifiers(text: str, parts: tuple[str, ...] = ()) -> list[str]:
    """What an original is found by exactly: its identifiers and error lines (a masked output's
    were found for its stub already, a span's messages' for its summary: `parts`, the texts `text`
    joins), and (with a cap of their own, so a long span's paths and hashes never crowd them out)
    the code symbols it defines and mentions: a span's message by message (symbols.composed), each
    text's found once (`symbols_of`, so a masked output's are a span's later). Only a text itself
    over FARM_CHARS goes to the worker process, not a span of ordinary messages joined."""
    if parts:
        found = (*textfacts.joined_identifiers(text, parts), *textfacts.joined_errors(text, parts))
        code = symbols.composed(symbols_of(t) if whole else _symbols(t) for t, whole in _read(text, parts))
    else:
        facts = textfacts.facts(text)
        found, code = facts.identifiers + facts.errors, symbols.composed([symbols_of(text)])
    return list(dict.fromkeys([*found[:MAX_IDENTIFIERS], *code]))


def span_words(text: str, parts: tuple[str, ...], head: bytes) -> list[str]:
    """store.base.index_words of a span's stored value (`head`, its first line, and `text`), from
    its messages one by one (no word crosses the newline between two): none goes to the worker
    process but a text itself over FARM_CHARS (the store would read the value whole)."""
    read = [head.decode(), *(t for t, _ in _read(text, parts))]
    return list(dict.fromkeys(w for t in read for w in farm.sized(len(t), index_words, t)))


def index(original: Original, words: bool = True) -> tuple[bytes, list[str], list[str] | None]:
    """An original's stored value, its identifiers and, for a span when `words`, its words (else
    the store reads them: a store that indexes them itself is given none)."""
    value = encode(original)
    words = words and bool(original.parts)
    words = span_words(original.text, original.parts, value[:value.index(b"\n")]) if words else None
    return value, identifiers(original.text, original.parts), words


def _read(text: str, parts: tuple[str, ...]) -> Iterator[tuple[str, bool]]:
    """What scanned(text) reads of a span, message by message: (a whole part, True), or (a piece
    of one cut by the span's head and tail, False)."""
    for lo, hi, whole in textfacts.pieces(text, parts):
        yield (whole, True) if whole is not None else (scanned(text[lo:hi]), False)


def _symbols(text: str) -> symbols.Found:
    part = scanned(text)  # (a huge text's head and tail: only that goes to the worker process)
    return farm.sized(len(part), symbols.found, part)


# One per process, as textfacts.facts: what a text defines does not depend on who asks.
symbols_of = textfacts.TextCache(_symbols, lambda text, found: found.weight(text))


def warm(envelopes: Sequence[Envelope]) -> None:
    """Find the code symbols of the texts a span to be indexed holds, ahead (a summary made ahead's
    messages, in its preparation): the request that first carries the summary, which indexes the
    span, finds them (symbols_of) instead of reading every message before it is forwarded. Only
    the texts it will read whole: a span past SCAN_CHARS is read in its head and tail (about: the
    span written out has a line before each text)."""
    texts = [t for e in envelopes for t in (e.text, *(call.args for call in e.calls))]
    if sum(map(len, texts)) > identifiers_.SCAN_CHARS:
        texts = _within(texts) + _within(texts[::-1])
    for text in texts:
        symbols_of(text)


def _within(texts: list[str]) -> list[str]:
    """The first texts that fit in half of SCAN_CHARS."""
    out, room = [], identifiers_.SCAN_CHARS // 2
    for text in texts:
        room -= len(text) + 1
        if room < 0:
            break
        out.append(text)
    return out


def valid_handle(handle: str) -> bool:
    return bool(_HANDLE.match(handle))


def query_terms(query: str) -> tuple[list[str], list[str]]:
    """(words, identifiers) of a search: the query itself and the identifiers and code symbols in
    it (`def settle_charge` names settle_charge) are looked up exactly; its words, less the ones
    that match everything, for full-text search. Bounded: the first MAX_QUERY_CHARS of a query and
    at most MAX_QUERY_TERMS of each (a model's tool call can carry pages, and every term is a
    search of every original)."""
    q = query.strip()
    head = q[:MAX_QUERY_CHARS]
    named = symbols.query_symbols(head)
    exact = [q] if q and len(q) <= MAX_QUERY_CHARS else []
    idents = list(dict.fromkeys([*exact, *find_identifiers(head), *named, *(symbols.DEFINES + n for n in named)]))
    words = list(dict.fromkeys(w for w in index_words(head) if w not in _STOPWORDS and len(w) > 1))
    return words[:MAX_QUERY_TERMS], idents[:MAX_QUERY_TERMS]


class Originals:
    def __init__(self, store: Store) -> None:
        self.store = store

    @staticmethod
    def prefix(scope: str) -> str:
        return f"orig:{scope}:"

    def _check(self) -> None:
        # ResilientStore answers a miss while the backend is down; a lookup must tell the two apart.
        if getattr(self.store, "healthy", True) is False:
            raise RecallUnavailable("the store is unavailable")

    async def save(self, scope: str, *originals: Original) -> None:
        """Store (or refresh) originals with their indexes, in one write of the store (a masking
        keeps tens at once). Never raises on a store outage."""
        if not originals:
            return
        rows = await offload.sized(sum(len(o.text) for o in originals) * offload.SCAN_WEIGHT,  # off the loop
                                   self._rows, scope, originals)
        await self.store.put_originals(rows)

    def _rows(self, scope: str, originals: Sequence[Original]) -> list[OriginalRow]:
        return [OriginalRow(self.prefix(scope) + o.handle, *index(o, not self.store.indexes_words)) for o in originals]

    async def saved(self, scope: str, handles: list[str]) -> set[str]:
        """Which of these handles are stored already (their originals need no second write)."""
        keys = [self.prefix(scope) + h for h in handles]
        found = await self.store.get_many(keys)
        return {h for h, k in zip(handles, keys) if k in found}

    async def get(self, scope: str, handle: str) -> Original | None:
        if not valid_handle(handle):
            return None
        raw = await self.store.get(self.prefix(scope) + handle)
        self._check()
        return decode(handle, raw) if raw is not None else None

    async def search(self, scope: str, query: str, limit: int = 8) -> list[Original]:
        return (await self.find(scope, query, limit)).originals

    async def find(self, scope: str, query: str, limit: int = 8) -> "Found":
        """The originals a search finds, best first. The query and the identifiers in it are looked
        up exactly first; its words only when no original carries one of them: an identifier's
        parts are words too ("seg" of seg_1a2b3c), and would find unrelated texts beside it."""
        words, idents = query_terms(query)
        if not words and not idents:
            return Found([], False)
        prefix = self.prefix(scope)
        keys = await self.store.find_originals(prefix, [], idents, limit) if idents else []
        self._check()
        exact = bool(keys)
        if not exact and words:
            keys = await self.store.find_originals(prefix, words, idents, limit)
            self._check()
        found = await self.store.get_many(keys) if keys else {}
        self._check()
        out = []
        for k in keys:
            o = decode(k[len(prefix):], found[k]) if k in found else None
            if o is not None:
                out.append(o)
        return Found(out, exact)


@dataclass(frozen=True)
class Found:
    originals: list[Original]
    exact: bool  # found by an identifier (the excerpts are cut around it, not around its words)
