"""The stored summary record and the rendering of its text (pure).

A record covers the first `covered` non-system messages of a conversation, identified by the hash
chain over them. `summary` is the final text (model part + the parts code writes), stored once so
the forwarded bytes never change while the record is in use.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from typing import Callable

import orjson

from proxy.compaction.extract import rank_identifiers, render_files
from proxy.identifiers import absent

# A line that names an error: an exception (type and message), a compiler's diagnostic ("error:",
# "error[E0382]:", "fatal error:"), a log's ERROR / FATAL / PANIC line. Lines that only say
# "failed" (a test run's tally) are not one.
_DIAGNOSTIC = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b|\b(?:ERROR|FATAL|PANIC)\b|\b(?:error|fatal|panic)(?:\[\w+\])?:")


@dataclass(frozen=True)
class SummaryRecord:
    covered: int  # non-system messages summarized (0: nothing summarized, only masked)
    chain: str  # hex hash chain over the first `extent` non-system messages: the record's key
    summary: str
    files: dict[str, str] = field(default_factory=dict)
    identifiers: list[str] = field(default_factory=list)  # every one known from the covered span
    # kept tool outputs too big for the target: original message digest (hex) -> max tokens. Part
    # of the record so that every request carrying it forwards the same bytes.
    clamped: dict[str, int] = field(default_factory=dict)
    created: float = 0.0
    prepared: bool = False  # made ahead of time and not yet carried by a request
    tier: str = "summary"  # summary | mask (no summary made) | digest (written by code: the floor)
    # old tool outputs replaced by stubs: original message digest (hex) -> stub text (tier 1)
    masks: dict[str, str] = field(default_factory=dict)
    masked_until: int = 0  # non-system messages the masking looked at (the key's extent with `covered`)
    errors: list[str] = field(default_factory=list)  # error lines from the covered span
    constraints: list[str] = field(default_factory=list)  # the user's stated constraints, verbatim
    # identifiers of the covered span that did not fit the summary's identifier block: not lost,
    # listed here for recall (a later issue makes them retrievable)
    recall_identifiers: list[str] = field(default_factory=list)
    expires: float | None = None  # a digest is short-lived: the summarizer is tried again after it
    # the summarized spans, each [handle, first, last] (message numbers from 1): the summary's
    # `## Recall` block names them, and the originals are kept under those handles (design.md § Recall)
    recall_spans: list[list] = field(default_factory=list)
    # non-system messages of the first request forwarded with this record: the assistant turns
    # before that were made under another prefix, those from there on under this record's (models
    # that bind their reasoning to its prefix reject the former; None: a record from before this
    # was kept, nothing left out)
    live_from: int | None = None
    calls: int = 0  # summarizer calls that made it (its event reports them, made ahead or not)

    @property
    def extent(self) -> int:
        return max(self.covered, self.masked_until)

    def to_bytes(self) -> bytes:
        # orjson writes a dataclass's fields in order as asdict's dict; asdict deep-copied every
        # string of a long session's record first (~5-15 ms a record saved with its summary)
        return orjson.dumps(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> "SummaryRecord | None":
        try:
            data = orjson.loads(raw)
            # fields a newer version added are left out: a record it wrote is still read (replicas
            # of two versions share one store during an upgrade)
            return cls(**{k: v for k, v in data.items() if k in _FIELDS})
        except (orjson.JSONDecodeError, TypeError, AttributeError):
            return None

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


_FIELDS = frozenset(f.name for f in fields(SummaryRecord))
# Per string held (object header, pointer), roughly, for sizing records in memory.
_STR_OVERHEAD = 56
_RECORD_OVERHEAD = 1024  # the dataclass, its dicts and lists


def record_bytes(rec: SummaryRecord) -> int:
    """About how much memory a record holds: its texts and lists (a long session's records carry
    thousands of identifiers and every stub text)."""
    strings = [rec.summary, rec.chain, *rec.identifiers, *rec.errors, *rec.constraints, *rec.recall_identifiers,
               *rec.files, *rec.masks, *rec.masks.values(), *rec.clamped]
    return _RECORD_OVERHEAD + sum(len(x) + _STR_OVERHEAD for x in strings)


class RecordCache:
    """The records this process made or read, by store key, least recently used evicted first;
    bounded by count and by their size (`record_bytes`), so a busy process's memory levels off
    however large its conversations' records grow."""

    def __init__(self, max_records: int = 4096, max_bytes: int = 32 << 20) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.bytes = 0
        self.puts = 0  # records put so far: a lookup that missed a key misses it again until this moves
        self._d: OrderedDict[str, tuple[SummaryRecord, int]] = OrderedDict()

    def get(self, key: str) -> SummaryRecord | None:
        """The record (now the most recently used), or None."""
        hit = self._d.get(key)
        if hit is None:
            return None
        self._d.move_to_end(key)
        return hit[0]

    def put(self, key: str, rec: SummaryRecord) -> None:
        self.discard(key)
        self.puts += 1
        size = record_bytes(rec)
        self._d[key] = (rec, size)
        self.bytes += size
        while self._d and (len(self._d) > self.max_records or self.bytes > self.max_bytes):
            _, (_, old) = self._d.popitem(last=False)
            self.bytes -= old

    def discard(self, key: str) -> None:
        hit = self._d.pop(key, None)
        if hit is not None:
            self.bytes -= hit[1]

    def __getitem__(self, key: str) -> SummaryRecord:
        return self._d[key][0]

    def __delitem__(self, key: str) -> None:
        self.discard(key)

    def __contains__(self, key: object) -> bool:
        return key in self._d

    def __len__(self) -> int:
        return len(self._d)

    def values(self) -> list[SummaryRecord]:
        return [rec for rec, _ in self._d.values()]


