"""Compactions the proxy serves to an agent's own compaction handshake (Responses' `compaction`
items, Messages' `compaction` blocks): each is a stored record, named in the client's history by a
token only this proxy can have made for that credential's scope.

    cpx1.<base64url(record id (16 bytes) + HMAC-SHA256(scope secret, scope + record id)[:16])>

The HMAC binds the token to the scope: a token made for another credential, or altered, names no
record. The record is the summary the token expands into, with the blocks code wrote, carried into
the next compaction of the same conversation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import asdict, dataclass, field

import orjson

from proxy import textfacts
from proxy.compaction import extract
from proxy.compaction.making import MAX_KNOWN_IDENTIFIERS
from proxy.compaction.record import identifier_lines, render_summary
from proxy.identifiers import union
from proxy.model import Envelope
from proxy.store.base import Store

TOKEN_PREFIX = "cpx1."
ID_BYTES, _MAC = 16, 16  # a record id's bytes, the HMAC's kept bytes


def sign(secret: bytes, scope: str, rid: bytes) -> str:
    mac = hmac.new(secret, scope.encode() + b"\0" + rid, hashlib.sha256).digest()[:_MAC]
    return TOKEN_PREFIX + base64.urlsafe_b64encode(rid + mac).rstrip(b"=").decode()


def verify(secret: bytes, scope: str, token: str) -> bytes | None:
    """The record id a token names, or None when it was not made for this scope (or is altered)."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    raw = _strict_b64(token[len(TOKEN_PREFIX):])
    if raw is None or len(raw) != ID_BYTES + _MAC:
        return None
    rid, mac = raw[:ID_BYTES], raw[ID_BYTES:]
    good = hmac.new(secret, scope.encode() + b"\0" + rid, hashlib.sha256).digest()[:_MAC]
    return rid if hmac.compare_digest(mac, good) else None


def _strict_b64(body: str) -> bytes | None:
    """The bytes of the canonical unpadded base64url text `body`, else None. Python's decoder
    drops characters outside the alphabet and ignores the last character's spare bits, so many
    texts decode alike: only the one our encoder writes is accepted (an altered token is a 400)."""
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (ValueError, TypeError):
        return None
    return raw if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == body else None


def record_key(scope: str, rid: bytes) -> str:
    return f"cpx1:{scope}:{rid.hex()}"


@dataclass
class CompactRecord:
    summary: str  # what the item expands into: the model's text and the blocks code wrote
    model: str
    created: float
    # What the code-written blocks were made of, carried into the next compaction of the same
    # conversation (a record stored before these fields existed has none).
    files: dict[str, str] = field(default_factory=dict)
    identifiers: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_bytes(cls, raw: bytes) -> "CompactRecord | None":
        try:
            return cls(**orjson.loads(raw))
        except (orjson.JSONDecodeError, TypeError):
            return None


BAD, GONE = "bad", "gone"  # record_of: a token not made for this scope (or altered); one whose record is gone


async def record_of(token: str, store: Store, secret: bytes, scope: str | None) -> CompactRecord | str:
    """The record one of our tokens names for this scope, else BAD or GONE (every protocol's
    compaction made here is stored so: Responses items, Messages blocks)."""
    rid = verify(secret, scope, token) if scope is not None else None
    if rid is None:
        return BAD
    raw = await store.get(record_key(scope, rid))  # type: ignore[arg-type]
    record = CompactRecord.from_bytes(raw) if raw is not None else None
    return GONE if record is None else record


def finish(model_text: str, span: list[Envelope], kept_text: str, previous: CompactRecord | None, *, model: str,
           created: float, files_chars: int, identifier_chars: int) -> CompactRecord:
    """The record around the model's text, with the blocks code writes, as a history summary has
    them (design.md § What code keeps): the files the span's tool calls touched, and its identifiers and error lines
    that neither the model's text nor the returned user messages (`kept_text`) carry verbatim,
    within `identifier_chars`; each carried over from the previous compaction. The user's requests
    and constraints need no block: the compacted output returns every user message as it was."""
    text, parts, found = extract.span_joined(span)
    files = extract.merge_files(previous.files if previous else {}, extract.files_touched(span))
    identifiers = union(previous.identifiers if previous else [], found)
    errors = union(previous.errors if previous else [], extract.tool_errors(span))
    present = "\n".join([model_text, kept_text, extract.render_files(files, files_chars)])
    lines, _ = identifier_lines(identifiers, errors, present=present, budget_chars=identifier_chars,
                                user_text=kept_text, text=text, counts=lambda: textfacts.joined_counts(text, parts))
    summary = render_summary(model_text, turn_prefix=None, files=files, files_chars=files_chars,
                             identifier_lines=lines, constraints=[], latest_requests=[])
    return CompactRecord(summary=summary, model=model, created=created, files=files,
                         identifiers=identifiers[-MAX_KNOWN_IDENTIFIERS:], errors=errors[-MAX_KNOWN_IDENTIFIERS:])