def render_summary(
    model_text: str,
    *,
    turn_prefix: str | None,
    files: dict[str, str],
    files_chars: int,
    identifier_lines: list[str],
    constraints: list[str],
    latest_requests: list[str],
    recall: str = "",
) -> str:
    """Model summary + split-turn context + the blocks code writes (design.md § The summary's shape; § What code keeps).

    The files block is capped at `files_chars`; the identifier lines come already fitted to their
    own budget; the user's constraints and requests are never cut.
    """
    parts = [model_text.strip()] if model_text.strip() else []
    if turn_prefix:
        parts.append(
            "## Current Turn So Far\n"
            "(The request below started the turn that the kept messages continue.)\n\n" + turn_prefix.strip()
        )
    if files:
        parts.append("## Files Touched\n" + render_files(files, files_chars))
    if identifier_lines:
        parts.append("\n".join(["## Identifiers (verbatim from the summarized messages)", *identifier_lines]))
    if constraints:
        parts.append("\n".join(["## User Constraints (verbatim)", *(f"- {c}" for c in constraints)]))
    if latest_requests:
        block = ["## Latest User Request (verbatim)", latest_requests[0]]
        if len(latest_requests) > 1:
            block += ["", "Last substantive request before it (verbatim):", latest_requests[1]]
        parts.append("\n".join(block))
    if recall:
        parts.append(recall)
    return "\n\n".join(parts)


def identifier_lines(
    candidates: list[str], errors: list[str], *, present: str, budget_chars: int, user_text: str, text: str,
    counts: Callable[[], dict[str, int]] | None = None,
) -> tuple[list[str], list[str]]:
    """(lines for the identifier block, identifiers left for recall): what is not already verbatim
    in `present` (the model's summary, the kept messages, the files block), most salient first,
    within the budget. Error lines one a line; the other identifiers on one comma-separated line,
    the densest form a model still reads (no identifier holds a space). `counts`: rank_identifiers'."""
    errors, ranked = ranked_for_block(candidates, errors, present=present, user_text=user_text, text=text,
                                      counts=counts)
    return fit_lines(errors, ranked, budget_chars)


def ranked_for_block(candidates: list[str], errors: list[str], *, present: str, user_text: str,
                     text: str, counts: Callable[[], dict[str, int]] | None = None) -> tuple[list[str], list[str]]:
    """(error lines, identifiers most salient first) not already verbatim in `present`: what
    `fit_lines` fits, however often it is asked with another budget. `counts`: rank_identifiers'."""
    errors = absent(errors, present)
    idents = absent(candidates, present)
    return errors, rank_identifiers(idents, errors=errors, user_text=user_text, text=text, counts=counts)


def fit_lines(errors: list[str], ranked: list[str], budget_chars: int) -> tuple[list[str], list[str]]:
    """identifier_lines' lines within `budget_chars`, from ranked_for_block's lists."""
    # Lines that name an error are the most needed and the least recoverable; other lines that
    # say "failed" (a test run's tally) come after the identifiers, if room is left.
    exceptions = [e for e in errors if _DIAGNOSTIC.search(e)]
    others = [e for e in errors if not _DIAGNOSTIC.search(e)]
    lines: list[str] = []
    used = 0
    for e in exceptions:
        line = f"- error: {e}"
        if used + len(line) + 1 > budget_chars:
            break
        lines.append(line)
        used += len(line) + 1
    in_errors = "\n".join(lines)
    used += 2  # the "- " of the identifier line
    shown = set()
    fitted: list[str] = []
    for ident in ranked:
        if ident in in_errors:
            shown.add(ident)
            continue
        if used + len(ident) + 2 > budget_chars:
            continue  # a shorter one may still fit
        fitted.append(ident)
        used += len(ident) + 2
        shown.add(ident)
    if fitted:
        lines.append("- " + ", ".join(fitted))
    for e in others:
        line = f"- error: {e}"
        if used + len(line) + 1 <= budget_chars:
            lines.append(line)
            used += len(line) + 1
    rest = [i for i in ranked if i not in shown] + [e for e in errors if f"- error: {e}" not in lines]
    return lines, rest
